"""Layer 5: optimized variants (slim, ort, fused, fp16, int8), each re-proven against PyTorch, and the choice
of the best.

Modules: :mod:`~onnxport.optimize.result` (records), :mod:`~onnxport.optimize.context` (what builders get and
return), :mod:`~onnxport.optimize.graph` (slim, ort), :mod:`~onnxport.optimize.fusion` (fused),
:mod:`~onnxport.optimize.precision` (fp16), :mod:`~onnxport.optimize.quantize` and
:mod:`~onnxport.optimize.sensitivity` (int8), :mod:`~onnxport.optimize.policy` (tolerance policy, task metrics,
proof) and :mod:`~onnxport.optimize.choice` (timing and the choice of the best).
"""

from onnxport.optimize.choice import select_best, variants
from onnxport.optimize.result import BASELINE, VARIANTS, Metric, OptimizeResult, Variant, parse_names

__all__ = ["BASELINE", "VARIANTS", "Metric", "OptimizeResult", "Variant", "parse_names", "select_best", "variants"]
