"""The benchmark harness: statistics, FLOP counting, interleaving, backends, run(), tune() and the peak cache.

Nothing here asserts on wall times: timings come from synthetic lists or only their structure is checked.
"""

from __future__ import annotations

import json
import math

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxport import bench, report
from onnxport.api import load_model
from onnxport.backends import (
    Backend,
    OpenVinoBackend,
    OrtBackend,
    OrtOptions,
    TorchBackend,
    openvino_available,
)
from onnxport.errors import UsageError
from onnxport.export import export

from .conftest import MODELS

# --------------------------------------------------------------------------- statistics


def test_stats_exact_on_synthetic_timings():
    times = [i / 1000 for i in range(10, 0, -1)]  # 10 ms .. 1 ms, unordered on purpose
    s = bench.stats(times, batch=4)
    assert s["p50_ms"] == pytest.approx(5.5)
    assert s["p90_ms"] == pytest.approx(9.1)  # linear: rank 0.9 * 9 = 8.1 between 9 and 10 ms
    assert s["p99_ms"] == pytest.approx(9.91)
    assert s["mean_ms"] == pytest.approx(5.5)
    assert s["std_ms"] == pytest.approx(math.sqrt(8.25))  # population std of 1..10
    assert s["min_ms"] == pytest.approx(1.0) and s["max_ms"] == pytest.approx(10.0)
    assert s["runs"] == 10
    assert s["throughput"] == pytest.approx(4 / 0.0055)


def test_stats_single_and_empty():
    s = bench.stats([0.002], batch=1)
    assert s["p50_ms"] == s["p99_ms"] == pytest.approx(2.0) and s["std_ms"] == 0.0
    assert s["throughput"] == pytest.approx(500.0)
    with pytest.raises(UsageError):
        bench.stats([], batch=1)


def test_interleave_rotates_every_round():
    names = ["pytorch", "onnxruntime", "openvino"]
    rounds = [bench.interleave(names, r) for r in range(4)]
    assert rounds == [["pytorch", "onnxruntime", "openvino"], ["onnxruntime", "openvino", "pytorch"],
                      ["openvino", "pytorch", "onnxruntime"], ["pytorch", "onnxruntime", "openvino"]]
    for i in range(len(names)):  # over a full cycle every backend takes every position once
        assert sorted(r[i] for r in rounds[:3]) == sorted(names)
    assert bench.interleave([], 3) == []


# --------------------------------------------------------------------------- FLOPs


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _w(name, *shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_flops_matmul_chain_with_dynamic_batch():
    m = _model([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("MatMul", ["r", "w2"], ["y"])],
               [_vi("x", ["batch", 3, 4])], [_vi("y", ["batch", 3, 2])], [_w("w1", 4, 6), _w("w2", 6, 2)])
    count = bench.flops(m, {"x": [2, 3, 4]})
    assert count.total == 2 * (2 * 3) * 6 * 4 + 2 * (2 * 3) * 2 * 6
    assert count.by_op == {"MatMul": count.total} and count.unknown == ()
    assert bench.flops(m, {"x": [5, 3, 4]}).total == 2 * 15 * 6 * 4 + 2 * 15 * 2 * 6


def test_flops_gemm_transposed():
    m = _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1)],
               [_vi("a", ["m", 4])], [_vi("y", ["m", 5])], [_w("b", 5, 4), _w("c", 5)])
    assert bench.flops(m, {"a": [3, 4]}).total == 2 * 3 * 5 * 4


def test_flops_conv_with_groups_and_stride():
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1], strides=[2, 2])],
               [_vi("x", ["n", 4, 8, 8])], [_vi("y", ["n", 6, "h", "w"])], [_w("w", 6, 2, 3, 3)])
    # out [2, 6, 4, 4]; 2 * Cout * Hout * Wout * Cin/groups * kh * kw * batch
    assert bench.flops(m, {"x": [2, 4, 8, 8]}).total == 2 * 6 * 4 * 4 * 2 * 3 * 3 * 2


