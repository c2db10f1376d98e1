"""onnxport: PyTorch to ONNX, exported, proven against PyTorch, and explained when it is not."""

from __future__ import annotations

import importlib
from typing import Any

from onnxport.core.version import __version__

_WHERE = {
    **dict.fromkeys(("benchmark", "check_file", "compare_file", "convert", "export", "load_model", "optimize_file"),
                    "onnxport.api"),
    **dict.fromkeys(("EnvironmentProblem", "ExportFailed", "OnnxportError", "SourceError", "UsageError",
                     "ValidationFailed"), "onnxport.core.errors"),
    **dict.fromkeys(("BenchOptions", "ExportOptions", "GpuOptions", "LoadOptions", "OptimizeOptions", "Options",
                     "ProofOptions", "RuntimeOptions"), "onnxport.core.options"),
    "Tolerance": "onnxport.core.records",
    **dict.fromkeys(("Dim", "InputSpec", "parse_dim", "parse_input"), "onnxport.core.spec"),
}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (``import onnxport`` stays light: the command line handles
    Ctrl-C before torch is imported)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'onnxport' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


__all__ = [
    "__version__", "convert", "export", "compare_file", "benchmark", "optimize_file", "check_file", "load_model",
    "Tolerance", "InputSpec", "Dim", "parse_input", "parse_dim", "OnnxportError", "UsageError", "SourceError",
    "ExportFailed", "ValidationFailed", "EnvironmentProblem", "Options", "LoadOptions", "ExportOptions",
    "ProofOptions", "OptimizeOptions", "BenchOptions", "RuntimeOptions", "GpuOptions",
]
