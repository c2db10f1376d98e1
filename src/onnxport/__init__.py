"""onnxport: PyTorch to ONNX, exported, proven against PyTorch, and explained when it is not."""

from __future__ import annotations

from onnxport.api import benchmark, check_file, compare_file, convert, export, load_model, optimize_file
from onnxport.core.errors import (
    EnvironmentProblem,
    ExportFailed,
    OnnxportError,
    SourceError,
    UsageError,
    ValidationFailed,
)
from onnxport.core.options import (
    BenchOptions,
    ExportOptions,
    GpuOptions,
    LoadOptions,
    OptimizeOptions,
    Options,
    ProofOptions,
    RuntimeOptions,
)
from onnxport.core.records import Tolerance
from onnxport.core.spec import Dim, InputSpec, parse_dim, parse_input
from onnxport.core.version import __version__

__all__ = [
    "__version__", "convert", "export", "compare_file", "benchmark", "optimize_file", "check_file", "load_model",
    "Tolerance", "InputSpec", "Dim", "parse_input", "parse_dim", "OnnxportError", "UsageError", "SourceError",
    "ExportFailed", "ValidationFailed", "EnvironmentProblem", "Options", "LoadOptions", "ExportOptions",
    "ProofOptions", "OptimizeOptions", "BenchOptions", "RuntimeOptions", "GpuOptions",
]
