"""A variant is a pass (requires → call → ensures → result) and every kind's best is chosen one way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from onnxport.core.errors import DiskFull
from onnxport.optimize.context import BuildOutcome, Skip
from onnxport.optimize.passes import MIN_GAIN, Unmade, VariantPass, build_into, choose_best, fastest
from onnxport.optimize.result import SkipReason


@dataclass(frozen=True)
class Entry:
    name: str
    passed: bool
    speed: float | None = None
    size: int = 0


def _speed(e: Entry) -> float | None:
    return e.speed


def test_the_export_is_kept_unless_another_is_clearly_faster():
    export = Entry("export", True, 1.0)
    close = Entry("int8", True, MIN_GAIN - 0.01)
    assert choose_best([export, close], _speed) is export
    clear = Entry("int8", True, MIN_GAIN + 0.01)
    assert choose_best([export, clear], _speed) is clear
    failed_fast = Entry("fp16", False, 9.0)
    assert choose_best([export, close, failed_fast], _speed) is export  # a failing variant is never chosen


def test_without_a_passing_export_only_a_clearly_faster_one_and_none_when_nothing_passed():
    broken = Entry("export", False, 1.0)
    slow, quick = Entry("slim", True, 1.01), Entry("ort", True, 1.5)
    assert choose_best([broken, slow, quick], _speed) is quick
    assert choose_best([broken, slow], _speed) is None  # not clearly faster than what was timed as the export
    assert choose_best([broken, Entry("int8", False, 3.0)], _speed) is None
    assert choose_best([], _speed) is None


def test_ties_go_to_the_smaller_file_and_an_untimed_entry_is_not_ranked():
    big, small = Entry("fp16", True, 2.0, size=10), Entry("int8", True, 2.0, size=5)
    assert fastest([big, small, Entry("slim", True, None)], _speed, lambda e: e.size) is small


def test_select_best_ranks_report_dicts_by_the_same_ranking():
    """select_best (report.json dicts or Variants) ranks with fastest, the ranking choose_best uses."""
    from onnxport.optimize.choice import select_best

    rows = [{"name": "export", "passed": True, "bytes": 9, "latency_ms": {"1": 10.0}},
            {"name": "fp16", "passed": False, "bytes": 1, "latency_ms": {"1": 1.0}},
            {"name": "slim", "passed": True, "bytes": 8, "latency_ms": {"1": 8.0}},
            {"name": "ort", "passed": True, "bytes": 7, "latency_ms": {"1": 8.0}}]
    assert select_best(rows)["name"] == "ort"  # 1.25x, tied with slim: the smaller file; the failing fp16 never
    ranked = fastest(rows, lambda r: 10.0 / r["latency_ms"]["1"], lambda r: r["bytes"], lambda r: r["passed"])
    assert ranked is select_best(rows)


def _copy(src: Path, dst: Path, ctx: object) -> BuildOutcome:
    dst.write_bytes(src.read_bytes() + b"!")
    return BuildOutcome(notes=("copied",))


def _pass(tmp_path: Path, build, judge=None) -> VariantPass:
    src = tmp_path / "model.onnx"
    return VariantPass("v", src, build, judge or (lambda made: ("judged", made.file.name, made.outcome.notes)),
                       lambda why: ("unmade", why.stage, why.why, why.reason))


def test_a_pass_builds_then_judges_the_file_it_wrote(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    dst = tmp_path / "variants" / "v.onnx"
    dst.parent.mkdir()
    p = _pass(tmp_path, lambda: build_into(_copy, tmp_path / "model.onnx", dst, None))
    assert p.requires() is None
    assert p() == ("judged", "v.onnx", ("copied",)) and dst.read_bytes() == b"x!"


def test_the_baseline_is_the_export_itself(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    p = VariantPass("export", tmp_path / "model.onnx", None, lambda made: (made.file.name, made.outcome.notes),
                    lambda why: why, baseline_notes=("the proven export itself",))
    assert p() == ("model.onnx", ("the proven export itself",))


def test_each_stage_a_pass_stops_at_is_recorded(tmp_path):
    assert _pass(tmp_path, None)()[:2] == ("unmade", "requires")  # no proven file to start from
    (tmp_path / "model.onnx").write_bytes(b"x")
    dst = tmp_path / "v.onnx"

    def skips(src, dst, ctx):
        raise Skip("nothing to fuse", reason=SkipReason.NOT_APPLICABLE)

    def crashes(src, dst, ctx):
        raise RuntimeError("boom")

    def cannot_run(made):
        raise ValueError("no kernel")

    src = tmp_path / "model.onnx"
    assert _pass(tmp_path, lambda: build_into(skips, src, dst, None))() == (
        "unmade", "call", "nothing to fuse", SkipReason.NOT_APPLICABLE)
    assert _pass(tmp_path, lambda: build_into(crashes, src, dst, None))() == (
        "unmade", "call", "RuntimeError: boom", None)
    assert _pass(tmp_path, lambda: build_into(_copy, src, dst, None), cannot_run)() == (
        "unmade", "ensures", "ValueError: no kernel", None)


def test_a_full_disk_stops_the_run(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")

    def full(made):
        raise OSError(28, "No space left on device")

    with pytest.raises(DiskFull):
        _pass(tmp_path, None, full)()


def test_unmade_is_a_plain_record():
    why = Unmade("int8", "call", "no MatMul", SkipReason.NOT_APPLICABLE)
    assert why.path is None and why.notes == () and why.seconds == 0.0


def test_a_judge_that_cannot_open_the_file_fails_the_variant_unless_the_kind_raises_it(tmp_path):
    """A decoder's session raises UsageError for a file onnxruntime cannot load: that variant fails, the others
    go on; the plain kind's judge records such files itself, so its typed errors stop the run."""
    from onnxport.core.errors import OnnxportError, UsageError

    (tmp_path / "model.onnx").write_bytes(b"x")

    def unloadable(made):
        raise UsageError("onnxruntime cannot load the model: no kernel for MatMulNBits")

    assert _pass(tmp_path, None, unloadable)()[:2] == ("unmade", "ensures")
    strict = VariantPass("v", tmp_path / "model.onnx", None, unloadable, lambda why: why, raised=(OnnxportError,))
    with pytest.raises(UsageError):
        strict()
