"""Proofs that can tell: outputs judged at their own scale, and references that cannot tell said, not proven."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxport.api import load_model
from onnxport.core.records import FP32
from onnxport.core.samples import Case
from onnxport.exporters.chain import export
from onnxport.prove.compare import compare_arrays, own_tolerance
from onnxport.prove.parity import compare
from onnxport.prove.telling import cannot_tell, summary, telling_cases
from tests.conftest import FIXTURES, load_report
from tests.fixtures import forked_cli

TELLING = FIXTURES / "telling.py"
cli = forked_cli.cli  # a fixture: commands forked from one process that did the CLI's imports once


def test_an_output_far_below_atol_is_judged_at_its_own_scale():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((4, 10)) * 1.4e-5).astype(np.float32)
    own = own_tolerance(logits, FP32)
    assert own.atol == pytest.approx(FP32.atol * np.abs(logits).max()) and own.rtol == FP32.rtol
    assert not compare_arrays(logits, logits + 3e-5, own)[2]  # off by more than the logits themselves
    assert compare_arrays(logits, logits + 3e-5, FP32)[2]  # ...which the plain atol let through
    assert compare_arrays(logits, logits * (1 + 1e-6), own)[2]  # fp32 rounding still passes
    big = rng.standard_normal((4, 10)).astype(np.float32) * 5
    assert own_tolerance(big, FP32) == FP32 and own_tolerance(np.zeros(3, np.float32), FP32) == FP32


def _shifted(src, dst, by: float) -> None:
    """The ONNX file ``src`` with ``by`` added to its first output: a wrong file."""
    model = onnx.load(str(src))
    out = model.graph.output[0]
    model.graph.node.append(helper.make_node("Add", [out.name, "shift_by"], ["shifted"]))
    model.graph.initializer.append(numpy_helper.from_array(np.array(by, np.float32), "shift_by"))
    renamed = helper.make_tensor_value_info("shifted", out.type.tensor_type.elem_type, None)
    renamed.type.CopyFrom(out.type)
    model.graph.output.remove(out)
    model.graph.output.insert(0, renamed)
    onnx.save(model, str(dst))


def test_a_file_off_by_more_than_tiny_logits_fails(tmp_path):
    loaded = load_model(f"{TELLING}:TinyLogits", inputs=["x:float32[batch,8]"])
    export(loaded, tmp_path / "model.onnx", exporter="torchscript")
    right = compare(loaded, tmp_path / "model.onnx")
    assert right.passed and not right.cannot_tell
    atol = right.cases[0].outputs[loaded.output_names[0]]["atol"]
    assert atol < 1e-8  # judged at ~1e-5 magnitude, not at 1e-4
    _shifted(tmp_path / "model.onnx", tmp_path / "wrong.onnx", 3e-5)
    assert not compare(loaded, tmp_path / "wrong.onnx").passed


def test_a_constant_reference_is_not_proven(tmp_path, cli):
    """Every logit is 0 whatever the input: any file returning zeros would pass, so nothing is proven."""
    out = tmp_path / "zero"
    r = cli("export", f"{TELLING}:ZeroHead", "-i", "x:float32[batch,8]", "-o", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = load_report(out)
    assert rep["status"] == "validation_failed" and not (out / "model.onnx").exists()
    assert (out / "model.unverified.onnx").exists()
    codes = {d["code"]: d for d in rep["diagnostics"]}
    assert "cannot-tell" in codes and "cannot tell a right file from a wrong one" in codes["cannot-tell"]["message"]
    assert "--samples" in codes["cannot-tell"]["hint"]
    assert list(rep["validation"]["cannot_tell"].values()) == ["0 in every element of every case"]
    assert "cannot tell" in r.stdout + r.stderr
    assert [a["exporter"] for a in rep["export"]["attempts"] if a.get("ok", True)][:1] == ["dynamo"]
    assert "export-retried" not in codes  # references that cannot tell: another exporter would change nothing


def test_a_mix_is_judged_on_the_outputs_that_tell(tmp_path):
    loaded = load_model(f"{TELLING}:WithConstant", inputs=["x:float32[batch,8]"])
    export(loaded, tmp_path / "model.onnx", exporter="torchscript")
    got = compare(loaded, tmp_path / "model.onnx")
    assert got.passed and set(got.cannot_tell) == {loaded.output_names[1]}
    assert "does not depend on the input" in got.cannot_tell[loaded.output_names[1]]
    assert [d.code for d in got.diagnostics if d.code == "outputs-cannot-tell"] == ["outputs-cannot-tell"]
    assert all(d.proven for d in got.dynamic_dims)


def test_empty_or_tied_detections_cannot_tell():
    cases = [Case("export", {"h": 160}), Case("min", {"h": 32}, seed=2), Case("odd", {"h": 99}, seed=3)]
    empty = {"boxes": np.zeros((0, 4), np.float32), "scores": np.zeros((0,), np.float32),
             "labels": np.zeros((0,), np.int64)}
    seen = [{n: summary(n, a, "detections") for n, a in empty.items()} for _ in cases]
    silent = cannot_tell(cases, seen)
    assert set(silent) == {"boxes", "scores", "labels"} and "no detection in every case" in silent["boxes"]
    assert telling_cases(seen, silent) == [False, False, False]
    tied = {"boxes": np.arange(12, dtype=np.float32).reshape(3, 4), "scores": np.full(3, 0.011, np.float32)}
    s = summary("scores", tied["scores"], "detections")
    assert s.silent and "tied" in s.silent
    found = {"boxes": np.ones((2, 4), np.float32), "scores": np.array([0.9, 0.2], np.float32)}
    mixed = [seen[0], {n: summary(n, a, "detections") for n, a in found.items()}, seen[2]]
    assert not {"boxes", "scores"} & set(cannot_tell(cases, mixed))  # one case with detections can tell
    assert telling_cases(mixed, cannot_tell(cases, mixed)) == [False, True, False]  # only that case proves dims


def test_every_size_of_a_short_range_is_proven(tmp_path, cli):
    """batch 1..16: every size has a case, so a file wrong at batch 7 alone fails; the report lists the sizes."""
    out = tmp_path / "seven"
    r = cli("export", f"{TELLING}:WrongAtSeven", "-i", "x:float32[batch,8]", "-d", "batch=1..16",
                "--exporter", "torchscript", "-o", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = load_report(out)
    failed = [c for c in rep["validation"]["cases"] if not c["passed"]]
    assert [c["sizes"] for c in failed] == [{"batch": 7}]
    ok = cli("export", f"{FIXTURES / 'models.py'}:TinyMLP", "-i", "x:float32[batch,8]", "-d", "batch=1..16",
                 "--exporter", "torchscript", "-o", str(tmp_path / "ok"))
    assert ok.returncode == 0
    dims = load_report(tmp_path / "ok")["check"]["dynamic_dims"]
    assert [d["sizes_passed"] for d in dims] == [list(range(1, 17))]


def test_samples_that_are_all_the_same_cannot_tell(tmp_path, cli):
    """--samples whose every sample is the same input: PyTorch's outputs are the same for each, so the proof on
    them proves nothing (samples-cannot-tell, exit 1); samples that differ prove as before."""
    same = tmp_path / "same.npz"
    np.savez(same, x=np.tile(np.linspace(-1, 1, 8, dtype=np.float32), (6, 1)))
    r = cli("export", f"{FIXTURES / 'models.py'}:TinyMLP", "-i", "x:float32[batch,8]", "--samples", str(same),
                "--exporter", "torchscript", "-o", str(tmp_path / "same"))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = load_report(tmp_path / "same")
    assert "samples-cannot-tell" in {d["code"] for d in rep["diagnostics"]}
    assert rep["validation"]["samples"]["cannot_tell"] == {"output": "the same for every sample"}
    differ = tmp_path / "differ.npz"
    np.savez(differ, x=np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    ok = cli("export", f"{FIXTURES / 'models.py'}:TinyMLP", "-i", "x:float32[batch,8]", "--samples", str(differ),
                 "--exporter", "torchscript", "-o", str(tmp_path / "differ"))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_tied_scores_silence_the_whole_detection_group():
    """ssdlite with random weights: 300 boxes, every score 0.011: which boxes are kept is undefined."""
    cases = [Case("export", {"h": 320}), Case("min", {"h": 160}, seed=2)]
    rng = np.random.default_rng(0)
    seen = [{"boxes": summary("boxes", rng.random((300, 4)).astype(np.float32), "detections"),
             "scores": summary("scores", np.full(300, 0.011, np.float32), "detections"),
             "labels": summary("labels", rng.integers(1, 90, 300), "detections")} for _ in cases]
    silent = cannot_tell(cases, seen)
    assert set(silent) == {"boxes", "scores", "labels"} and telling_cases(seen, silent) == [False, False]
