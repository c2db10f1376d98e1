"""Serialized models: TorchScript ``model.pt`` and ExportedProgram ``model.pt2``."""

from __future__ import annotations

from pathlib import Path

import torch

from onnxport.core.errors import SourceError
from onnxport.core.spec import Dim, InputSpec, normalize_dtype
from onnxport.sources.base import LoadedModel
from onnxport.sources.finish import Finishing, declared_or, finish

_UNBOUNDED = 4096


def load_torchscript(source: str, inputs: list[InputSpec], dims: list[Dim]) -> LoadedModel:
    path = Path(source)
    if not path.is_file():
        raise SourceError(f"model file not found: {path}", "check the path")
    try:
        model = torch.jit.load(str(path), map_location="cpu")
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        hint = ("a state_dict is not a model: use 'file.py:Class --weights " + str(path) + "'"
                if _is_state_dict(path) else
                "save TorchScript with torch.jit.save(torch.jit.script(model), path); a whole pickled module "
                "(torch.save(model)) is not loaded, for safety: use 'file.py:Class --weights' with its state_dict")
        raise SourceError(f"{path} is not a TorchScript model ({msg})", hint) from None
    return finish(source, path.stem, "torchscript", model, inputs, dims)


def _is_state_dict(path: Path) -> bool:
    """True when ``path`` holds a dict of tensors (read safely, weights_only)."""
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - not loadable safely: not a plain state_dict
        return False
    if isinstance(obj, dict) and any(k in obj for k in ("state_dict", "model_state_dict", "model")):
        obj = next(obj[k] for k in ("state_dict", "model_state_dict", "model") if k in obj)
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def load_exported_program(source: str, inputs: list[InputSpec], dims: list[Dim]) -> LoadedModel:
    path = Path(source)
    if not path.is_file():
        raise SourceError(f"model file not found: {path}", "check the path")
    try:
        ep = torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001
        raise SourceError(f"{path} is not an ExportedProgram: {str(e).splitlines()[0][:200]}",
                          "save it with torch.export.save(torch.export.export(model, args), path)") from None
    specs, defaults = _ep_inputs(ep)
    model = ep.module()
    return finish(source, path.stem, "exported_program", model, declared_or(inputs, specs), dims,
                  Finishing(defaults=defaults, extra={"exported_program": ep}))


def _ep_inputs(ep) -> tuple[list[InputSpec], dict[str, Dim]]:
    """Input specs and dim ranges from the ExportedProgram's user inputs and range constraints."""
    user = set(ep.graph_signature.user_inputs)
    specs: list[InputSpec] = []
    defaults: dict[str, Dim] = {}
    names: dict[str, str] = {}  # torch's symbols (s0, s77) -> readable names: batch, <input>_dim<axis>
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        shape: list[int | str] = []
        for axis, size in enumerate(val.shape):
            if isinstance(size, int):
                shape.append(size)
                continue
            expr = size.node.expr
            if str(expr) not in names:
                names[str(expr)] = "batch" if axis == 0 and "batch" not in names.values() else f"{node.name}_dim{axis}"
            sym = names[str(expr)]
            rng = ep.range_constraints.get(expr)
            lo = int(rng.lower) if rng is not None and rng.lower.is_finite else 1
            hi = int(rng.upper) if rng is not None and rng.upper.is_finite else _UNBOUNDED
            hint = size.node.hint if size.node.hint is not None else None
            defaults[sym] = Dim(sym, max(lo, 1), min(hi, _UNBOUNDED), hint)
            shape.append(sym)
        specs.append(InputSpec(node.name, normalize_dtype(str(val.dtype)), tuple(shape)))
    return specs, defaults
