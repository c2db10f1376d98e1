"""The one variant registry: names per model kind, builders and judges registered, the shared machinery (build into a
temporary name, Skip and crashes caught, the budget, the 5% rule)."""

from __future__ import annotations

import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnxport.core.errors import UsageError
from onnxport.decoder.kind import DECODER, DECODER_VARIANTS
from onnxport.optimize import gates, passes, registry
from onnxport.optimize.context import BuildOutcome, Skip
from onnxport.optimize.result import SkipReason, Variant


def test_names_are_parsed_per_kind():
    assert registry.parse_names(None) == list(registry.VARIANTS)
    assert registry.parse_names("int8,int4", DECODER) == ["int8", "int4"]
    assert registry.parse_names("all", DECODER) == ["fused", "int8", "int4"]  # the GPU ones join on CUDA only
    assert registry.parse_names("gqa,fp16", DECODER) == ["gqa", "fp16"]
    with pytest.raises(UsageError, match="unknown decoder variant 'fp8'"):
        registry.parse_names(["fp8"], DECODER)
    with pytest.raises(UsageError, match="unknown variant 'int4'"):
        registry.parse_names("int4")


def test_both_kinds_have_their_builders_and_judge():
    import onnxport.decoder  # noqa: F401 - registers the decoder kind

    for kind in (registry.MODEL, DECODER):
        k = registry.kind(kind)
        assert set(k.builders) == set(k.names) and k.judge is not None
    with pytest.raises(ValueError, match="not a declared"):
        registry.register(DECODER, "fp8", lambda src, dst, ctx: BuildOutcome())


def test_a_family_declares_its_own_kind():
    assert registry.kind(DECODER).names == DECODER_VARIANTS and registry.kind(DECODER).label == "decoder "
    assert registry.declare(DECODER, DECODER_VARIANTS) == DECODER  # again, the same names: nothing changes
    with pytest.raises(ValueError, match="declared with"):
        registry.declare(DECODER, ("fused",))


def test_one_set_of_gates():
    from onnxport.decoder import records

    assert records.DECODER_GATES is gates.GATES
    assert (gates.GATES.cosine_min, gates.GATES.top1_min) == (gates.COSINE_MIN, gates.TOP1_MIN)


def test_build_into_moves_the_file_and_catches_skip_and_crashes(tmp_path):
    src, dst = tmp_path / "src.onnx", tmp_path / "variants" / "v.onnx"
    dst.parent.mkdir()
    src.write_bytes(b"x")

    def writes(s: Path, d: Path, ctx) -> BuildOutcome:
        assert d != dst and d.parent == dst.parent
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        onnx.save(helper.make_model(graph), str(d))
        return BuildOutcome({"ok": True})

    made = passes.build_into(writes, src, dst, None)
    assert made.outcome is not None and made.file == dst and onnx.load(str(dst)).graph.node[0].op_type == "Identity"
    assert [p.name for p in dst.parent.iterdir()] == ["v.onnx"]

    def skips(s, d, ctx):
        raise Skip("nothing to do", ["tried a"], SkipReason.NOT_BUILT)

    skipped = passes.build_into(skips, src, dst, None)
    assert skipped.outcome is None and skipped.skip.notes == ("tried a",) and not dst.exists()
    assert skipped.skip.reason is SkipReason.NOT_BUILT

    def crashes(s, d, ctx):
        d.write_bytes(b"half")
        raise RuntimeError("boom")

    crashed = passes.build_into(crashes, src, dst, None)
    assert crashed.error == "RuntimeError: boom" and not any(dst.parent.iterdir())


def test_each_variant_records_the_plan_and_the_budget():
    ran: list[str] = []

    def run(name, say):
        ran.append(name)
        say(f"variant {name}")
        time.sleep(0.02)
        return Variant(name, None, True)

    def skip(name, why, reason):
        return Variant.skip(name, why, reason)

    said: list[str] = []
    out = passes.each_variant(["a", "b", "c"], run, skip, said.append, passes.Budget(time.perf_counter(), 0.01),
                              {"b": ("not built by default: test", SkipReason.NOT_PLANNED)})
    assert ran == ["a"] and said == ["[1/2] variant a"]
    assert [(v.name, v.skip_reason) for v in out] == [("a", None), ("b", SkipReason.NOT_PLANNED),
                                                     ("c", SkipReason.BUDGET)]
    assert out[2].to_dict()["skip_reason"] == "budget" and "--budget" in out[2].skipped


def test_the_export_is_kept_unless_clearly_beaten():
    assert not passes.clearly_faster(None) and not passes.clearly_faster(1.04)
    assert passes.clearly_faster(passes.MIN_GAIN)


def test_one_reading_of_the_names_for_every_kind():
    """``chosen``: the names besides the export in the kind's order; None none, "all"/"auto" the defaults."""
    from onnxport.optimize.registry import chosen
    from onnxport.seq2seq.kind import SEQ2SEQ

    assert chosen(None, SEQ2SEQ) == () and chosen("auto", SEQ2SEQ) == chosen("all", SEQ2SEQ) == ("fused", "int8")
    assert chosen(["int8", "export", "fused"], SEQ2SEQ) == ("fused", "int8")  # the kind's order, the baseline left out
    assert chosen("int4,fused", DECODER) == ("fused", "int4")
    with pytest.raises(UsageError, match=r"unknown encoder-decoder variant 'int4' \(--variants int4\)"):
        chosen(["int4"], SEQ2SEQ)


def test_auto_among_other_spellings_is_still_auto():
    from onnxport.optimize.registry import chosen
    from onnxport.seq2seq.kind import SEQ2SEQ

    for names in ("export,auto", " auto", "auto,", ["export", "auto"]):
        assert chosen(names, SEQ2SEQ) == ("fused", "int8"), names
