"""Model sources: turn a SOURCE string into a LoadedModel (DESIGN.md "SOURCE forms")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..diagnostics import Diagnostic
from ..errors import SourceError, UsageError
from ..samples import export_sizes, make_inputs
from ..spec import Dim, InputSpec, merge_dims
from .base import LoadedModel, count_parameters, integer_range, make_flat, output_names, to_eval

__all__ = ["LoadedModel", "load", "finish"]


def parse_model_args(text: str | None) -> dict[str, Any]:
    """Parse ``--model-args`` JSON (an object of constructor keyword arguments)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--model-args is not valid JSON: {e.msg} at column {e.colno}",
                         """write a JSON object, e.g. '{"vocab_size": 30000}'""") from None
    if not isinstance(value, dict):
        raise UsageError("--model-args must be a JSON object", """write e.g. '{"num_classes": 10}'""")
    return value


def load(source: str, *, inputs: list[InputSpec] | None = None, dims: list[Dim] | None = None,
         model_args: dict[str, Any] | None = None, weights: str | None = None, task: str | None = None,
         trust_remote_code: bool = False, seed: int = 0) -> LoadedModel:
    """Load ``source`` into a LoadedModel (eval mode, input specs, dims, flat wrapper).

    The torch RNG is seeded first, so a model built with random weights is the same on every run.
    """
    torch.manual_seed(seed)
    inputs = list(inputs or [])
    dims = list(dims or [])
    model_args = dict(model_args or {})
    if (model_args or weights) and not _is_python_source(source):
        raise UsageError("--model-args and --weights apply to 'file.py:Name' and 'package.module:factory' sources",
                         "drop them, or point SOURCE at the Python class that builds the model")
    if source.startswith("torchvision:"):
        from .vision import load_torchvision
        return load_torchvision(source, inputs, dims)
    if source.startswith("timm:"):
        from .vision import load_timm
        return load_timm(source, inputs, dims)
    if source.startswith("hf:"):
        from .hf import load_hf
        return load_hf(source, inputs, dims, task=task, trust_remote_code=trust_remote_code)
    if source.endswith(".pt2"):
        from .serialized import load_exported_program
        return load_exported_program(source, inputs, dims)
    if _is_python_source(source):
        from .python import load_python
        return load_python(source, inputs, dims, model_args, weights)
    if source.endswith((".pt", ".pth", ".ts", ".jit")):
        from .serialized import load_torchscript
        return load_torchscript(source, inputs, dims)
    p = Path(source)
    if p.is_dir() and (p / "config.json").is_file():
        from .hf import load_hf
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


def finish(source: str, name: str, kind: str, model: nn.Module, specs: list[InputSpec], declared: list[Dim],
           defaults: dict[str, Dim] | None = None, diagnostics: tuple[Diagnostic, ...] = (),
           extra: dict[str, Any] | None = None, ranges: dict[str, tuple[int, int]] | None = None,
           built_here: bool = False) -> LoadedModel:
    """Common tail of every source: eval mode, value ranges, dims, wrapper, output names."""
    if not specs:
        raise UsageError(
            f"{source} needs --input: onnxport cannot infer the inputs of this model",
            "describe each forward() input, e.g. -i 'x:float32[batch,16]' -d batch=1..64",
        )
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise UsageError("two --input entries share a name", "give every input a distinct NAME")
    diags = tuple(diagnostics) + to_eval(model, name, built_here)
    ranges = ranges or {}
    fixed: list[InputSpec] = []
    for s in specs:
        if s.value_range is None and s.dtype != "bool" and not s.dtype.startswith("float") and s.dtype != "bfloat16":
            s = InputSpec(s.name, s.dtype, s.shape, ranges.get(s.name) or integer_range(model, s))
        fixed.append(s)
    spec_t = tuple(fixed)
    resolved = merge_dims(list(spec_t), declared, defaults)
    flat = make_flat(model, spec_t)
    example = make_inputs(spec_t, export_sizes(resolved), seed=0)
    try:
        outs = output_names(flat, example)
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - a model that cannot run on its own inputs
        first = " ".join(str(e).split())[:300]
        if isinstance(e, IndexError) and "index out of range" in first:
            raise _out_of_range(model, spec_t) from None
        raise UsageError(
            f"the model fails on the example inputs ({', '.join(str(s) for s in spec_t)}): {type(e).__name__}: {first}",
            "check --input names, dtypes and fixed sizes against forward(), and --dim ranges",
        ) from None
    _preflight(flat, spec_t, resolved)
    return LoadedModel(
        source=source, name=name, kind=kind, model=model, flat=flat, inputs=spec_t, dims=resolved,
        output_names=outs, parameters=count_parameters(model), diagnostics=diags, extra=dict(extra or {}),
    )


def _out_of_range(model: nn.Module, specs: tuple[InputSpec, ...]) -> UsageError:
    """The integer inputs' value ranges exceed an Embedding's rows: name both."""
    emb = [(n, m.num_embeddings) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    ints = [s for s in specs if s.value_range is not None]
    where = ", ".join(f"{n} ({k} rows, ids 0..{k - 1})" for n, k in emb[:3]) or "an index-taking op"
    ranges = ", ".join(f"'{s.name}' {{{s.value_range[0]}..{s.value_range[1]}}}" for s in ints)
    err = UsageError(f"integer inputs {ranges} index past {where}",
                     "give the input the range the model accepts, e.g. -i 'input_ids:int64[batch,seq]{0..N-1}' "
                     "with N the embedding's size")
    err.code = "int-out-of-range"
    return err


def _preflight(flat: nn.Module, specs: tuple[InputSpec, ...], dims: dict[str, Dim]) -> None:
    """Vary each dynamic dim once at a small size: a dim the model cannot vary is a usage error."""
    base = export_sizes(dims)
    for sym, d in dims.items():
        if d.min == d.max:
            continue
        alt = d.min if d.min != base[sym] else min(base[sym] + 1, d.max)
        sizes = dict(base, **{sym: alt})
        try:
            with torch.inference_mode():
                flat(*make_inputs(specs, sizes, seed=0))
        except Exception as e:  # noqa: BLE001
            first = " ".join(str(e).split())[:200]
            where = ", ".join(f"'{s.name}' axis {s.shape.index(sym)}" for s in specs if sym in s.shape)
            raise UsageError(
                f"dim '{sym}' ({where}) cannot vary: the PyTorch model fails with {sym}={alt} "
                f"but runs with {sym}={base[sym]} ({type(e).__name__}: {first})",
                f"give that axis a fixed size in --input (e.g. {base[sym]}) or narrow the range with --dim",
            ) from None


def declared_or(inputs: list[InputSpec], default: list[InputSpec]) -> list[InputSpec]:
    """User --input wins over the inputs a source infers."""
    return inputs if inputs else default


def ensure_module(obj: Any, where: str) -> nn.Module:
    if isinstance(obj, nn.Module):
        return obj
    raise SourceError(f"{where} gave a {type(obj).__name__}, not a torch.nn.Module",
                      "point SOURCE at an nn.Module class or a function that returns one")

