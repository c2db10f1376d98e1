"""Custom operators, the public names in one place (docs/custom_ops.md; ``onnxport.custom_ops`` is the same module).

Export side (:mod:`onnxport.exporters.functions`): ``autograd.Function`` subclasses with a ``symbolic`` are
discovered by running the model once and exported as the node their ``symbolic`` emits, by both exporters.
Runtime side (:mod:`onnxport.runtime.ops`): compiled custom-op libraries and Python implementations that every
ONNX Runtime session onnxport opens loads.
"""

from onnxport.exporters.functions import CustomFunction, discover, discover_loaded, opaque, translation_table
from onnxport.runtime.ops import (
    ORTX_DOMAIN,
    add_library,
    import_implementations,
    libraries,
    model_custom_ops,
    ort_python_op,
    prepare_session,
    python_ops,
    python_ops_suspended,
    reset,
)

__all__ = ["ORTX_DOMAIN", "CustomFunction", "add_library", "discover", "discover_loaded", "import_implementations",
           "libraries", "model_custom_ops", "opaque", "ort_python_op", "prepare_session", "python_ops", "python_ops_suspended", "reset",
           "translation_table"]
