"""GPU logic that runs without a GPU: the strict fp32 switches, the CUDA provider's TF32 option, which
onnxruntime is imported, and stdout kept pure JSON when a provider prints."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from onnxport import runtime
from onnxport.diagnose.machine import doctor
from onnxport.runtime import environment
from onnxport.runtime.sessions import GpuOptions, provider_chain
from tests.conftest import MODELS, ROOT


def test_strict_fp32_turns_tf32_off_and_restores_the_flags():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        with runtime.strict_fp32():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        try:
            with runtime.strict_fp32():
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        assert torch.backends.cuda.matmul.allow_tf32  # restored on error too
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def test_the_cuda_provider_runs_fp32_without_tf32_unless_asked():
    chain = provider_chain("cuda", available=["CUDAExecutionProvider", "CPUExecutionProvider"])
    cuda = next(opts for p in chain if isinstance(p, tuple) for name, opts in [p] if name == "CUDAExecutionProvider")
    assert cuda["use_tf32"] == "0"
    assert GpuOptions(tf32=True).cuda_options()["use_tf32"] == "1"


def test_doctor_reports_the_onnxruntime_really_imported():
    import onnxruntime as ort

    pkg = environment.onnxruntime_package()
    assert pkg["onnxruntime"] == ort.__version__
    assert pkg["onnxruntime_package"] in environment.ORT_DISTRIBUTIONS
    assert environment.versions()["onnxruntime"] == ort.__version__


def test_json_stdout_stays_json_when_onnxruntime_prints_on_it(tmp_path):
    # a provider that prints an "EP Error" block on stdout at the C level while a session is created
    script = f"""
import os, sys
import onnxruntime as ort
_init = ort.InferenceSession.__init__
def noisy(self, *a, **k):
    os.write(1, b"*************** EP Error ***************\\nEP Error: TensorRT libraries missing\\n")
    return _init(self, *a, **k)
ort.InferenceSession.__init__ = noisy
from onnxport.cli import main
sys.argv = ["onnxport", "export", "{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", "{tmp_path / 'o'}", "--json"]
main()
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)  # nothing but the report
    assert rep["status"] == "ok" and "EP Error" not in proc.stdout and "EP Error" not in proc.stderr
    assert "EP Error" in (tmp_path / "o" / "onnxport.log").read_text()


GPU_BUILD = [runtime.TENSORRT, runtime.CUDA, runtime.CPU]  # what onnxruntime-gpu lists, TensorRT installed or not


def _without_tensorrt(name: str) -> bool:  # a machine with cuDNN but no TensorRT (the H100 this runs on)
    return "nvinfer" not in name


def test_tensorrt_listed_but_unloadable_is_left_out_of_the_chain_with_one_line():
    chain = provider_chain("cuda", available=GPU_BUILD, probe=_without_tensorrt)
    assert runtime.provider_names(chain) == [runtime.CUDA, runtime.CPU]
    (line,) = runtime.unloadable_providers(GPU_BUILD, _without_tensorrt).values()
    assert line.startswith("TensorrtExecutionProvider is listed by onnxruntime but TensorRT's library does not load "
                           "(tried libnvinfer.so.10, libnvinfer.so.8, libnvinfer.so)") and "\n" not in line
    with_trt = provider_chain("cuda", available=GPU_BUILD, probe=lambda name: True)
    assert runtime.provider_names(with_trt) == GPU_BUILD
    assert runtime.unloadable_providers([runtime.CUDA, runtime.CPU], _without_tensorrt) == {}  # not listed: nothing


def test_the_library_probe():
    from onnxport.runtime import libraries

    assert runtime.tensorrt_loadable(lambda name: name == "libnvinfer.so.8")
    assert not runtime.tensorrt_loadable(_without_tensorrt) and runtime.cudnn_loadable(_without_tensorrt)
    status = libraries.status("tensorrt", lambda name: name == "libnvinfer.so.8")
    assert (status.loads, status.library, status.line()) == (True, "libnvinfer.so.8", "TensorRT: loads (libnvinfer.so.8)")
    assert libraries.loads("libc.so.6") and not libraries.loads("libnot-a-library.so.1")  # the real ctypes probe
    assert isinstance(runtime.tensorrt_loadable(), bool)


def test_doctor_reports_whether_tensorrt_and_cudnn_load():
    data = doctor(probe=_without_tensorrt, available=GPU_BUILD)
    assert data["gpu_libraries"]["tensorrt"] == {
        "loads": False, "library": None, "tried": ["libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so"]}
    assert data["gpu_libraries"]["cudnn"]["loads"] and data["gpu_libraries"]["cudnn"]["library"] == "libcudnn.so.9"
    assert data["gpu_libraries_summary"] == ("TensorRT: does not load (tried libnvinfer.so.10, libnvinfer.so.8, "
                                             "libnvinfer.so); cuDNN: loads (libcudnn.so.9)")
    assert len(data["providers_unloadable"]) == 1 and "TensorrtExecutionProvider" in data["providers_unloadable"][0]
    assert data["providers"] == GPU_BUILD
    assert doctor(probe=lambda name: True, available=GPU_BUILD)["providers_unloadable"] == []
