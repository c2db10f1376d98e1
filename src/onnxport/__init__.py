"""onnxport: PyTorch to ONNX, exported, proven against PyTorch, and explained when it is not."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
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


# Modules that moved into a package, still importable where the documentation told users to import them
# (``from onnxport.custom_ops import ort_python_op``, ``onnxport.deploy.triton_repository``): the same module
# object under both names, imported on first use.
_MOVED = {"custom_ops": "onnxport.exporters.custom_ops", "deploy": "onnxport.serve.repository"}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``onnxport.<old name>`` of :data:`_MOVED` and loads it as the module at its new place."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        old = fullname.removeprefix(f"{__name__}.")
        return importlib.util.spec_from_loader(fullname, self) if old in _MOVED and old != fullname else None

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(_MOVED[spec.name.removeprefix(f"{__name__}.")])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at its new place is imported already."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (``import onnxport`` stays light: the command line handles
    Ctrl-C before torch is imported)."""
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{name}")
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
