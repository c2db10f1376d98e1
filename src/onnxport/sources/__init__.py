"""Model sources: turn a SOURCE string into a LoadedModel (the SOURCE forms of the README's command-line section)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxport.core.errors import UsageError
from onnxport.core.options import parse_model_args
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.paths import python_file

if TYPE_CHECKING:
    from onnxport.sources.base import LoadedModel

__all__ = ["LoadedModel", "check_files", "load", "parse_model_args"]


def __getattr__(name: str) -> Any:
    """``LoadedModel``, imported on first use (this package imports no torch until a model is loaded)."""
    if name == "LoadedModel":
        from onnxport.sources.base import LoadedModel

        return LoadedModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_files(source: str) -> None:
    """What can be said of ``source`` before torch is imported: the file of a ``file.py:Name`` source exists."""
    if _is_python_source(source) and source.rsplit(":", 1)[0].endswith(".py"):
        python_file(source.rsplit(":", 1)[0])


def load(source: str, *, inputs: list[InputSpec] | None = None, dims: list[Dim] | None = None,
         model_args: dict[str, Any] | None = None, weights: str | None = None, task: str | None = None,
         trust_remote_code: bool = False, seed: int = 0) -> LoadedModel:
    """Load ``source`` into a LoadedModel (eval mode, input specs, dims, flat wrapper).

    The torch RNG is seeded first, so a model built with random weights is the same on every run.
    """
    import torch

    torch.manual_seed(seed)
    inputs = list(inputs or [])
    dims = list(dims or [])
    model_args = dict(model_args or {})
    if (model_args or weights) and not _is_python_source(source):
        raise UsageError("--model-args and --weights apply to 'file.py:Name' and 'package.module:factory' sources",
                         "drop them, or point SOURCE at the Python class that builds the model")
    if source.startswith("torchvision:"):
        from onnxport.sources.vision import load_torchvision
        return load_torchvision(source, inputs, dims)
    if source.startswith("timm:"):
        from onnxport.sources.vision import load_timm
        return load_timm(source, inputs, dims)
    if source.startswith("hf:"):
        from onnxport.sources.hf import load_hf
        return load_hf(source, inputs, dims, task=task, trust_remote_code=trust_remote_code)
    if source.endswith(".pt2"):
        from onnxport.sources.serialized import load_exported_program
        return load_exported_program(source, inputs, dims)
    if _is_python_source(source):
        from onnxport.sources.python import load_python
        return load_python(source, inputs, dims, model_args, weights)
    if source.endswith((".pt", ".pth", ".ts", ".jit")):
        from onnxport.sources.serialized import load_torchscript
        return load_torchscript(source, inputs, dims)
    p = Path(source)
    if p.is_dir() and (p / "config.json").is_file():
        from onnxport.sources.hf import load_hf
        return load_hf("hf:" + source, inputs, dims, task=task, trust_remote_code=trust_remote_code)
    raise UsageError(
        f"cannot tell what kind of model source '{source}' is",
        "use file.py:Class, package.module:factory, torchvision:NAME, timm:NAME, hf:DIR, model.pt or model.pt2",
    )


def _is_python_source(source: str) -> bool:
    if ":" not in source or source.split(":", 1)[0] in ("torchvision", "timm", "hf"):
        return False
    left, right = source.rsplit(":", 1)
    return bool(right) and (left.endswith(".py") or all(p.isidentifier() for p in left.split(".")))











