"""Layer 1: ONNX Runtime sessions and providers, how a variant's file is run (its recorded session options),
custom-op implementations, the Backend protocol and feeds."""

from onnxport.runtime.libraries import LibraryStatus, cudnn_loadable, gpu_libraries, tensorrt_loadable
from onnxport.runtime.openvino import OPENVINO, OpenVinoSession, bf16_missing, openvino_missing
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
    available_providers,
    check_device,
    loaded_on_device,
    parse_placement,
    placement,
    placement_from,
    provider_chain,
    provider_names,
    runtime_providers,
    session,
    strict_fp32,
    unloadable_providers,
)
from onnxport.runtime.variant_sessions import (
    GraphSessions,
    SessionBackend,
    SessionOptions,
    gpu_options_for,
    graph_blocker,
    is_openvino,
    memcpy_nodes,
    needs_fixed_shapes,
    open_for,
    providers_for,
    without_cuda_graph,
)

__all__ = [
    "CPU", "CUDA", "DEVICES", "GPU_INSTALL_HINT", "OPT_LEVELS", "TENSORRT", "BoundRunner", "GpuOptions", "OnDevice",
    "Placement", "available_providers", "check_device", "loaded_on_device", "parse_placement", "placement",
    "placement_from", "provider_chain", "provider_names", "runtime_providers", "session", "strict_fp32",
    "unloadable_providers", "LibraryStatus", "cudnn_loadable", "gpu_libraries", "tensorrt_loadable",
    "GraphSessions", "SessionBackend", "SessionOptions", "gpu_options_for", "graph_blocker", "is_openvino",
    "memcpy_nodes", "needs_fixed_shapes", "open_for", "providers_for", "without_cuda_graph",
    "OPENVINO", "OpenVinoSession", "bf16_missing", "openvino_missing",
]
