"""GPU logic that runs without a GPU: the strict fp32 switches, the CUDA provider's TF32 option, which
onnxruntime is imported, and stdout kept pure JSON when a provider prints."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from onnxport import environment, runtime
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