def test_flops_onnx_attention():
    q, k, v = _vi("q", [1, 2, 5, 4]), _vi("k", [1, 2, 7, 4]), _vi("v", [1, 2, 7, 3])
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"])], "g", [q, k, v],
                              [_vi("y", None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    # Q·Kᵀ: 2·B·H·S·L·D, then probs·V: 2·B·H·S·L·Dv
    assert bench.flops(m, {}).total == 2 * 1 * 2 * 5 * 7 * 4 + 2 * 1 * 2 * 5 * 7 * 3


def test_flops_microsoft_attention():
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=2)
    graph = helper.make_graph([node], "g", [_vi("x", ["b", "s", 8])], [_vi("y", None)],
                              [_w("w", 8, 24), _w("b", 24)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    b, s = 2, 5
    assert bench.flops(m, {"x": [b, s, 8]}).total == 2 * b * s * 8 * 24 + 2 * b * s * s * (8 + 8)


# --------------------------------------------------------------------------- backends and run()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    path = export(loaded, tmp_path_factory.mktemp("bench") / "tiny.onnx", exporter="torchscript").path
    return loaded, path


@pytest.fixture
def fake_peak(tmp_path, monkeypatch):
    """A cache directory already holding a peak for this machine, so no GEMM is measured."""
    monkeypatch.setenv("ONNXPORT_CACHE_DIR", str(tmp_path))
    data = {}
    for threads in (1, 2, 4, 8, bench.default_threads()):
        data[bench._peak_key(threads)] = {"gflops": 100.0, "method": "synthetic", "size": 0}
    (tmp_path / "peak.json").write_text(json.dumps(data))
    monkeypatch.setattr(bench, "measure_gemm", lambda *a, **k: pytest.fail("the cached peak must be reused"))
    return tmp_path


def test_backends_agree_on_tiny_model(tiny):
    loaded, path = tiny
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
    backends: list[Backend] = [TorchBackend(loaded, threads=1), OrtBackend(path, threads=1),
                               OrtBackend(path, threads=1, options=OrtOptions(graph_optimization_level="disable",
                                                                              enable_mem_pattern=False),
                                          name="ort-plain")]
    if openvino_available():
        backends.append(OpenVinoBackend(path, threads=1))
    outs = []
    for b in backends:
        assert isinstance(b, Backend)
        b.open()
        try:
            assert [i.name for i in b.inputs] == ["x"] and b.inputs[0].dtype == "float32"
            outs.append(b.run(feeds))
        finally:
            b.close()
    for got in outs:
        assert len(got) == 1 and got[0].shape == (3, 3)
        np.testing.assert_allclose(got[0], outs[0][0], rtol=1e-5, atol=1e-6)
    with pytest.raises(UsageError):
        OrtOptions(execution_mode="async")


def test_run_gives_schema_valid_benchmark(tiny, fake_peak):
    loaded, path = tiny
    messages: list[str] = []
    result = bench.run(loaded, {"onnxruntime": path}, batches=(1, 4), threads=1, warmup=1, min_runs=6,
                       max_seconds=0.5, block=3, tune_ort=True, tune_budget_s=0.5, openvino=False,
                       progress=messages.append)
    d = result.to_dict()
    jsonschema.validate(d, report.schema()["properties"]["benchmark"])
    json.dumps(d)  # plain JSON types only
    assert d["threads"] == 1 and d["peak_gflops"] == 100.0 and d["peak"]["cached"] is True
    assert [(r["backend"], r["batch"]) for r in d["runs"]] == [
        (b, n) for n in (1, 4) for b in ("pytorch", "onnxruntime", "onnxruntime:tuned")]
    work = {1: 2 * 8 * 16 + 2 * 16 * 3, 4: 4 * (2 * 8 * 16 + 2 * 16 * 3)}
    for r in d["runs"]:
        assert r["runs"] >= 1 and r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["shapes"] == {"x": [r["batch"], 8]}
        assert r["gflop"] == pytest.approx(work[r["batch"]] / 1e9)
        assert r["peak_pct"] == pytest.approx(r["gflops"], rel=1e-3)  # peak is 100 GFLOP/s
        assert r["backend"] == "pytorch" or r["max_abs_diff"] < 1e-5
    assert set(d["tuned"]["config"]) == set(bench.TUNE_KEYS)
    assert d["machine"]["cpu"]["model"] and messages


def test_run_rejects_seq_sweep_without_token_input(tiny):
    with pytest.raises(UsageError):
        bench.run(tiny[0], {}, seq_lens=(16,), peak=False)


def test_bench_sizes_sweeps_seq_on_token_inputs():
    loaded = load_model(f"{MODELS}:TinyText", inputs=["input_ids:int64[batch,seq]"])
    sizes, notes = bench.bench_sizes(loaded, (1, 2), (4, 8))
    assert [(b, s, z["batch"], z["seq"]) for b, s, z in sizes] == [(1, 4, 1, 4), (1, 8, 1, 8), (2, 4, 2, 4),
                                                                    (2, 8, 2, 8)]
    assert notes == []


def test_tune_returns_the_expected_keys(tiny):
    _, path = tiny
    feeds = {"x": np.ones((2, 8), np.float32)}
    result = bench.tune(path, feeds, threads=2, budget_s=0.5)
    cfg = result["config"]
    assert set(cfg) == {"intra_op_num_threads", "inter_op_num_threads", "execution_mode",
                        "graph_optimization_level", "enable_mem_pattern", "enable_cpu_mem_arena"}
    assert cfg["execution_mode"] in ("sequential", "parallel")
    assert cfg["graph_optimization_level"] in ("disable", "basic", "extended", "all")
    assert result["p50_ms"] > 0 and result["trials"]
    OrtOptions.from_dict(cfg)  # a valid configuration


def test_peak_is_measured_once_then_cached(tmp_path, monkeypatch):
    cache = tmp_path / "sub" / "peak.json"
    first = bench.gemm_peak(1, cache_file=cache, size=64, repeats=1)
    assert first["cached"] is False and first["gflops"] > 0 and cache.is_file()
    stored = json.loads(cache.read_text())
    assert list(stored) == [bench._peak_key(1)]
    monkeypatch.setattr(bench, "measure_gemm", lambda *a, **k: pytest.fail("measured again"))
    second = bench.gemm_peak(1, cache_file=cache, size=64, repeats=1)
    assert second["cached"] is True and second["gflops"] == first["gflops"]
    calls = []
    monkeypatch.setattr(bench, "measure_gemm", lambda t, s, r: calls.append(t) or {"gflops": 1.0})
    assert bench.gemm_peak(1, cache_file=cache, refresh=True)["gflops"] == 1.0 and calls == [1]
    cache.write_text("not json")  # a corrupt cache is measured anew, not an error
    assert bench.gemm_peak(1, cache_file=cache)["cached"] is False
