"""Triton model repository + KServe manifest: config.pbtxt parses with Triton's protobuf, serve DIR serves it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as th
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from onnxport.core.errors import UsageError
from onnxport.runtime.sessions import OrtOptions
from onnxport.serve.repository import triton_repository
from tests.serve.test_serve import fixed_shape_model, mlp_out, reference, running  # noqa: F401 - mlp_out is a fixture


def parse(path) -> object:
    """config.pbtxt parsed by Triton's own ModelConfig protobuf."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_batched_model_config_manifest_and_copy(tmp_path, mlp_out):  # noqa: F811
    repo = triton_repository(mlp_out, tmp_path / "repo", max_batch=8, max_delay_ms=1.5, instance_count=2)
    assert repo.name == "TinyMLP" and repo.max_batch_size == 8
    assert repo.model_dir == tmp_path / "repo" / "TinyMLP"
    assert repo.model_path.read_bytes() == (mlp_out / "model.onnx").read_bytes()
    cfg = parse(repo.config_path)
    assert cfg.name == "TinyMLP" and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 8
    assert [(i.name, model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in cfg.input] == \
        [("x", "TYPE_FP32", [8])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("output", [3])]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 1500
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in cfg.instance_group] == \
        [(2, "KIND_CPU")]
    assert {k: v.string_value for k, v in cfg.parameters.items()} == \
        {"intra_op_thread_count": "0", "inter_op_thread_count": "0"}
    assert not cfg.optimization.execution_accelerators.gpu_execution_accelerator
    (warmup,) = cfg.model_warmup
    assert warmup.batch_size == 1 and list(warmup.inputs["x"].dims) == [8] and warmup.inputs["x"].random_data
    text = repo.config_path.read_text()
    assert "# instance_group { count: 1 kind: KIND_GPU }" in text  # the GPU variant, commented
    manifest = repo.manifest_path.read_text()
    assert repo.manifest_path == repo.model_dir / "inferenceservice.yaml"
    for words in ("kind: InferenceService", "name: tinymlp", "name: onnx", "runtime: kserve-tritonserver",
                  "protocolVersion: v2", "storageUri:"):
        assert words in manifest
    assert sorted(p.relative_to(repo.model_dir).as_posix() for p in repo.files) == \
        ["1/model.onnx", "config.pbtxt", "inferenceservice.yaml"]


