"""Layer 5: optimized variants (slim, ort, fused, fp16, int8; on a GPU also tf32, tensorrt, cuda-graph), each
re-proven against PyTorch, and the choice of the best.

Modules: :mod:`~onnxport.optimize.result` (records), :mod:`~onnxport.optimize.context` (what builders get and
return), :mod:`~onnxport.optimize.graph` (slim, ort), :mod:`~onnxport.optimize.fusion` (fused),
:mod:`~onnxport.optimize.precision` (fp16), :mod:`~onnxport.optimize.quantize` and
:mod:`~onnxport.optimize.sensitivity` (int8), :mod:`~onnxport.optimize.policy` (tolerance policy, task metrics,
proof), :mod:`~onnxport.optimize.gpu` (tf32, tensorrt, cuda-graph and the session options each variant records)
and :mod:`~onnxport.optimize.choice` (timing and the choice of the best).
"""

from onnxport.optimize.choice import select_best, variants
from onnxport.optimize.gpu import GraphSessions, gpu_options_for, needs_fixed_shapes, open_for, providers_for
from onnxport.optimize.result import (
    ALL_VARIANTS,
    BASELINE,
    GPU_VARIANTS,
    VARIANTS,
    Metric,
    OptimizeResult,
    Variant,
    parse_names,
)

__all__ = ["ALL_VARIANTS", "BASELINE", "GPU_VARIANTS", "VARIANTS", "GraphSessions", "Metric", "OptimizeResult", "Variant", "gpu_options_for",
           "needs_fixed_shapes", "open_for", "parse_names", "providers_for", "select_best", "variants"]
