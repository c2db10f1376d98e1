"""Device-resident timing (bench/resident.py) run for real on the CPU provider: inputs and outputs bound once as
OrtValues, each timed call a bare ``run_with_iobinding`` on the same buffers, a CUDA-graph pool replayed on its
captured binding; the benchmark and the variants' timing take that path where asked and say so."""

from __future__ import annotations

import numpy as np
import pytest

from onnxport import bench, optimize
from onnxport.api import load_model
from onnxport.bench.resident import PER_CALL, RESIDENT, ResidentRun, call_or_run, resident_run, timed_call
from onnxport.core.options import BenchOptions
from onnxport.exporters.chain import export
from onnxport.optimize import choice
from onnxport.runtime import CPU, GraphSessions, SessionBackend, SessionOptions, open_for, session
from onnxport.runtime.backends import OrtBackend, TorchBackend

from ..conftest import MODELS


@pytest.fixture(scope="module")
def mlp():
    return load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..16"])


@pytest.fixture(scope="module")
def mlp_file(mlp, tmp_path_factory):
    return export(mlp, tmp_path_factory.mktemp("resident") / "model.onnx", exporter="torchscript").path


def _x(batch: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 8)).astype(np.float32)


def test_a_resident_run_reuses_its_bound_buffers_and_copies_nothing_back_per_call(mlp_file):
    sess = session(mlp_file, providers=[CPU])
    name = sess.get_inputs()[0].name
    x = _x()
    run = resident_run(sess, {name: x})
    assert isinstance(run, ResidentRun) and not run.replay
    (out,) = run.outputs
    assert out.device_name() == "cpu" and out.shape() == [4, 3]
    ptr = out.data_ptr()
    bound = [v.data_ptr() for v in run.binding.get_outputs()]
    fetched = []
    original = type(out).numpy

    def counting(self):
        fetched.append(1)
        return original(self)

    type(out).numpy = counting
    try:
        for _ in range(25):
            run()
    finally:
        type(out).numpy = original
    assert run.calls == 25 and not fetched  # the timed calls copied no output to the host
    assert [v.data_ptr() for v in run.binding.get_outputs()] == bound == [ptr]  # the same buffers, written in place
    np.testing.assert_allclose(run.fetch()[0], sess.run(None, {name: x})[0], atol=0)
    x[:] = 0  # the inputs were copied once when bound: the caller's array is not read again
    run()
    np.testing.assert_allclose(run.fetch()[0], sess.run(None, {name: _x()})[0], atol=0)


def test_a_cuda_graph_pool_is_replayed_on_its_captured_binding(mlp_file):
    graphs = GraphSessions(mlp_file, [CPU], device="cpu")
    name = graphs.get_inputs()[0].name
    x = _x(3)
    run = resident_run(graphs, {name: x})
    captured = graphs.captured({name: x})
    assert run.replay and run.binding is captured.binding and run.outputs == captured.outputs
    for _ in range(5):
        run()
    assert len(graphs.by_shape) == 1 and run.calls == 5
    np.testing.assert_allclose(run.fetch()[0], session(mlp_file, providers=[CPU]).run(None, {name: x})[0],
                               rtol=1e-6)


def test_timed_call_binds_onnx_runtime_sessions_only_when_asked(mlp, mlp_file):
    feeds = {"x": _x(2)}
    ort_backend = OrtBackend(mlp_file, threads=1)
    graph = SessionBackend(mlp_file, open_for(SessionOptions(CPU, enable_cuda_graph=True)), "cuda-graph")
    torch_backend = TorchBackend(mlp, threads=1)
    for b in (ort_backend, graph, torch_backend):
        b.open()
    assert isinstance(timed_call(ort_backend, feeds, resident=True), ResidentRun)
    assert timed_call(graph, feeds, resident=True).replay
    assert not isinstance(timed_call(ort_backend, feeds, resident=False), ResidentRun)
    assert not isinstance(timed_call(torch_backend, feeds, resident=True), ResidentRun)  # PyTorch: its run()
    call, why = call_or_run(ort_backend, {"x": np.zeros((2, 5), np.float32)}, resident=True)  # cannot run there
    assert why and not isinstance(call, ResidentRun)


def test_the_benchmark_times_onnx_runtime_resident_with_io_binding_and_says_so(mlp, mlp_file):
    options = BenchOptions(batches=(2,), min_runs=3, max_seconds=0.3, warmup=1, threads=1, io_binding=True)
    result = bench.run(mlp, {"onnxruntime": mlp_file}, options, peak=False, openvino=False)
    rows = {r.backend: r for r in result.runs}
    assert rows["onnxruntime"].runs >= 3 and rows["onnxruntime"].max_abs_diff < 1e-5
    assert result.settings["timing"].startswith(RESIDENT)
    plain = bench.run(mlp, {"onnxruntime": mlp_file}, BenchOptions(batches=(2,), min_runs=3, max_seconds=0.3,
                                                                      warmup=1, threads=1), peak=False,
                      openvino=False)
    assert plain.settings["timing"] == PER_CALL


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_variants_asked_on_cuda_are_timed_resident_and_the_report_says_how(mlp, mlp_file, monkeypatch, tmp_path):
    made: list[ResidentRun] = []
    real = choice.call_or_run

    def recording(backend, feeds, resident):
        call, why = real(backend, feeds, resident)
        made.append(call)
        return call, why

    monkeypatch.setattr(choice, "call_or_run", recording)
    lat = choice.measure({"export": mlp_file}, mlp, [1], seconds=0.1, threads=1, device="cuda")
    assert lat["export"]["1"] > 0 and isinstance(made[0], ResidentRun) and made[0].calls >= 5
    made.clear()
    choice.measure({"export": mlp_file}, mlp, [1], seconds=0.1, threads=1)
    assert made and not isinstance(made[0], ResidentRun)  # the CPU: per call, as before
    res = optimize.variants(mlp, mlp_file, tmp_path, optimize.VariantOptions(names=["tf32"], device="cuda",
                                                                             bench_batches=(1,), bench_seconds=0.1))
    assert res.timing == RESIDENT
