"""Backends, run(), tune() and the benchmark sizes on a tiny model; only the structure of timings is checked."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from onnxport import bench, report
from onnxport.api import load_model
from onnxport.bench import TUNE_KEYS, bench_sizes, peak, peak_key, tune
from onnxport.core.errors import UsageError
from onnxport.core.options import BenchOptions
from onnxport.exporters.chain import export
from onnxport.runtime.backends import (
    Backend,
    OpenVinoBackend,
    OrtBackend,
    OrtOptions,
    TorchBackend,
    default_threads,
    openvino_available,
)

from ..conftest import MODELS


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
    for threads in (1, 2, 4, 8, default_threads()):
        data[peak_key(threads)] = {"gflops": 100.0, "method": "synthetic", "size": 0,
                                   "by_precision": {"fp32": 100.0, "int8": 400.0, "bf16": 200.0}}
    (tmp_path / "peak.json").write_text(json.dumps(data))
    monkeypatch.setattr(peak, "measure_gemm", lambda *a, **k: pytest.fail("the cached peak must be reused"))
    return tmp_path


def test_backends_agree_on_tiny_model(tiny):
    loaded, path = tiny
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
    backends: list[Backend] = [TorchBackend(loaded, threads=1), OrtBackend(path, threads=1),
                               OrtBackend(path, threads=1, options=OrtOptions(graph_optimization_level="disable",
                                                                              enable_mem_pattern=False),
                                          name="ort-plain")]
    if openvino_available():
        backends.append(OpenVinoBackend(path, threads=1, precision="f32"))  # the default is bf16 on a bf16 CPU
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
    options = BenchOptions(batches=(1, 4), threads=1, warmup=1, min_runs=6, max_seconds=0.5, block=3, tune_ort=True)
    result = bench.run(loaded, {"onnxruntime": path}, options, tune_budget_s=0.5, openvino=False,
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
    assert set(d["tuned"]["config"]) == set(TUNE_KEYS)
    assert d["machine"]["cpu"]["model"] and messages


def test_run_rejects_seq_sweep_without_token_input(tiny):
    with pytest.raises(UsageError):
        bench.run(tiny[0], {}, BenchOptions(seq_lens=(16,)), peak=False)


def test_bench_sizes_sweeps_seq_on_token_inputs():
    loaded = load_model(f"{MODELS}:TinyText", inputs=["input_ids:int64[batch,seq]"])
    sizes, notes = bench_sizes(loaded, (1, 2), (4, 8))
    assert [(b, s, z["batch"], z["seq"]) for b, s, z in sizes] == [(1, 4, 1, 4), (1, 8, 1, 8), (2, 4, 2, 4),
                                                                    (2, 8, 2, 8)]
    assert notes == []


def test_tune_returns_the_expected_keys(tiny):
    _, path = tiny
    feeds = {"x": np.ones((2, 8), np.float32)}
    result = tune(path, feeds, threads=2, budget_s=0.5)
    cfg = result["config"]
    assert set(cfg) == {"intra_op_num_threads", "inter_op_num_threads", "execution_mode",
                        "graph_optimization_level", "enable_mem_pattern", "enable_cpu_mem_arena"}
    assert cfg["execution_mode"] in ("sequential", "parallel")
    assert cfg["graph_optimization_level"] in ("disable", "basic", "extended", "all")
    assert result["p50_ms"] > 0 and result["trials"]
    OrtOptions.from_dict(cfg)  # a valid configuration
