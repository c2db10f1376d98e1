"""Layer 1: ONNX Runtime sessions and providers, custom-op implementations, the Backend protocol and feeds."""

from onnxport.runtime.libraries import LibraryStatus, cudnn_loadable, gpu_libraries, tensorrt_loadable
from onnxport.runtime.sessions import (
    CPU,
    CUDA,
    DEVICES,
    GPU_INSTALL_HINT,
    OPT_LEVELS,
    TENSORRT,
    BoundRunner,
    GpuOptions,
    OnDevice,
    Placement,
    RuntimeConfig,
    available_providers,
    check_device,
    config,
    configure,
    default_providers,
    loaded_on_device,
    parse_placement,
    placement,
    placement_from,
    provider_chain,
    provider_names,
    session,
    strict_fp32,
    unloadable_providers,
)

__all__ = [
    "CPU", "CUDA", "DEVICES", "GPU_INSTALL_HINT", "OPT_LEVELS", "TENSORRT", "BoundRunner", "GpuOptions", "OnDevice",
    "Placement", "RuntimeConfig", "available_providers", "check_device", "config", "configure", "default_providers",
    "loaded_on_device", "parse_placement", "placement", "placement_from", "provider_chain", "provider_names",
    "session", "strict_fp32", "unloadable_providers", "LibraryStatus", "cudnn_loadable", "gpu_libraries",
    "tensorrt_loadable",
]
