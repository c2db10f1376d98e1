"""The default variant plan: only what can win for the model kind on the device, the rest with the reason."""

from __future__ import annotations

import pytest

from onnxport import optimize
from onnxport.api import export, load_model
from onnxport.optimize import openvino as ov_variants
from onnxport.optimize.plan import default_plan
from onnxport.optimize.result import OPENVINO_VARIANTS, VARIANTS, parse_names
from tests.conftest import MODELS


@pytest.fixture(autouse=True)
def no_openvino(monkeypatch):
    """The plans below as on a machine without OpenVINO (tests/optimize/test_openvino.py plans with it)."""
    monkeypatch.setattr(ov_variants, "openvino_missing", lambda: "the optional package 'openvino' is not installed")


@pytest.fixture(scope="module")
def mlp():
    return load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])


TEXT_INPUTS = ["input_ids:int64[batch,seq]{0..49}"]
QUICK = {"bench_batches": (1,), "bench_seconds": 0.2}


@pytest.fixture(scope="module")
def text_export(tmp_path_factory):
    """TinyText (seq=1..32) and its proven export, shared by the tests that build variants of it (each into an
    OUT of its own)."""
    out = tmp_path_factory.mktemp("plan_text")
    rep = export(f"{MODELS}:TinyText", out / "m", inputs=TEXT_INPUTS, dims=["seq=1..32"])
    assert rep["status"] == "ok"
    return load_model(f"{MODELS}:TinyText", inputs=TEXT_INPUTS, dims=["seq=1..32"]), out / "m" / "model.onnx"


def test_plan_for_a_plain_model_on_an_x86_cpu(mlp):
    plan = default_plan(mlp, "cpu", ["avx2", "fma"])
    assert plan.build == ("int8",)
    assert set(plan.skipped) == (set(VARIANTS) | set(OPENVINO_VARIANTS)) - {"int8"}
    assert all("not installed" in plan.skipped[n] for n in OPENVINO_VARIANTS)
    assert "through Casts" in plan.skipped["fp16"] and "--variants all" in plan.skipped["fp16"]
    # AVX512-FP16 does not change it: onnxruntime's CPU provider has no x86 fp16 matmul kernels
    assert "fp16" not in default_plan(mlp, "cpu", ["avx512f", "avx512_fp16", "amx_fp16"]).build


def test_plan_builds_fp16_where_onnxruntime_has_fp16_kernels(mlp):
    assert "fp16" in default_plan(mlp, "cpu", ["asimdhp"]).build


def test_skip_reasons_are_rules_not_one_machines_numbers(mlp):
    """No model's figures in the reasons every model is given."""
    text = load_model(f"{MODELS}:TinyText", inputs=["input_ids:int64[batch,seq]{0..49}"])
    for loaded in (mlp, text, load_model("torchvision:resnet18")):
        for flags in (["avx2"], ["avx512_vnni", "avx512_bf16", "amx_int8"]):
            for why in default_plan(loaded, "cpu", flags).skipped.values():
                assert not any(name in why for name in ("MiniLM", "resnet18", "TextClassifier", "0.82")), why


def test_plan_for_attention_models_and_cnns():
    text = load_model(f"{MODELS}:TinyText", inputs=["input_ids:int64[batch,seq]{0..49}"])
    assert default_plan(text, "cpu", []).build == ("int8",)  # nn.MultiheadAttention: ORT's fusion does not match
    assert "Hugging Face attention" in default_plan(text, "cpu", []).skipped["fused"]
    cnn = load_model("torchvision:resnet18")
    plan = default_plan(cnn, "cpu", [])
    assert plan.build == () and "calibration" in plan.skipped["int8"]


def test_plan_on_cuda_keeps_fp16_and_drops_int8(mlp):
    plan = default_plan(mlp, "cuda", [])
    assert "fp16" in plan.build and "int8" not in plan.build and "CUDA" in plan.skipped["int8"]


def test_names_all_auto_and_lists():
    assert parse_names("all") == list(VARIANTS) and parse_names(None) == list(VARIANTS)
    assert parse_names("auto") == "auto"
    assert parse_names("int8,slim,int8") == ["int8", "slim"]


def test_budget_stops_starting_variants(tmp_path, mlp):
    rep = export(f"{MODELS}:TinyMLP", tmp_path / "m", inputs=["x:float32[batch,8]"], exporter="torchscript")
    assert rep["status"] == "ok"
    res = optimize.variants(mlp, tmp_path / "m" / "model.onnx", tmp_path / "o",
                            optimize.VariantOptions(names=["slim", "ort"], budget_s=1e-3, **QUICK))
    skipped = {v.name: v.skipped for v in res.variants if v.skipped}
    assert set(skipped) == {"slim", "ort"} and all("--budget" in why for why in skipped.values())
    assert res.best is not None and res.best.name == "export"