def test_gpu_config_has_tensorrt_and_tuned_threads(tmp_path, mlp_out):  # noqa: F811
    out = tmp_path / "out"
    shutil.copytree(mlp_out, out)
    report = json.loads((out / "report.json").read_text())
    report["benchmark"] = {"tuned": {"intra_op_num_threads": 3, "inter_op_num_threads": 2,
                                     "execution_mode": "parallel"}}
    (out / "report.json").write_text(json.dumps(report))
    repo = triton_repository(out, tmp_path / "repo", name="mlp-gpu", gpu=True)
    cfg = parse(repo.config_path)
    assert cfg.name == "mlp-gpu"
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(cfg.instance_group[0].kind) == "KIND_GPU"
    (accel,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    assert accel.name == "tensorrt" and accel.parameters["precision_mode"] == "FP16"
    assert {k: v.string_value for k, v in cfg.parameters.items()} == \
        {"intra_op_thread_count": "3", "inter_op_thread_count": "2", "execution_mode": "1"}
    assert "nvidia.com/gpu" in repo.manifest_path.read_text()
    from onnxport.serve import discover

    (source,) = discover(tmp_path / "repo")  # serve DIR reads the threads back
    assert source.name == "mlp-gpu" and source.tuned == OrtOptions(intra_op_num_threads=3, inter_op_num_threads=2,
                                                                  execution_mode=None, graph_optimization_level=None)


def test_gpu_config_reproduces_the_best_variants_session_options(tmp_path, mlp_out):  # noqa: F811
    out = tmp_path / "out"
    shutil.copytree(mlp_out, out)
    shutil.copy2(out / "model.onnx", out / "best.onnx")
    report = json.loads((out / "report.json").read_text())
    report["best"] = {"name": "cuda-graph", "path": "best.onnx", "session_options": {
        "provider": "CUDAExecutionProvider", "use_tf32": False, "enable_cuda_graph": True, "io_binding": True}}
    (out / "report.json").write_text(json.dumps(report))
    repo = triton_repository(out, tmp_path / "repo", name="graph", gpu=True, max_batch=8)
    cfg = parse(repo.config_path)
    (accel,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    assert accel.name == "cuda" and dict(accel.parameters) == {"use_tf32": "0", "enable_cuda_graph": "1"}
    assert not cfg.HasField("dynamic_batching")  # a captured graph replays one shape
    assert "enable_cuda_graph: ONNX Runtime captures one CUDA graph" in repo.config_path.read_text()
    cpu = parse(triton_repository(out, tmp_path / "repo", name="cpu", max_batch=8).config_path)
    assert not cpu.optimization.execution_accelerators.gpu_execution_accelerator and cpu.HasField("dynamic_batching")


def test_fixed_shape_model_has_no_batch_dim(tmp_path):
    path = fixed_shape_model(tmp_path / "fixed.onnx")
    repo = triton_repository(path, tmp_path / "repo", max_batch=16)
    cfg = parse(repo.config_path)
    assert cfg.max_batch_size == 0 and repo.max_batch_size == 0
    assert list(cfg.input[0].dims) == [2, 3] and list(cfg.output[0].dims) == [2, 3]
    assert not cfg.HasField("dynamic_batching")
    assert list(cfg.model_warmup[0].inputs["x"].dims) == [2, 3]


def test_existing_entry_needs_force_and_bad_inputs_are_usage_errors(tmp_path, mlp_out):  # noqa: F811
    triton_repository(mlp_out, tmp_path / "repo")
    marker = tmp_path / "repo" / "TinyMLP" / "notes.txt"
    marker.write_text("mine")
    with pytest.raises(UsageError, match="already exists") as err:
        triton_repository(mlp_out, tmp_path / "repo")
    assert "--force" in err.value.hint and marker.exists()
    repo = triton_repository(mlp_out, tmp_path / "repo", force=True)
    assert not marker.exists() and repo.model_path.is_file()
    assert not list((tmp_path / "repo").glob(".*"))  # no temporary folder left behind
    with pytest.raises(UsageError, match="does not exist"):
        triton_repository(tmp_path / "missing", tmp_path / "repo")
    with pytest.raises(UsageError, match="max_batch"):
        triton_repository(mlp_out, tmp_path / "repo2", max_batch=-1)


def test_external_data_is_copied_with_the_model(tmp_path, mlp_out):  # noqa: F811
    src = tmp_path / "ext"
    src.mkdir()
    model = onnx.load(str(mlp_out / "model.onnx"))
    onnx.save(model, str(src / "model.onnx"), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    assert (src / "weights.bin").is_file()
    repo = triton_repository(src, tmp_path / "repo", name="ext")
    assert (repo.model_dir / "1" / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    x = np.ones((2, 8), np.float32)
    got = ort.InferenceSession(str(repo.model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, reference(mlp_out / "model.onnx", x), rtol=1e-6)


def test_serve_the_repository_round_trip(tmp_path, mlp_out):  # noqa: F811
    from onnxport.serve import serve_app

    triton_repository(mlp_out, tmp_path / "repo", max_batch=4)
    triton_repository(fixed_shape_model(tmp_path / "fixed.onnx"), tmp_path / "repo")
    with running(serve_app(tmp_path / "repo")) as url:
        client = th.InferenceServerClient(url)
        assert client.get_model_repository_index() == [
            {"name": "TinyMLP", "version": "1", "state": "READY"}, {"name": "fixed", "version": "1", "state": "READY"}]
        assert client.get_model_config("TinyMLP")["max_batch_size"] == 4  # from config.pbtxt
        assert client.get_model_config("fixed")["max_batch_size"] == 0
        x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
        inp = th.InferInput("x", [3, 8], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer("TinyMLP", [inp], model_version="1")
        np.testing.assert_allclose(result.as_numpy("output"), reference(mlp_out / "model.onnx", x), rtol=1e-6,
                                   atol=1e-6)
        big = th.InferInput("x", [5, 8], "FP32")
        big.set_data_from_numpy(np.zeros((5, 8), np.float32))
        with pytest.raises(th.InferenceServerException, match="batch size 5"):
            client.infer("TinyMLP", [big])
        y = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
        inp = th.InferInput("x", [2, 3], "FP32")
        inp.set_data_from_numpy(y)
        np.testing.assert_array_equal(client.infer("fixed", [inp]).as_numpy("y"), np.maximum(y, 0) * 2)
        client.close()
