"""onnxport: PyTorch to ONNX, exported, proven against PyTorch, and explained when it is not."""

from __future__ import annotations

__version__ = "0.1.0"

from .api import benchmark, check_file, compare_file, convert, export, load_model, optimize_file  # noqa: E402
from .errors import (  # noqa: E402
    EnvironmentProblem,
    ExportFailed,
    OnnxportError,
    SourceError,
    UsageError,
    ValidationFailed,
)
from .parity import Tolerance  # noqa: E402
from .spec import Dim, InputSpec, parse_dim, parse_input  # noqa: E402

__all__ = [
    "__version__", "convert", "export", "compare_file", "benchmark", "optimize_file", "check_file", "load_model", "Tolerance", "InputSpec", "Dim",
    "parse_input", "parse_dim", "OnnxportError", "UsageError", "SourceError", "ExportFailed",
    "ValidationFailed", "EnvironmentProblem",
]
