"""Optimized variants of a proven decoder: fused (still within fp32 tolerance), int8 / int4 weight-only
(MatMulNBits, judged by logit cosine and teacher-forced top-1), the best a passing one, failures recorded."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxport import decoder
from onnxport.core.errors import UsageError
from onnxport.decoder import outcome as decoder_outcome
from onnxport.decoder import variants
from onnxport.runtime.sessions import session
from tests.decoder.test_decoder import _tiny

MAX_LENGTH = 24
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    model = _tiny("llama")
    out = tmp_path_factory.mktemp("llama-variants")
    return model, decoder.run_model(model, out, max_length=MAX_LENGTH, new_tokens=NEW_TOKENS,
                                    variants=decoder.CacheVariants(True))


def _matmuls(path) -> int:
    return variants.op_counts(path).get("MatMul", 0)


def _check_quantized(made: decoder.DecoderVariants, export_matmuls: int) -> None:
    for name, bits in (("int8", 8), ("int4", 4)):
        v = made.get(name)
        assert v.path is not None and v.path.is_file() and v.path.parent.name == "variants", v.to_dict()
        counts = dict(v.fused_ops)
        assert counts["com.microsoft:MatMulNBits"] == export_matmuls  # lm_head included
        bits_attr = {a.name: a.i for n in onnx.load(str(v.path), load_external_data=False).graph.node
                     if n.op_type == "MatMulNBits" for a in n.attribute}
        assert bits_attr["bits"] == bits and bits_attr["block_size"] == variants.BLOCK_SIZE
        assert 0.9 < v.cosine < 1.0 and 0.0 <= v.top1 <= 1.0 and v.strict is False
        raw = v.cosine >= made.cosine_min and v.top1 >= made.top1_min
        assert v.passed == (raw and all(m.passed for m in v.metrics))  # the centred logits gate too (issue 51)
        assert {"logit cosine", "teacher-forced top-1"} <= {m.name for m in v.metrics}
        assert v.passed or "cosine" in v.error or "top-1" in v.error or "tolerance" in v.error
        assert v.size_bytes < made.get("export").size_bytes and v.decode_tok_s > 0
    assert ("com.microsoft:GatherBlockQuantized" in dict(made.get("int4").fused_ops)) is True
    assert made.get("int4").size_bytes < made.get("int8").size_bytes


def _check_best(made: decoder.DecoderVariants) -> None:
    best, export = made.best, made.get("export")
    assert best is not None and best.passed
    fastest = max(v.decode_tok_s for v in made.variants if v.passed)
    if best.name == "export":  # kept unless another is clearly faster: a smaller lead is noise
        assert fastest < decoder.records.MIN_GAIN * export.decode_tok_s
    else:
        assert best.decode_tok_s == fastest >= decoder.records.MIN_GAIN * export.decode_tok_s
    assert made.speedup == pytest.approx(best.decode_tok_s / export.decode_tok_s)


def test_the_export_stays_best_unless_clearly_beaten():
    def timed(name: str, tok_s: float, passed: bool = True) -> decoder.DecoderVariant:
        return decoder.DecoderVariant(name, None, decode_tok_s=tok_s, passed=passed)

    close = decoder.DecoderVariants((timed("export", 100.0), timed("fused", 104.0)), 0.99, 0.9)
    assert close.best.name == "export" and close.speedup == 1.0
    clear = decoder.DecoderVariants((timed("export", 100.0), timed("fused", 104.0), timed("int8", 180.0)), 0.99, 0.9)
    assert clear.best.name == "int8" and clear.speedup == pytest.approx(1.8)
    failed_export = decoder.DecoderVariants((timed("export", 100.0, passed=False), timed("fused", 101.0)), 0.99, 0.9)
    assert failed_export.best.name == "fused"
    slow = decoder.DecoderVariants((timed("export", 100.0, passed=False), timed("int4", 0.8)), 0.99, 0.9)
    assert slow.best.name == "int4"  # no passing export to be clearly faster than: the fastest passing one
    untimed = decoder.DecoderVariants((decoder.DecoderVariant("export", None, passed=True),), 0.99, 0.9)
    assert untimed.best is None
    inf = decoder.DecoderVariant("int8", None, max_abs_err=float("inf"), cosine=float("nan")).to_dict()
    assert inf["max_abs_err"] is None and inf["cosine"] is None  # report.json stays strict JSON


def test_llama_variants_built_proven_and_timed(llama_run):
    model, outcome = llama_run
    made = outcome.variants
    assert outcome.passed and made is not None
    assert [v.name for v in made.variants] == ["export", "fused", "int8", "int4"]
    export = made.get("export")
    assert export.path == outcome.path and export.passed and export.strict and export.max_abs_err < 1e-4
    assert export.cosine > 0.99999 and export.top1 == 1.0 and export.greedy_steps == export.greedy_tokens
    assert dict(export.fused_ops)["Attention"] == 2  # the exporter's own fused ops, counted
    fused = made.get("fused")
    assert fused.passed and fused.strict and fused.max_abs_err < 1e-4, fused.to_dict()
    assert any(op.startswith("com.microsoft:") for op, _ in fused.fused_ops)
    assert any("no fusion matched" in n for n in fused.notes)  # the routes that matched nothing are reported
    _check_quantized(made, _matmuls(outcome.path))
    _check_best(made)
    as_dict = json.loads(json.dumps(outcome.to_dict()))["variants"]
    assert as_dict["best"] == made.best.name and len(as_dict["variants"]) == 4
    assert {"cosine", "top1_agreement", "greedy_steps_agreeing", "decode_tok_s", "size_bytes", "fused_ops",
            "passed", "error", "path"} <= set(as_dict["variants"][2])
    diags = {d.code: d for d in decoder_outcome.diagnostics(outcome)}
    assert made.best.name in diags["decoder-variant-best"].message


def test_failures_are_recorded_not_raised(llama_run, monkeypatch, tmp_path):
    model, outcome = llama_run

    def broken(src, dst, bits):
        raise RuntimeError(f"no {bits}-bit kernel")

    def fuses_nothing(src, dst, layout):
        onnx.save(onnx.load(str(src)), str(dst))
        return "a fusion tool"

    monkeypatch.setattr(variants, "build_nbits", broken)
    monkeypatch.setattr(variants, "FUSION_STAGES", (fuses_nothing,))
    made = decoder.optimize_decoder(model, outcome.layout, outcome.path, tmp_path, names="int8,fused")
    assert [v.name for v in made.variants] == ["export", "fused", "int8"]
    fused, int8 = made.get("fused"), made.get("int8")
    assert not fused.passed and fused.path is None and fused.error == "not built: no fusion matched this graph"
    assert fused.notes == ("a fusion tool: no fusion matched",)
    assert not int8.passed and int8.error == "not built: RuntimeError: no 8-bit kernel"
    assert made.best.name == "export" and made.speedup == 1.0
    assert not (tmp_path / "variants").exists()  # nothing was written
    with pytest.raises(UsageError, match="unknown decoder variant 'fp8'"):
        decoder.optimize_decoder(model, outcome.layout, outcome.path, tmp_path, names=["fp8"])


def test_a_variant_outside_the_fp32_tolerance_fails(llama_run):
    """An fp32 variant (here the int8 file judged as ``fused``) that changes the numbers is not kept, however
    close its cosine."""
    model, outcome = llama_run
    int8 = outcome.variants.get("int8")
    refs = variants.references(model, outcome.layout)
    judged = variants.judge("fused", int8.path, outcome.layout, refs, decoder.prove.FP32, None)
    assert not judged.passed and judged.error.startswith("outside the fp32 tolerance")
    assert judged.cosine > 0.99 and judged.cosine == pytest.approx(int8.cosine)


def test_gemm_with_transposed_weight_becomes_matmul():
    """GPT-2's Conv1D layers export as Gemm: rewritten as MatMul + Add, same outputs, then quantizable."""
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="g", transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((3, 4)).astype(np.float32)
    assert variants.gemm_to_matmul(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add"]
    variants._drop_unused(model)
    assert {i.name for i in model.graph.initializer} == {"w__t0", "b"}
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w.T + b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_gpt2_variants(tmp_path):
    """GPT-2: its Gemm layers and tied lm_head (a Transpose of the embedding) are quantized too; LayerNorm fuses."""
    outcome = decoder.run_model(_tiny("gpt2"), tmp_path, max_length=MAX_LENGTH, new_tokens=NEW_TOKENS,
                                variants=decoder.CacheVariants(True))
    made = outcome.variants
    fused = made.get("fused")
    assert fused.passed and fused.strict, fused.to_dict()
    assert "com.microsoft:SkipLayerNormalization" in dict(fused.fused_ops)
    int8 = made.get("int8")
    assert dict(int8.fused_ops)["com.microsoft:MatMulNBits"] == 9  # 4 Gemm per layer x 2, and lm_head
    assert any("Gemm rewritten" in n and "transposed weight" in n for n in int8.notes)
    assert _matmuls(int8.path) == 0
    _check_best(made)
    sess = session(made.best.path, providers=["CPUExecutionProvider"])
    ids = np.array([[1, 2, 3]], np.int64)
    assert decoder.greedy(sess, outcome.layout, ids, np.ones_like(ids), 4).shape == (1, 4)
