"""serve --device cuda runs best.onnx as it was proven (report.json's best.session_options), without the CUDA
graph a served model's changing shapes cannot keep; on the CPU the options change nothing."""

from __future__ import annotations

import json

from onnxport.runtime import CUDA, TENSORRT, SessionOptions
from onnxport.serve.models import discover
from onnxport.serve.served import device_options


def _out(tmp_path, options: dict):
    (tmp_path / "best.onnx").write_bytes(b"")
    (tmp_path / "report.json").write_text(json.dumps({"best": {"name": "fp16", "path": "best.onnx",
                                                               "session_options": options}}))
    return discover(tmp_path)[0]


def test_cuda_serves_with_the_proven_options_but_no_cuda_graph(tmp_path):
    source = _out(tmp_path, {"provider": "CUDAExecutionProvider", "use_tf32": True, "enable_cuda_graph": True,
                             "io_binding": True})
    assert source.proven_options.enable_cuda_graph is True
    providers = device_options(source, "cuda")["providers"]
    (name, cuda), cpu = providers
    assert name == "CUDAExecutionProvider" and cpu == "CPUExecutionProvider"
    assert cuda["use_tf32"] == "1" and "enable_cuda_graph" not in cuda


def test_tensorrt_best_keeps_its_engine_cache_under_out(tmp_path):
    source = _out(tmp_path, {"provider": "TensorrtExecutionProvider", "trt_fp16_enable": True,
                             "trt_engine_cache_enable": True, "trt_engine_cache_path": "tensorrt",
                             "trt_profile_min_shapes": "x:1x8", "trt_profile_max_shapes": "x:64x8"})
    (name, trt), (cuda_name, _), _ = device_options(source, "cuda")["providers"]
    assert name == "TensorrtExecutionProvider" and cuda_name == "CUDAExecutionProvider"
    assert trt["trt_fp16_enable"] is True and trt["trt_engine_cache_path"] == str(tmp_path / "tensorrt")
    assert trt["trt_profile_min_shapes"] == "x:1x8" and trt["trt_profile_max_shapes"] == "x:64x8"


def test_cpu_ignores_the_proven_options(tmp_path):
    source = _out(tmp_path, {"provider": "CUDAExecutionProvider", "use_tf32": True})
    assert "providers" not in device_options(source, "cpu")
    plain = _out(tmp_path, {"provider": "CPUExecutionProvider"})
    assert "providers" not in device_options(plain, "cuda")


def test_the_model_source_reads_best_session_options_into_the_record(tmp_path):
    recorded = {"provider": "TensorrtExecutionProvider", "trt_fp16_enable": True, "trt_engine_cache_path": "tensorrt",
                "use_tf32": False, "trt_profile_max_shapes": "x:64x8"}
    source = _out(tmp_path, recorded)
    assert source.proven_options == SessionOptions(TENSORRT, trt_fp16_enable=True, trt_engine_cache_path="tensorrt",
                                                   use_tf32=False, trt_profile_max_shapes="x:64x8")
    assert source.proven_options.to_dict() == recorded
    assert _out(tmp_path, {}).proven_options is None  # nothing recorded: the device's defaults


def test_triton_reads_best_session_options_into_the_record(tmp_path):
    from onnxport.serve.repository import _read_out

    _out(tmp_path, {"provider": "CUDAExecutionProvider", "use_tf32": True, "enable_cuda_graph": "1"})
    assert _read_out(tmp_path)[4] == SessionOptions(CUDA, use_tf32=True, enable_cuda_graph=True)
