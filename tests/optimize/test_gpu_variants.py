"""GPU variants without a GPU: the cuda plan on simulated providers, the GPU fp16 file, the session options each
variant records and the report carries, the CUDA-graph session pool (run for real on the CPU provider), the
Triton config that reproduces the options, and the GPU benchmark script's CPU smoke path."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from google.protobuf import text_format

from onnxport import optimize, report
from onnxport.api import load_model
from onnxport.core.errors import UsageError
from onnxport.core.records import FP16, TF32
from onnxport.exporters.chain import export
from onnxport.optimize import choice, gpu
from onnxport.optimize.context import BuildContext, Skip
from onnxport.optimize.fusion import fused_attention, transformer_params
from onnxport.optimize.plan import default_plan
from onnxport.optimize.policy import tolerance_policy
from onnxport.optimize.precision import build_fp16
from onnxport.optimize.result import GPU_VARIANTS, OptimizeResult, Variant, parse_names
from onnxport.report.build import Outcome, build_report
from onnxport.runtime import (
    CPU,
    CUDA,
    TENSORRT,
    GraphSessions,
    Placement,
    SessionBackend,
    SessionOptions,
    gpu_options_for,
    graph_blocker,
    memcpy_nodes,
    needs_fixed_shapes,
    open_for,
    providers_for,
    session,
    without_cuda_graph,
)
from onnxport.serve.models import signature
from onnxport.serve.triton import config_pbtxt, model_config
from tests.conftest import MODELS

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "gpu.py"
TRT_LIST = [TENSORRT, CUDA, CPU]
GRAPH = {"provider": CUDA, "use_tf32": False, "enable_cuda_graph": True, "io_binding": True, "graph_per_shape": True}


@pytest.fixture(scope="module")
def mlp():
    return load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..16"])


@pytest.fixture(scope="module")
def mlp_file(mlp, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpu_mlp") / "model.onnx"
    export(mlp, path, exporter="torchscript")
    return path


def _cuda_ctx(loaded, tmp_path: Path, **kw) -> BuildContext:
    return BuildContext(loaded, transformer=transformer_params(loaded), device="cuda", out=tmp_path, **kw)


# --------------------------------------------------------------------------- plan


def test_cuda_plan_builds_tensorrt_only_where_it_is_listed_and_loads(mlp):
    plan = default_plan(mlp, "cuda", [], providers=TRT_LIST, tensorrt_loadable=True)
    assert {"fp16", "tf32", "tensorrt", "cuda-graph"} <= set(plan.build)
    assert not {"int8", "fused+int8", "fused"} & set(plan.build)
    no_libs = default_plan(mlp, "cuda", [], providers=TRT_LIST, tensorrt_loadable=False)
    assert "tensorrt" not in no_libs.build and "libnvinfer" in no_libs.skipped["tensorrt"]
    assert {"fp16", "tf32", "cuda-graph"} <= set(no_libs.build)
    unlisted = default_plan(mlp, "cuda", [], providers=[CUDA, CPU], tensorrt_loadable=True)
    assert "does not offer the TensorrtExecutionProvider" in unlisted.skipped["tensorrt"]
    cpu = default_plan(mlp, "cpu", ["avx2"])
    assert not set(GPU_VARIANTS) & (set(cpu.build) | set(cpu.skipped))  # a CPU report does not list them
    assert parse_names("tf32,cuda-graph") == ["tf32", "cuda-graph"]


def test_tolerance_policies_of_the_gpu_variants():
    tf32, by_elements, by_metric = tolerance_policy("tf32", optimize.choice.FP32)
    assert (tf32.atol, tf32.rtol) == (TF32.atol, TF32.rtol) and by_elements and by_metric
    assert FP16.atol > TF32.atol > optimize.choice.FP32.atol  # a 10-bit mantissa, fp32 accumulation
    assert tolerance_policy("tensorrt", optimize.choice.FP32)[0] == FP16


# --------------------------------------------------------------------------- builders and options


def test_gpu_variants_skip_on_the_cpu(mlp, mlp_file, tmp_path):
    ctx = BuildContext(mlp, out=tmp_path)
    for build in (gpu.build_tf32, gpu.build_tensorrt):
        with pytest.raises(Skip, match="--device cuda"):
            build(mlp_file, tmp_path / "x.onnx", ctx)
    with pytest.raises(Skip, match="--device cuda"):
        gpu.build_cuda_graph(mlp_file, tmp_path / "x.onnx", ctx, {})


def test_each_gpu_variant_records_the_session_options_it_needs(mlp, mlp_file, tmp_path):
    ctx = _cuda_ctx(mlp, tmp_path, timed_at={"batch": 4})
    tf32 = gpu.build_tf32(mlp_file, tmp_path / "tf32.onnx", ctx)
    assert tf32.path == mlp_file and tf32.session_options == SessionOptions(CUDA, use_tf32=True)
    (cuda, opts), cpu = providers_for(tf32.session_options)
    assert cuda == CUDA and opts["use_tf32"] == "1" and cpu == CPU and "enable_cuda_graph" not in opts
    assert gpu_options_for(tf32.session_options).tf32 is True

    trt = gpu.build_tensorrt(mlp_file, tmp_path / "trt.onnx", ctx, available=TRT_LIST, loadable=True)
    o = trt.session_options
    assert o.provider == TENSORRT and o.trt_fp16_enable is True and trt.policy == "tensorrt"
    assert (o.trt_profile_min_shapes, o.trt_profile_opt_shapes, o.trt_profile_max_shapes) == \
        ("x:1x8", "x:4x8", "x:16x8")
    assert (tmp_path / gpu.TRT_CACHE).is_dir()
    chain = providers_for(o, out_dir=tmp_path)
    assert [p[0] if isinstance(p, tuple) else p for p in chain] == [TENSORRT, CUDA, CPU]
    assert chain[0][1]["trt_fp16_enable"] is True and chain[0][1]["trt_profile_max_shapes"] == "x:16x8"
    assert chain[0][1]["trt_engine_cache_path"] == str(tmp_path / gpu.TRT_CACHE) and chain[1][1]["use_tf32"] == "0"
    with pytest.raises(Skip, match="libnvinfer"):
        gpu.build_tensorrt(mlp_file, tmp_path / "trt.onnx", ctx, available=TRT_LIST, loadable=False)


def test_the_session_options_record_gives_back_the_dict_each_variant_records(mlp, mlp_file, tmp_path):
    """SessionOptions.to_dict() is report.json's ``session_options`` (keys and their order); every function takes
    the record or the dict."""
    trt = gpu.build_tensorrt(mlp_file, tmp_path / "trt.onnx", _cuda_ctx(mlp, tmp_path), available=TRT_LIST,
                             loadable=True).session_options.to_dict()
    assert list(trt) == ["provider", "trt_fp16_enable", "trt_max_workspace_size", "trt_engine_cache_enable",
                         "trt_engine_cache_path", "trt_timing_cache_enable", "trt_timing_cache_path", "use_tf32",
                         "trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes"]
    cpu, cuda = SessionOptions.base("cpu").to_dict(), SessionOptions.base("cuda").to_dict()
    assert cpu == {"provider": CPU} and cuda == {"provider": CUDA, "use_tf32": False}
    for recorded in (GRAPH, trt, cpu, cuda, {"provider": CUDA, "later_key": 1}):
        rec = SessionOptions.from_dict(recorded)
        assert list(rec.to_dict().items()) == list(recorded.items())
        assert providers_for(rec, tmp_path) == providers_for(recorded, tmp_path)
    assert SessionOptions.from_dict({"provider": CUDA, "use_tf32": "1"}).use_tf32 is True
    graph = SessionOptions.from_dict(GRAPH)
    assert needs_fixed_shapes(graph) and not needs_fixed_shapes(without_cuda_graph(graph))
    assert without_cuda_graph(graph).to_dict() == without_cuda_graph(GRAPH) == cuda


def test_cuda_graph_needs_every_node_on_cuda_and_captures_the_fastest_file(mlp, mlp_file, tmp_path):
    ctx = _cuda_ctx(mlp, tmp_path)
    on_cuda = Placement("cuda", (CUDA, CPU), (CUDA, CPU), {CUDA: 3})
    assert graph_blocker(on_cuda) is None
    fp16 = tmp_path / "fp16.onnx"
    seen = []
    out = gpu.build_cuda_graph(mlp_file, tmp_path / "g.onnx", ctx, {"export": mlp_file, "fp16": fp16},
                               fastest=lambda paths: seen.append(sorted(paths)) or "fp16",
                               copies=lambda p, chain: [], placed=lambda p, chain: pytest.fail("not asked"))
    assert seen == [["export", "fp16"]] and out.path == fp16 and out.policy == "fp16"
    assert out.session_options == SessionOptions.from_dict(GRAPH) and needs_fixed_shapes(out.session_options)
    assert out.session_options.to_dict() == GRAPH
    assert providers_for(out.session_options)[0][1]["enable_cuda_graph"] == "1"
    assert without_cuda_graph(out.session_options).enable_cuda_graph is None
    with pytest.raises(Skip, match=r"copies between CPU and GPU at MemcpyToHost \(m0\)"):
        gpu.build_cuda_graph(mlp_file, tmp_path / "g.onnx", ctx, {}, copies=lambda p, chain: ["MemcpyToHost (m0)"])
    split = Placement("cuda", (CUDA, CPU), (CUDA, CPU), {CUDA: 3, CPU: 1}, ("MaxPool (pool)",))
    with pytest.raises(Skip, match=r"every node on CUDA; on the CPU: MaxPool \(pool\)"):  # the copies unknown
        gpu.build_cuda_graph(mlp_file, tmp_path / "g.onnx", ctx, {}, copies=lambda p, chain: None,
                             placed=lambda p, chain: split)
    assert memcpy_nodes(mlp_file, [CPU]) == []  # one provider: nothing to copy


def test_graph_sessions_keep_one_session_per_shape(mlp_file):
    """The CUDA-graph runner (fixed input/output buffers, IO binding) run for real on the CPU provider."""
    graphs = GraphSessions(mlp_file, [CPU], device="cpu", max_shapes=2)
    plain = session(mlp_file, providers=[CPU])
    name = plain.get_inputs()[0].name
    rng = np.random.default_rng(0)
    for batch in (1, 3, 1):
        x = rng.standard_normal((batch, 8), dtype=np.float32)
        np.testing.assert_allclose(graphs.run(None, {name: x})[0], plain.run(None, {name: x})[0], rtol=1e-6)
    assert len(graphs.by_shape) == 2
    for value in range(1, 6):  # temporaries freed after each call: a recycled id must not keep stale inputs
        got = graphs.run(None, {name: np.full((1, 8), value, np.float32)})[0]
        np.testing.assert_allclose(got, plain.run(None, {name: np.full((1, 8), value, np.float32)})[0], rtol=1e-6)
    with pytest.raises(UsageError, match="per input shape"):
        graphs.run(None, {name: np.zeros((5, 8), np.float32)})


def test_measure_times_a_file_under_its_variants_session_options(mlp, mlp_file):
    options = {"cuda-graph": SessionOptions(CPU, enable_cuda_graph=True)}
    lat = choice.measure({"export": mlp_file, "cuda-graph": mlp_file}, mlp, [1], seconds=0.1, threads=1,
                         options=options)
    assert lat["export"]["1"] > 0 and lat["cuda-graph"]["1"] > 0


# --------------------------------------------------------------------------- the GPU fp16 file


def test_gpu_fp16_of_a_hugging_face_bert_is_fused_with_fp32_io(tmp_path):
    loaded = load_model(f"{BENCH}:tiny_bert", inputs=["input_ids:int64[batch,seq]{0..999}",
                                                       "attention_mask:int64[batch,seq]{1..1}"],
                        dims=["batch=1..4", "seq=1..16"])
    src = tmp_path / "model.onnx"
    export(loaded, src, exporter="torchscript", opset=17)
    outcome = build_fp16(src, tmp_path / "fp16.onnx", _cuda_ctx(loaded, tmp_path))
    model = onnx.load(str(tmp_path / "fp16.onnx"))
    onnx.checker.check_model(model)
    assert "use_gpu=True" in outcome.details["tool"] and outcome.details["keep_io_types"] is True
    assert fused_attention(model) == 1 and outcome.details["fusions"].get("Attention") == 1
    io = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}
    assert io == {"input_ids": onnx.TensorProto.INT64, "attention_mask": onnx.TensorProto.INT64,
                  model.graph.output[0].name: onnx.TensorProto.FLOAT}
    halves = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert sum(int(np.prod(t.dims)) for t in halves) > 10_000  # the weights are fp16


# --------------------------------------------------------------------------- report and Triton


def test_report_records_the_options_of_each_variant_and_of_the_best(mlp):
    base = Variant("export", "model.onnx", True, latency_ms={"1": 1.2}, session_options=SessionOptions.base("cuda"))
    graph = Variant("cuda-graph", "variants/fp16.onnx", True, latency_ms={"1": 0.4},
                    session_options=SessionOptions.from_dict(GRAPH))
    result = OptimizeResult((base, graph), graph, None, 1, timed_at={"batch": 1, "seq": 128})
    rep = build_report(Outcome(mlp, None, (), {}, optimized=result))
    assert rep["best"]["session_options"] == GRAPH and rep["best"]["name"] == "cuda-graph"
    assert [v["session_options"] for v in rep["variants"]] == [{"provider": CUDA, "use_tf32": False}, GRAPH]
    jsonschema.validate(rep["variants"], report.schema()["properties"]["variants"])


@pytest.mark.parametrize("options, accelerators", [
    (GRAPH, {"cuda": {"use_tf32": "0", "enable_cuda_graph": "1"}}),
    ({"provider": CUDA, "use_tf32": True}, {"cuda": {"use_tf32": "1"}}),
    ({"provider": TENSORRT, "trt_fp16_enable": True, "trt_max_workspace_size": 2048,
      "trt_profile_min_shapes": "x:1x8", "trt_profile_opt_shapes": "x:4x8", "trt_profile_max_shapes": "x:16x8"},
     {"tensorrt": {"precision_mode": "FP16", "max_workspace_size_bytes": "2048", "trt_engine_cache_enable": "1",
                   "trt_profile_min_shapes": "x:1x8", "trt_profile_opt_shapes": "x:4x8",
                   "trt_profile_max_shapes": "x:16x8"},
      "cuda": {"use_tf32": "0"}}),
])
def test_triton_config_carries_the_best_variants_options(mlp_file, options, accelerators):
    from tritonclient.grpc import model_config_pb2 as pb2

    text = config_pbtxt(model_config(signature(mlp_file), "m", gpu=True, max_batch=8,
                                     variant_options=SessionOptions.from_dict(options)))
    cfg = text_format.Parse(text, pb2.ModelConfig())
    got = {a.name: dict(a.parameters) for a in cfg.optimization.execution_accelerators.gpu_execution_accelerator}
    assert got == accelerators
    assert cfg.HasField("dynamic_batching") is (not options.get("enable_cuda_graph"))


# --------------------------------------------------------------------------- benchmarks/gpu.py


def _bench_module():
    spec = importlib.util.spec_from_file_location("gpu_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_without_cuda_says_so_and_exits_0(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would run the real benchmark")
    assert _bench_module().main([]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.slow
def test_gpu_benchmark_cpu_smoke_runs_every_row(tmp_path, capsys):
    assert _bench_module().main(["--cpu-smoke", "--runs", "2", "--json", str(tmp_path / "t.json"),
                                 "--work", str(tmp_path / "w")]) == 0
    (row,) = json.loads((tmp_path / "t.json").read_text())
    ms = row["ms"]
    for label in ("torch eager fp32", "onnxport fp32", "onnxport fp16", "onnxport fp16 + CUDA graph"):
        assert isinstance(ms[label], float) and ms[label] > 0, (label, ms[label])
    assert any(k.startswith("onnxport best") for k in ms) and "onnxport fp16 + CUDA graph" in capsys.readouterr().out


def test_the_benchmark_times_the_best_with_its_session_options(mlp, mlp_file):
    from onnxport.bench import run
    from onnxport.core.options import BenchOptions

    best = SessionBackend(mlp_file, open_for(SessionOptions(CPU, enable_cuda_graph=True)),
                              "onnxruntime:best (cuda-graph)")
    options = BenchOptions(batches=(2,), min_runs=3, max_seconds=0.5, warmup=1, threads=1)
    result = run(mlp, {"onnxruntime": mlp_file}, options, peak=False, openvino=False, extra_backends=[best])
    rows = {r.backend: r for r in result.runs}
    assert set(rows) == {"pytorch", "onnxruntime", "onnxruntime:best (cuda-graph)"}
    assert rows["onnxruntime:best (cuda-graph)"].max_abs_diff < 1e-5


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_variants_on_cuda_prove_and_time_each_under_its_options(mlp, mlp_file, tmp_path, monkeypatch):
    """The whole flow with device="cuda" on this CPU-only onnxruntime (which runs what is asked of the CUDA
    provider on the CPU): tf32 runs the export with use_tf32=1 under the TF32 policy and is timed; the CUDA graph
    is refused where the copies cannot be read and the nodes are placed on the CPU."""
    monkeypatch.setattr(gpu, "memcpy_nodes", lambda path, chain: None)
    res = optimize.variants(mlp, mlp_file, tmp_path,
                            optimize.VariantOptions(names=["tf32", "cuda-graph"], device="cuda", bench_batches=(1,), bench_seconds=0.2))
    by = {v.name: v for v in res.variants}
    assert by["export"].session_options == SessionOptions(CUDA, use_tf32=False)
    tf32 = by["tf32"]
    assert tf32.passed and tf32.session_options == SessionOptions(CUDA, use_tf32=True)
    assert Path(tf32.path) == mlp_file and tf32.tolerance.to_dict() == TF32.to_dict() and tf32.latency_ms["1"] > 0
    assert by["cuda-graph"].skipped and "a CUDA graph needs every node on CUDA" in by["cuda-graph"].skipped
    assert res.best is not None and res.best.session_options.provider == CUDA
