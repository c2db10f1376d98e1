"""The OpenVINO variants (f32, bf16, NNCF int8): skipped with the reason where OpenVINO, NNCF or bf16 is missing;
where they are here, proven against PyTorch, timed with the others and recorded with backend "openvino"."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from onnxport import optimize
from onnxport.api import load_model
from onnxport.exporters.chain import export
from onnxport.optimize import openvino as ov_variants
from onnxport.optimize.context import BuildContext, Skip
from onnxport.optimize.nncf_int8 import overflow_fix
from onnxport.optimize.plan import default_plan
from onnxport.optimize.policy import tolerance_policy
from onnxport.optimize.result import SkipReason, Variant
from onnxport.runtime import SessionOptions, open_for
from onnxport.runtime.openvino import bf16_missing, compile_config
from onnxport.runtime.sessions import OrtOptions
from tests.conftest import MODELS

HAVE_OV = importlib.util.find_spec("openvino") is not None
HAVE_NNCF = importlib.util.find_spec("nncf") is not None
needs_ov = pytest.mark.skipif(not HAVE_OV, reason="openvino is not installed")
FAST = {"bench_batches": (1,), "bench_seconds": 0.2}


def test_bf16_needs_the_cpu_flag():
    assert bf16_missing(["avx2", "avx512_vnni"]) and "bf16" in bf16_missing(["avx2"])
    assert bf16_missing(["avx512_bf16"]) is None and bf16_missing(["amx_bf16"]) is None


def test_skipped_without_openvino_or_bf16(monkeypatch, tmp_path):
    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    ctx = BuildContext(loaded)
    monkeypatch.setattr(ov_variants, "openvino_missing", lambda: "the optional package 'openvino' is not installed")
    for build in (ov_variants.build_openvino, ov_variants.build_openvino_bf16, ov_variants.build_openvino_int8):
        with pytest.raises(Skip) as e:
            build(tmp_path / "m.onnx", tmp_path / "v.onnx", ctx)
        assert e.value.reason is SkipReason.NOT_BUILT and "openvino" in str(e.value)
    monkeypatch.setattr(ov_variants, "openvino_missing", lambda: None)
    assert ov_variants.why_not_here("openvino-bf16", ["avx2"]) [1] is SkipReason.NOT_BUILT
    assert ov_variants.why_not_here("openvino-bf16", ["avx512_bf16"]) is None
    assert ov_variants.why_not_here("openvino", device="cuda")[1] is SkipReason.NOT_APPLICABLE


AVX2 = ["avx2", "fma"]  # no VNNI, no native bf16
VNNI = ["avx2", "avx512f", "avx512_vnni"]  # int8 dot products, no native bf16
AMX = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"]


def test_plan_takes_the_cpu_into_account(monkeypatch):
    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    monkeypatch.setattr(ov_variants, "openvino_missing", lambda: None)
    monkeypatch.setattr(ov_variants, "nncf_missing", lambda: None)
    plan = default_plan(loaded, "cpu", AMX)  # native bf16: bf16 instead of f32, no calibration
    assert "openvino-bf16" in plan.build and "openvino" not in plan.build and "openvino-int8" not in plan.build
    assert "native bf16" in plan.skipped["openvino"] and "native bf16" in plan.skipped["openvino-int8"]
    assert "int8" in plan.build
    plan = default_plan(loaded, "cpu", VNNI)  # int8 dot products without bf16: OpenVINO's int8 can win
    assert {"openvino", "openvino-int8", "int8"} <= set(plan.build) and "openvino-bf16" in plan.skipped
    plan = default_plan(loaded, "cpu", AVX2)  # neither: f32 only, the reason names the missing instructions
    assert "openvino" in plan.build and "openvino-bf16" in plan.skipped and "bf16" in plan.skipped["openvino-bf16"]
    assert "openvino-int8" not in plan.build and "VNNI" in plan.skipped["openvino-int8"]
    assert "--variants openvino-int8 builds it" in plan.skipped["openvino-int8"]
    assert plan.reason("openvino-bf16") is SkipReason.NOT_BUILT and plan.reason("openvino-int8") is SkipReason.NOT_PLANNED
    monkeypatch.setattr(ov_variants, "openvino_missing", lambda: "not installed")
    plan = default_plan(loaded, "cpu", ["avx512_bf16"])
    assert "openvino" in plan.skipped and plan.reason("openvino") is SkipReason.NOT_BUILT


def test_the_cpu_features_can_be_given(monkeypatch):
    """$ONNXPORT_CPU_FLAGS plans as if the CPU had only those features, and says what it really has."""
    from onnxport.runtime import environment

    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", "avx2, fma")
    got = environment.cpu()
    assert got["flags"] == ["avx2", "fma"] and got["flags_from"] == "ONNXPORT_CPU_FLAGS" and "flags_detected" in got
    monkeypatch.delenv("ONNXPORT_CPU_FLAGS")
    assert "flags_from" not in environment.cpu()
    assert environment.int8_dot(AVX2) is None and environment.int8_dot(VNNI) == "avx512_vnni"


def test_bf16_is_judged_by_the_task_metric():
    from onnxport.core.records import FP32

    assert tolerance_policy("openvino-bf16", FP32) == (FP32, False, True)
    assert tolerance_policy("openvino", FP32) == (FP32, True, False)
    assert tolerance_policy("openvino-int8", FP32) == (FP32, False, True)
    assert compile_config("bf16", 2) == {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
                                         "INFERENCE_NUM_THREADS": 2}


def test_backend_in_the_variant_record():
    v = Variant("openvino-bf16", "model.onnx", True, session_options=ov_variants.openvino_options("bf16"))
    d = v.to_dict()
    assert d["backend"] == "openvino"
    assert d["session_options"] == {"provider": "openvino", "inference_precision": "bf16",
                                    "performance_hint": "LATENCY"}
    assert Variant("int8", "x.onnx", True).to_dict()["backend"] == "onnxruntime"


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("opt_ov")
    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    result = export(loaded, out / "model.onnx", exporter="torchscript")
    model = Path(getattr(result, "path", out / "model.onnx"))
    names = ["openvino", "openvino-bf16"] + (["openvino-int8"] if HAVE_NNCF else [])
    return out, loaded, optimize.variants(loaded, model, out, optimize.VariantOptions(names=names, **FAST))


@needs_ov
def test_openvino_variants_proven_and_timed(mlp_run):
    out, _loaded, result = mlp_run
    by = {v.name: v for v in result.variants}
    f32 = by["openvino"]
    assert f32.passed, f32.reason
    assert f32.session_options.provider == "openvino" and f32.session_options.inference_precision == "f32"
    assert f32.details["backend"] == "openvino" and f32.latency_ms.get("1")
    assert f32.tolerance is not None and f32.tolerance.atol <= 1e-4
    bf16 = by["openvino-bf16"]
    if bf16.skipped:
        assert bf16.skip_reason is SkipReason.NOT_BUILT
    else:
        assert bf16.passed, bf16.reason
        assert bf16.metrics and bf16.latency_ms.get("1")
    if HAVE_NNCF and not by["openvino-int8"].skipped:
        assert by["openvino-int8"].metrics


@needs_ov
def test_openvino_session_is_used_like_onnxruntime(mlp_run):
    out, _loaded, _result = mlp_run
    sess = open_for(ov_variants.openvino_options("f32"), out, threads=1)(out / "model.onnx")
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    from onnxport.runtime.sessions import session

    ref = session(out / "model.onnx").run(None, {"x": x})
    got = sess.run(None, {"x": x})
    assert [i.name for i in sess.get_inputs()] == ["x"] and sess.get_providers() == ["openvino"]
    np.testing.assert_allclose(got[0], ref[0], atol=1e-5)
    assert sess.run([sess.get_outputs()[0].name], {"x": x})[0].shape == ref[0].shape


def test_triton_config_follows_an_openvino_best(tmp_path):
    from onnxport.serve.models import signature
    from onnxport.serve.triton import config_pbtxt, model_config

    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    export(loaded, tmp_path / "model.onnx", exporter="torchscript")
    sig = signature(tmp_path / "model.onnx")
    config = model_config(sig, "m", tuned=OrtOptions(intra_op_num_threads=2, execution_mode=None,
                                                     graph_optimization_level=None),
                          variant_options=ov_variants.openvino_options("bf16"))
    assert config["backend"] == "openvino" and "platform" not in config
    assert config["default_model_filename"] == "model.onnx"
    assert config["parameters"]["INFERENCE_PRECISION_HINT"] == {"string_value": "bf16"}
    assert config["parameters"]["INFERENCE_NUM_THREADS"] == {"string_value": "2"}
    text = config_pbtxt(config)
    assert 'backend: "openvino"' in text and "onnxruntime_onnx" in text  # the note says how to switch back
    plain = model_config(sig, "m", variant_options=SessionOptions("CPUExecutionProvider"))
    assert plain["platform"] == "onnxruntime_onnx"


@needs_ov
def test_served_from_a_triton_repository_on_openvino(tmp_path):
    from onnxport.serve.models import _from_repository_entry, signature
    from onnxport.serve.served import Metrics, load
    from onnxport.serve.triton import config_pbtxt, model_config

    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    (tmp_path / "m" / "1").mkdir(parents=True)
    export(loaded, tmp_path / "m" / "1" / "model.onnx", exporter="torchscript")
    config = model_config(signature(tmp_path / "m" / "1" / "model.onnx"), "m",
                          variant_options=ov_variants.openvino_options("f32"))
    (tmp_path / "m" / "config.pbtxt").write_text(config_pbtxt(config))
    source = _from_repository_entry(tmp_path / "m")
    assert source.proven_options == ov_variants.openvino_options("f32")
    served = load(source, None, None, Metrics())
    assert served.session.get_providers() == ["openvino"]


needs_nncf = pytest.mark.skipif(not (HAVE_OV and HAVE_NNCF), reason="openvino and nncf are not installed")


def test_int8_calibration_covers_each_dims_range():
    from onnxport.optimize.nncf_int8 import calibration_cases

    loaded = load_model(f"{MODELS}:TinyText", inputs=["input_ids:int64[batch,seq]"], dims=["seq=1..32"])
    labels = {c.label: c.sizes for c in calibration_cases(loaded)}
    assert {"export", "min", "odd"} <= set(labels) and "max" not in labels  # the all-max case is left out...
    assert max(s["seq"] for s in labels.values()) == 32  # ...each dim's maximum is covered on its own
    assert all(c.values == "random" for c in calibration_cases(loaded))


@needs_nncf
def test_qdq_switch_model_switches_the_quantized_activations(tmp_path):
    """The search's one-session model of a QDQ file: every switch set = the QDQ file, none set = float
    activations with the int8 weights (close to the fp32 model)."""
    import onnx

    from onnxport.optimize.nncf_int8 import quantize
    from onnxport.optimize.sensitivity import qdq_switch_model
    from onnxport.runtime.sessions import session

    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    export(loaded, tmp_path / "model.onnx", exporter="torchscript")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    quantize(tmp_path / "model.onnx", tmp_path / "q.onnx", feeds, transformer=False)
    proto = onnx.load(str(tmp_path / "q.onnx"))
    names, switches = qdq_switch_model(proto)
    assert len(names) == 2 and all(n in {m.name for m in proto.graph.node} for n in names)
    onnx.save(proto, str(tmp_path / "switch.onnx"))
    sw = session(tmp_path / "switch.onnx", opt_level="basic")
    x = 3 * rng.standard_normal((5, 8)).astype(np.float32)
    fp32 = session(tmp_path / "model.onnx").run(None, {"x": x})[0]
    qdq = session(tmp_path / "q.onnx", opt_level="basic").run(None, {"x": x})[0]
    on = sw.run(None, {"x": x, **{s: np.array(True) for s in switches}})[0]
    off = sw.run(None, {"x": x, **{s: np.array(False) for s in switches}})[0]
    np.testing.assert_allclose(on, qdq, rtol=1e-6, atol=1e-6)
    assert np.abs(off - fp32).max() < np.abs(qdq - fp32).max()


@needs_nncf
def test_openvino_int8_keeps_the_sensitive_node_out_of_int8(tmp_path):
    """Per-tensor static int8 of fc2's input (one channel ~1000x the others) fails the task metric; the search
    leaves fc2 out of int8, fc1 stays int8, and the variant passes, its search recorded."""
    from tests.optimize.test_variants import OUTLIER

    src = tmp_path / "outlier.py"
    src.write_text(OUTLIER)
    loaded = load_model(f"{src}:Outlier", inputs=["x:float32[batch,4,8]"])
    export(loaded, tmp_path / "model.onnx", exporter="torchscript")
    result = optimize.variants(loaded, tmp_path / "model.onnx", tmp_path,
                               optimize.VariantOptions(names=["openvino-int8"], **FAST))
    v = {e.name: e for e in result.variants}["openvino-int8"]
    assert v.passed, v.reason
    sens = v.details["sensitivity"]
    assert sens["plain_int8_metric"]["passed"] is False and sens["kept"] == 1 == len(sens["kept_fp32"])
    assert sens["of"] == 2 and v.metric.value >= 0.99
    assert v.session_options.inference_precision == ov_variants.int8_precision()
    assert v.details["calibration"].startswith("16 generated inputs") and v.batch_invariant is not None
    assert v.details["overflow_fix"] == overflow_fix()  # 7-bit weights where the CPU's int8 sums saturate


def test_the_overflow_fix_follows_the_cpu():
    """Without int8 dot products (AVX2) 8-bit weights saturate OpenVINO's int16 pair sums: NNCF's overflow fix is on
    (7-bit weights everywhere); with VNNI or AMX-INT8 it is off."""
    assert overflow_fix(AVX2) == "enable" and overflow_fix(VNNI) == "disable" and overflow_fix(AMX) == "disable"



@needs_nncf
def test_openvino_int8_says_how_onnxruntime_opens_it(mlp_run):
    """The file is NNCF's, for OpenVINO; whether onnxruntime opens it at its defaults is measured and recorded."""
    import onnxruntime as ort

    out, _loaded, result = mlp_run
    v = {e.name: e for e in result.variants}["openvino-int8"]
    if v.skipped:
        pytest.skip(v.reason)
    said = v.details["onnxruntime"]
    from onnxport.core.errors import one_line

    try:
        ort.InferenceSession(str(out / v.path))
        opens = None
    except Exception as e:  # noqa: BLE001 - what onnxruntime says is compared below
        opens = one_line(e)
    if opens is None:
        assert said == "opens"
    else:
        assert said.startswith(("opens only at graph optimization level basic", "does not open")), said
        assert opens[:60] in said


def test_an_openvino_best_is_said_with_how_onnxruntime_opens_it():
    options = SessionOptions("openvino", inference_precision="bf16")
    best = Variant("openvino-int8", "best.onnx", True, session_options=options,
                   details={"onnxruntime": "opens only at graph optimization level basic (…)"})
    [note] = ov_variants.best_notes(best)
    assert note.code == "best-needs-openvino" and "bf16" in note.message and "level basic" in note.message
    assert ov_variants.best_notes(Variant("int8", "best.onnx", True)) == []
    assert ov_variants.best_notes(Variant("int8", "best.onnx", True, session_options=SessionOptions.base("cpu"))) == []
