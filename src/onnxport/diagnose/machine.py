"""What ``onnxport doctor`` prints: this machine's versions and CPU (:mod:`onnxport.runtime.environment`), the
providers onnxruntime lists and those it cannot start, whether TensorRT's and cuDNN's libraries load, CUDA, and the
newest opset each exporter and onnxruntime take."""

from __future__ import annotations

from onnxport.exporters.opsets import exporter_max_opset, onnxruntime_max_opset
from onnxport.runtime.environment import summary
from onnxport.runtime.libraries import Probe, gpu_libraries
from onnxport.runtime.sessions import unloadable_providers


def doctor(*, probe: Probe | None = None, available: list[str] | None = None) -> dict:
    """Everything ``onnxport doctor`` prints. ``gpu_libraries``: whether TensorRT's and cuDNN's libraries load
    (``probe``: a simulated library probe in tests); ``providers_unloadable``: one line per provider
    onnxruntime lists but cannot start (``available``: a simulated provider list)."""
    data = summary()
    if available is None:
        try:
            import onnxruntime as ort

            available = list(ort.get_available_providers())
        except ImportError:
            available = []
    data["providers"] = list(available)
    libraries = gpu_libraries(probe)
    data["gpu_libraries"] = {kind: lib.to_dict() for kind, lib in libraries.items()}
    data["gpu_libraries_summary"] = "; ".join(lib.line() for lib in libraries.values())
    data["providers_unloadable"] = list(unloadable_providers(available, probe).values())
    try:
        import torch

        data["cuda_available"] = bool(torch.cuda.is_available())
    except ImportError:
        data["cuda_available"] = False
    data["max_opset"] = {
        "dynamo_exporter": exporter_max_opset("dynamo"),
        "torchscript_exporter": exporter_max_opset("torchscript"),
        "onnxruntime": onnxruntime_max_opset(),
    }
    return data
