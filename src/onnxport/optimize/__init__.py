"""Layer 5: optimized variants (slim, ort, fused, fp16, int8; on a GPU also tf32, fp16-nhwc, fp16-sdpa, tensorrt, cuda-graph), each
re-proven against PyTorch, and the choice of the best.

Modules: :mod:`~onnxport.optimize.result` (records), :mod:`~onnxport.optimize.context` (what builders get and
return), :mod:`~onnxport.optimize.graph` (slim, ort), :mod:`~onnxport.optimize.fusion` (fused),
:mod:`~onnxport.optimize.precision` (fp16), :mod:`~onnxport.optimize.quantize` and
:mod:`~onnxport.optimize.sensitivity` (int8), :mod:`~onnxport.optimize.policy` (tolerance policy, task metrics,
proof), :mod:`~onnxport.optimize.gpu` (tf32, fp16-nhwc, fp16-sdpa, tensorrt, cuda-graph and the session options each variant records; how
they are run: :mod:`onnxport.runtime.variant_sessions`)
and :mod:`~onnxport.optimize.choice` (timing and the choice of the best); :mod:`~onnxport.optimize.registry` (the
builders of every model kind and each kind's judge), :mod:`~onnxport.optimize.passes` (what every kind's variants
share: build, budget, the choice rule, best.onnx) and :mod:`~onnxport.optimize.gates` (the metric gates).
"""

from onnxport.optimize.choice import VariantOptions, select_best, variants
from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.optimize.gates import GATES, Gates
from onnxport.optimize.passes import MIN_GAIN, Budget, build_into, clearly_faster, each_variant, install_best
from onnxport.optimize.registry import MODEL, declare, register, register_judge
from onnxport.optimize.result import (
    ALL_VARIANTS,
    BASELINE,
    GPU_VARIANTS,
    VARIANTS,
    Metric,
    OptimizeResult,
    SkipReason,
    Variant,
    parse_names,
)
from onnxport.runtime.variant_sessions import (  # re-exported: how a variant's file is run lives in runtime
    GraphSessions,
    SessionBackend,
    gpu_options_for,
    needs_fixed_shapes,
    open_for,
    providers_for,
)

__all__ = ["ALL_VARIANTS", "BASELINE", "GATES", "GPU_VARIANTS", "MIN_GAIN", "MODEL", "VARIANTS", "Budget",
           "BuildContext", "BuildOutcome", "Gates", "Skip", "SkipReason", "build_into", "clearly_faster",
           "declare", "each_variant", "install_best", "register", "register_judge", "GraphSessions", "Metric", "OptimizeResult", "SessionBackend", "Variant",
           "gpu_options_for", "needs_fixed_shapes", "open_for", "parse_names", "providers_for", "select_best", "variants", "VariantOptions"]