def test_nothing_to_build_skips_the_proof_and_timing(tmp_path, monkeypatch):
    cnn_like = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    rep = export(f"{MODELS}:TinyMLP", tmp_path / "m", inputs=["x:float32[batch,8]"], exporter="torchscript")
    assert rep["status"] == "ok"
    from onnxport.optimize import choice
    from onnxport.optimize.plan import Plan

    monkeypatch.setattr(choice, "default_plan", lambda *a, **k: Plan((), {"int8": "not built by default: test"}))
    res = optimize.variants(cnn_like, tmp_path / "m" / "model.onnx", tmp_path / "o",
                            optimize.VariantOptions(names="auto"))
    assert [(v.name, v.skipped) for v in res.variants] == [("int8", "not built by default: test")]
    assert res.best is None and not (tmp_path / "o" / "best.onnx").exists()
    assert not (tmp_path / "o" / "variants").exists()  # no empty folder left behind


def test_the_default_plan_screens_without_the_all_max_case_and_proves_the_best_on_it(tmp_path, text_export):
    """Every variant is judged without the all-max case (each dim's maximum has a case of its own); the best is
    proven on it before it is chosen, and report.json's best says which cases judged the variants."""
    from onnxport.core.samples import validation_cases
    from onnxport.optimize.choice import screening_cases

    text, model = text_export
    judged, left = screening_cases(text, validation_cases(text.dims))
    assert [c.label for c in left] == ["max"] and "max" not in [c.label for c in judged]
    assert {"max batch only", "max seq only"} <= {c.label for c in judged}
    one_dim = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    assert screening_cases(one_dim, validation_cases(one_dim.dims))[1] == []  # nothing to leave out

    res = optimize.variants(text, model, tmp_path / "o",
                            optimize.VariantOptions(names="auto", bench_batches=(1,), bench_seconds=0.2))
    assert res.judged_on["left_out"] == ["max"] and "max" not in res.judged_on["cases"]
    every = optimize.variants(text, model, tmp_path / "all",
                              optimize.VariantOptions(names=["int8"], bench_batches=(1,), bench_seconds=0.2))
    assert every.judged_on["left_out"] == [] and "max" in every.judged_on["cases"]


def test_a_best_that_fails_the_case_left_to_it_is_not_chosen(tmp_path, monkeypatch, text_export):
    from dataclasses import replace

    from onnxport.optimize import choice

    text, model = text_export
    seen = []

    def fails(best, path, refs, ctx):
        seen.append((best.name, [c.label for c in refs.cases]))
        return replace(best, passed=False, reason="on the case(s) max: test")

    monkeypatch.setattr(choice, "clearly_faster", lambda s: True)  # whatever the timing, int8 is the candidate
    monkeypatch.setattr(choice, "choose_best",
                        lambda vs, *a, **k: next((v for v in vs if v.name == "int8" and v.passed), vs[0] if vs else None))
    monkeypatch.setattr(choice, "_left_out_failure", fails)
    res = optimize.variants(text, model, tmp_path / "o",
                            optimize.VariantOptions(names="auto", bench_batches=(1,), bench_seconds=0.2))
    assert seen == [("int8", ["max"])]
    v = {e.name: e for e in res.variants}
    assert v["int8"].passed is False and "max" in v["int8"].reason and res.best.name == "export"


def test_the_not_built_line_says_each_reason(capsys, tmp_path):
    """The terminal lists each left-out variant with its rule or the CPU feature that rules it out."""
    from onnxport.cli.render import _print_variants

    rep = {"variants": [
        {"name": "export", "passed": True, "latency_ms": {"1": 1.0}, "nodes": 3, "bytes": 10, "max_abs_err": 0.0,
         "metric": None},
        {"name": "slim", "passed": False, "skipped": "not built by default: same rewrites (--variants all builds it)",
         "skip_reason": "not-planned", "latency_ms": {}},
        {"name": "ort", "passed": False, "skipped": "not built by default: same rewrites (--variants all builds it)",
         "skip_reason": "not-planned", "latency_ms": {}},
        {"name": "openvino-int8", "passed": False, "skip_reason": "not-planned", "latency_ms": {},
         "skipped": "not built by default: this CPU has no int8 dot-product instructions (no AVX-512 VNNI) "
                    "(--variants openvino-int8 builds it)"}]}
    _print_variants(rep, tmp_path)
    err = capsys.readouterr().err
    assert "slim, ort: same rewrites" in err and "openvino-int8: this CPU has no int8 dot-product" in err
