"""The GPU provider chain TensorRT -> CUDA -> CPU, the placement report and IO binding.

This machine has no GPU: the chain logic runs against simulated provider lists (what onnxruntime-gpu
reports), placement parsing against ONNX Runtime's log format for a mixed placement, and everything that
can run for real (sessions, verbose placement log, IO binding) runs on the real CPU provider.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from onnxport import runtime
from onnxport.core.errors import EXIT_ENVIRONMENT, EnvironmentProblem, UsageError
from onnxport.runtime.backends import OrtBackend
from onnxport.runtime.sessions import CPU, CUDA, TENSORRT, GpuOptions
from tests.conftest import MODELS, load_report, run_cli

GPU_BUILD = [TENSORRT, CUDA, CPU]  # onnxruntime-gpu with TensorRT libraries installed
CUDA_ONLY = [CUDA, CPU]


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("providers") / "mlp.onnx"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()
    torch.onnx.export(model, (torch.randn(2, 8),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    return path, model


def test_cpu_chain_is_the_cpu_provider_alone():
    assert runtime.provider_chain("cpu") == [CPU]
    assert runtime.provider_chain("cpu", available=[]) == [CPU]


def test_cuda_chain_orders_tensorrt_cuda_cpu_with_options(tmp_path):
    gpu = GpuOptions(device_id=1, fp16=True, trt_workspace_bytes=3 * 1024**3, trt_engine_cache=str(tmp_path))
    chain = runtime.provider_chain("cuda", gpu=gpu, available=GPU_BUILD)
    assert runtime.provider_names(chain) == [TENSORRT, CUDA, CPU]
    trt = dict(chain[0][1])
    assert trt == {"device_id": 1, "trt_fp16_enable": True, "trt_max_workspace_size": 3 * 1024**3,
                   "trt_engine_cache_enable": True, "trt_engine_cache_path": str(tmp_path),
                   "trt_timing_cache_enable": True, "trt_timing_cache_path": str(tmp_path)}
    assert chain[1][1]["device_id"] == 1 and chain[2] == CPU


def test_cuda_chain_without_tensorrt_or_when_it_is_turned_off():
    assert runtime.provider_names(runtime.provider_chain("cuda", available=CUDA_ONLY)) == [CUDA, CPU]
    off = runtime.provider_chain("cuda", gpu=GpuOptions(tensorrt=False), available=GPU_BUILD)
    assert runtime.provider_names(off) == [CUDA, CPU]
    no_cache = runtime.provider_chain("cuda", available=GPU_BUILD)[0][1]
    assert "trt_engine_cache_enable" not in no_cache and no_cache["trt_fp16_enable"] is False


def test_cuda_without_the_cuda_provider_is_an_environment_problem():
    with pytest.raises(EnvironmentProblem) as e:
        runtime.provider_chain("cuda", available=["CPUExecutionProvider"])
    assert e.value.exit_code == EXIT_ENVIRONMENT == 4
    assert "CUDAExecutionProvider" in e.value.message and "onnxruntime-gpu" in e.value.hint
    with pytest.raises(EnvironmentProblem, match="PyTorch sees no CUDA device") as e:
        runtime.check_device("cuda", torch_cuda=False, available=GPU_BUILD)
    assert "CUDA build of torch" in e.value.hint
    runtime.check_device("cuda", torch_cuda=True, available=CUDA_ONLY)  # both sides present: no error
    with pytest.raises(UsageError):
        runtime.check_device("tpu")


def test_placement_on_the_real_cpu_provider(mlp_onnx):
    path, _ = mlp_onnx
    placed = runtime.placement(path, "cpu")
    assert placed.providers_requested == (CPU,) and placed.providers_used == (CPU,)
    n_nodes = len(onnx.load(str(path)).graph.node)  # 3; ONNX Runtime fuses Gemm+Relu before placing
    assert list(placed.nodes_per_provider) == [CPU]  # from ONNX Runtime's own verbose placement log
    assert 1 <= placed.nodes_per_provider[CPU] <= n_nodes
    assert placed.cpu_fallback_nodes == ()
    unoptimized = runtime.placement_from(*_session_and_log(path, opt_level="disable"))
    assert unoptimized.nodes_per_provider == {CPU: n_nodes}


def _session_and_log(path, **kw):
    log: list[str] = []
    sess = runtime.session(path, log_sink=log, **kw)
    return sess, "cpu", [CPU], "".join(log)


def test_placement_with_a_simulated_gpu_chain_reports_the_cpu_fallback(mlp_onnx):
    """A chain naming providers this build lacks: ONNX Runtime drops them, every node falls back to the CPU."""
    path, _ = mlp_onnx
    chain = [(TENSORRT, {"trt_fp16_enable": True}), (CUDA, {"device_id": 0}), CPU]
    with pytest.warns(UserWarning, match="not in available provider names"):
        placed = runtime.placement(path, "cuda", providers=chain)
    assert placed.providers_requested == (TENSORRT, CUDA, CPU)
    assert placed.providers_used == (CPU,)
    assert placed.cpu_fallback_nodes == (f"all {placed.nodes_per_provider[CPU]} nodes",)


MIXED_LOG = """\
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1598 VerifyEachNodeIsAssignedToAnEp] Node placements
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1610 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [TensorrtExecutionProvider]. Number of nodes: 1
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1613 VerifyEachNodeIsAssignedToAnEp]   TRTKernel_graph_main_123_0 (TensorrtExecutionProvider_TRTKernel_graph_main_123_0_0)
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1610 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 1
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1613 VerifyEachNodeIsAssignedToAnEp]   MemcpyToHost (Memcpy_token_1)
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1610 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1613 VerifyEachNodeIsAssignedToAnEp]   NonMaxSuppression (/model/nms)
2026-11-22 23:44:19.311 [V:onnxruntime:, session_state.cc:1613 VerifyEachNodeIsAssignedToAnEp]   Unique (/model/unique)
2026-11-22 23:44:19.400 [I:onnxruntime:, inference_session.cc:2090 Initialize] Session successfully initialized.
"""


def test_parse_a_mixed_placement_log():
    counts, nodes = runtime.parse_placement(MIXED_LOG)
    assert counts == {TENSORRT: 1, CUDA: 1, CPU: 2}
    assert nodes[CPU] == ["NonMaxSuppression (/model/nms)", "Unique (/model/unique)"]
    assert nodes[CUDA] == ["MemcpyToHost (Memcpy_token_1)"]

    class Session:  # what onnxruntime-gpu's session reports for that log
        def get_providers(self):
            return [TENSORRT, CUDA, CPU]

    placed = runtime.placement_from(Session(), "cuda", [(TENSORRT, {}), (CUDA, {}), CPU], MIXED_LOG)
    assert placed.cpu_fallback_nodes == ("NonMaxSuppression (/model/nms)", "Unique (/model/unique)")
    assert placed.to_dict()["providers_used"] == [TENSORRT, CUDA, CPU]


def test_io_binding_runs_for_real_on_the_cpu(mlp_onnx):
    path, model = mlp_onnx
    sess = runtime.session(path)
    bound = runtime.BoundRunner(sess, "cpu")
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    bound.bind({"x": x})
    bound.run()
    (y,) = bound.outputs()
    with torch.inference_mode():
        ref = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, ref, atol=1e-5)
    np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], atol=0)


def test_sessions_stop_spinning_when_a_run_ends(mlp_onnx):
    """Idle pools of one session must not spin on the cores the next session (or PyTorch) is timed on."""
    path, _ = mlp_onnx
    for sess in (runtime.session(path), runtime.session(path, threads=2, opt_level="basic")):
        assert sess.get_session_options().get_session_config_entry("session.force_spinning_stop") == "1"


def test_ort_backend_with_io_binding_rebinds_only_new_arrays(mlp_onnx):
    path, _ = mlp_onnx
    backend = OrtBackend(path, io_binding=True, threads=1)
    backend.open()
    a = {"x": np.ones((2, 8), np.float32)}
    b = {"x": np.zeros((5, 8), np.float32)}
    first = backend.run(a)[0]
    runner = backend._bound
    assert backend.run(a)[0].tolist() == first.tolist() and backend._bound is runner  # same arrays: no rebind
    assert backend.run(b)[0].shape == (5, 3) and backend._bound is not runner
    plain = OrtBackend(path, threads=1)
    plain.open()
    np.testing.assert_allclose(plain.run(b)[0], backend.run(b)[0], atol=0)
    backend.close()
    plain.close()


def test_report_records_the_runtime(tmp_path):
    from onnxport import api

    rep = api.export(f"{MODELS}:TinyMLP", tmp_path, exporter="torchscript", inputs=["x:float32[batch,8]"],
                     dims=["batch=1..4"])
    load_report(tmp_path)
    assert {k: v for k, v in rep["runtime"].items() if k != "nodes_per_provider"} == {
        "device": "cpu", "providers_requested": [CPU], "providers_used": [CPU], "cpu_fallback_nodes": [],
        "cpu_compute_nodes": [], "cpu_shape_nodes": [], "memcpy_nodes": 0, "providers_unloadable": []}
    assert list(rep["runtime"]["nodes_per_provider"]) == [CPU]
    assert 1 <= rep["runtime"]["nodes_per_provider"][CPU] <= rep["check"]["nodes"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("command", ["convert", "bench", "export"])
def test_cli_device_cuda_without_a_gpu_exits_4(tmp_path, command):
    res = run_cli(command, f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--device", "cuda",
                  "-o", str(tmp_path / "out"))
    assert res.returncode == 4, res.stderr
    assert "--device cuda" in res.stderr and "onnxruntime-gpu" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


def test_cli_unknown_device_is_usage_error(tmp_path):
    res = run_cli("export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--device", "tpu", "--json",
                  "-o", str(tmp_path / "out"))
    assert res.returncode == 2 and "unknown --device 'tpu'" in res.stderr
    assert json.loads(res.stdout or "null") is None
