"""The export strategies: dynamo, TorchScript, and the control-flow ones (cond, script).

Each takes the loaded model, the target path, the opset, whether weights go to external data and the user
source lines where an earlier attempt froze or failed; it writes the file and returns its diagnostics, or
raises (``NotApplicable`` when it has nothing to do for this model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import tempfile
import weakref
from pathlib import Path

import onnx
import torch
from torch import nn

from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.onnxfile import save_model
from onnxport.core.options import CONTROL_FLOW_EXPORTERS, EXPORTER_CHOICES, PLAIN_EXPORTERS
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.core.signals import OverCpuLimit, cpu_limit
from onnxport.core.spec import Dim
from onnxport.exporters import controlflow, functions, packed
from onnxport.sources.base import LoadedModel

# the exporters' names live with the options that name them (an unknown --exporter is refused before torch loads)
EXPORTERS = PLAIN_EXPORTERS  # the plain exporters, tried first
CONTROL_FLOW = CONTROL_FLOW_EXPORTERS  # tried by auto when the plain ones fail or freeze a branch or loop
CHOICES = EXPORTER_CHOICES


RESIZED = "dynamo-resized"
AUTO_OVER_LIMIT = "the Dim.AUTO retry passed its CPU-time limit"
_AUTO_SPENT: weakref.WeakSet = weakref.WeakSet()  # the models whose Dim.AUTO retry ran out: not retried again
DYNAMO_CPU_LIMIT = 240.0  # a dynamo export's CPU seconds: RAFT's took 1,240 s, NASNet-A Large's (proven) 210
DYNAMO_OVER_LIMIT = "passed its CPU-time limit"
_TOO_SLOW: weakref.WeakSet = weakref.WeakSet()  # the models whose dynamo export ran out: no dynamo attempt again
AUTO_CPU_LIMIT = 90.0  # the Dim.AUTO retry's CPU seconds: torch.export's shape reasoning on Swin's padding takes many minutes
"""The dynamo exporter again at other example sizes (:func:`resized_sizes`; tried by auto, never chosen by name)."""


BASE_EXPORTER = {"dynamo": "dynamo", "torchscript": "torchscript", "cond": "dynamo", "script": "torchscript",
                 "scan": "dynamo", RESIZED: "dynamo"}


def _dim_objects(loaded: LoadedModel, auto: bool = False) -> tuple:
    """torch.export's dynamic_shapes for the declared dims; ``auto``: Dim.AUTO for each, torch.export then
    derives the relations between sizes (a multiple of 256, one side from another) itself."""
    dims = {}
    for sym, d in loaded.dims.items():
        step = _step(d)
        if auto and d.min != d.max:
            dims[sym] = _auto(d)
        elif step > 1:  # the sizes are the multiples of a step: a derived dim, so torch.export needs no second trace
            dims[sym] = step * torch.export.Dim(f"_{sym}", min=d.min // step, max=d.max // step)
        elif d.min != d.max:
            dims[sym] = torch.export.Dim(sym, min=d.min, max=d.max)
    shapes = []
    for spec in loaded.inputs:
        axes = {i: dims[d] for i, d in enumerate(spec.shape) if isinstance(d, str) and d in dims}
        shapes.append(axes or None)
    return tuple(shapes)


def resized_sizes(dims: dict[str, Dim]) -> dict[str, int] | None:
    """Other example sizes for the dynamo exporter: per dynamic dim a size the dim allows, not 1, odd and not a
    multiple of 3, 5 or 7 where the range has one (so size tests and divisibility checks take their general
    path), near the middle of the range and distinct across dims; None when that changes no size."""
    first = export_sizes(dims)
    out: dict[str, int] = {}
    taken: set[int] = set()
    for sym, d in dims.items():
        if d.min == d.max:
            out[sym] = first[sym]
            continue
        allowed = list(d.sizes) if d.sizes else range(max(d.min, 2), d.max + 1)
        middle = math.sqrt(max(d.min, 2) * d.max)

        def rank(n: int, middle: float = middle, own: int = first[sym]) -> tuple:
            plain = n % 2 and all(n % p for p in (3, 5, 7) if n != p)
            return (n == own or n in taken, not plain, abs(math.log(n / middle)))

        best = min((n for n in allowed if n >= 2), key=rank, default=first[sym])
        out[sym] = best
        taken.add(best)
    return out if out != first else None


def _export_dynamo_resized(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    """The dynamo exporter at :func:`resized_sizes`."""
    sizes = resized_sizes(loaded.dims)
    if sizes is None:
        raise NotApplicable("no other example sizes in the declared ranges")
    return _export_dynamo(loaded, path, opset, external, lines, sizes=sizes)


def _auto(d: Dim):
    """Dim.AUTO within the declared range (where this torch bounds hints; unbounded before)."""
    try:
        return torch.export.Dim.AUTO(min=d.min, max=d.max)
    except TypeError:
        return torch.export.Dim.AUTO


def _step(d: Dim) -> int:
    """The step of a dim whose sizes are every multiple of it from min to max (1 otherwise)."""
    if not d.sizes or len(d.sizes) < 2:
        return 1
    step = d.sizes[1] - d.sizes[0]
    ok = step > 1 and d.min % step == 0 and d.sizes == tuple(range(d.min, d.max + 1, step))
    return step if ok else 1


def _export_dynamo(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=(),
                   sizes: dict[str, int] | None = None) -> list[Diagnostic]:
    example = make_inputs(loaded.inputs, sizes or export_sizes(loaded.dims), seed=0)
    customs = functions.discover_loaded(loaded)  # autograd.Functions with symbolic(): opaque ops + translations
    torch._logging.set_logs(dynamic=logging.INFO)  # guard log lines name the user code that fixed a shape
    notes: list[Diagnostic] = []
    try:
        with functions.opaque(customs), packed.applied(loaded, opset) as rewrite:  # packed sequences: ONNX RNNs
            def run(auto: bool):
                return torch.onnx.export(
                    loaded.flat, example, dynamo=True, dynamic_shapes=_dim_objects(loaded, auto),
                    input_names=[s.name for s in loaded.inputs], output_names=list(loaded.output_names),
                    opset_version=opset, optimize=True, verbose=False,
                    custom_translation_table={**functions.translation_table(customs, opset), **rewrite.table} or None,
                )
            if loaded.flat in _TOO_SLOW:  # an earlier dynamo attempt of this chain ran out of time
                raise RuntimeError(f"torch.export {DYNAMO_OVER_LIMIT} in an earlier attempt")
            try:
                with cpu_limit(DYNAMO_CPU_LIMIT):
                    program = run(auto=False)
            except OverCpuLimit:
                _TOO_SLOW.add(loaded.flat)
                raise RuntimeError(f"torch.export {DYNAMO_OVER_LIMIT} ({DYNAMO_CPU_LIMIT:.0f}); the next exporter "
                                   "is tried") from None
            except Exception as e:
                refused = dims_refused(e)
                if refused is None:
                    raise
                if loaded.flat in _AUTO_SPENT:  # an earlier attempt of this chain ran out of time there
                    e.add_note(AUTO_OVER_LIMIT)
                    raise e from None
                try:
                    with cpu_limit(AUTO_CPU_LIMIT):  # torch.export derives the relations between sizes itself
                        program = run(auto=True)
                except OverCpuLimit:  # said, so that no later dynamo attempt spends it again
                    _AUTO_SPENT.add(loaded.flat)
                    e.add_note(AUTO_OVER_LIMIT)
                    raise e from None
                except Exception:  # noqa: BLE001 - the first refusal is the one to report
                    raise e from None
                notes.append(info("dynamo-dims-auto", f"torch.export refused the declared dims ({refused}); "
                                  "exported with Dim.AUTO, torch.export deriving the relations between sizes "
                                  "itself, and proven at the declared sizes"))
    finally:
        torch._logging.set_logs()
    program.save(str(path), external_data=external)
    return notes + narrowed_dims(loaded, getattr(program, "exported_program", None)) + rewrite.diagnostics


_RELATION = re.compile(r"^\s*\w+ = \d+\*\w+|^\s*\w+ = \w+ [+-] \d+", re.M)  # height = 256*_height


def dims_refused(e: BaseException) -> str | None:
    """The line where torch.export refused the declared dims for a relation the model's code puts between sizes
    (a side a multiple of 256, one side from another: its suggested fixes derive a dim, or it fails building
    one), None for any other failure (a dim it specialized to a constant is the proof's to catch)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if "Cannot create Dim" in text or "Constraints violated" in text and _RELATION.search(text):
            mark = "Cannot create Dim" if "Cannot create Dim" in text else "Constraints violated"
            return next((ln.strip() for ln in text.splitlines() if mark in ln), mark)[:200]
        e = e.__cause__ or e.__context__
    return None


def narrowed_dims(loaded: LoadedModel, ep) -> list[Diagnostic]:
    """Dims whose range torch.export narrowed (a guard on a shape): ONNX keeps no guards, so the graph is
    only valid inside the narrowed range while it claims to accept the declared one."""
    if ep is None:
        return []
    out: list[Diagnostic] = []
    user = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in set(ep.graph_signature.user_inputs)]
    reported: set[str] = set()
    for spec, node in zip(loaded.inputs, user):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for axis, size in enumerate(val.shape):
            sym = spec.shape[axis] if axis < len(spec.shape) else None
            if not isinstance(sym, str) or sym in reported or isinstance(size, int):
                continue
            rng = ep.range_constraints.get(size.node.expr)
            if rng is None:
                continue
            declared = loaded.dims[sym]
            lo = int(rng.lower) if rng.lower.is_finite else declared.min
            hi = int(rng.upper) if rng.upper.is_finite else declared.max
            if lo > declared.min or hi < declared.max:
                reported.add(sym)
                out.append(warning(
                    "dynamic-dim-narrowed",
                    f"torch.export assumed {sym} in {lo}..{hi} (declared {declared.min}..{declared.max}): a shape "
                    f"test in the model chose one path for that range, and the ONNX graph keeps no such guard",
                    hint=f"sizes of {sym} outside {lo}..{hi} will take the wrong path in ONNX; express the shape "
                         "branch with torch.cond or tensor ops, or narrow --dim to the range the model really needs",
                ))
    return out


FUSED = (nn.TransformerEncoder, nn.TransformerEncoderLayer, nn.MultiheadAttention)  # inference fast paths


def trace_grad(model: nn.Module) -> contextlib.AbstractContextManager:
    """The autograd mode to trace ``model`` in: off, so that the trace keeps no activations for a backward pass
    (SAM's ViT at batch 2 and 1024 x 1024 held 14 GiB with it on), unless the model has a PyTorch module whose
    fused inference fast path runs under no_grad (aten::_transformer_encoder_layer_fwd has no ONNX translation):
    then on, as a user's plain call runs."""
    return torch.enable_grad() if any(isinstance(m, FUSED) for m in model.modules()) else torch.no_grad()


def _export_torchscript(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    example = make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)
    dynamic_axes: dict[str, dict[int, str]] = {}
    for spec in loaded.inputs:
        axes = {i: d for i, d in enumerate(spec.shape) if isinstance(d, str)}
        if axes:
            dynamic_axes[spec.name] = axes
    dynamic_axes.update(_output_axes(loaded))
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".ts-export-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        with trace_grad(loaded.model), packed.applied(loaded, opset, "torchscript") as rewrite:
            torch.onnx.export(
                loaded.flat, example, str(raw), dynamo=False, input_names=[s.name for s in loaded.inputs],
                output_names=list(loaded.output_names), dynamic_axes=dynamic_axes or None, opset_version=opset,
                do_constant_folding=True,
            )
        save_model(onnx.load(str(raw)), path, external)
    return rewrite.diagnostics


def _output_axes(loaded: LoadedModel) -> dict[str, dict[int, str]]:
    """Which output axes follow which dynamic dim, found by running the model at two sizes."""
    a = export_sizes(loaded.dims)
    b = {}
    for i, (sym, d) in enumerate(loaded.dims.items()):
        step = i + 1  # each dim moved by its own step, so an output axis names the dim it follows
        if d.sizes:  # a constrained dim (multiples of 8, squares, …): another size the model runs at
            allowed = sorted(d.sizes)
            k = allowed.index(a[sym]) if a[sym] in allowed else 0
            b[sym] = allowed[k + step] if k + step < len(allowed) else allowed[max(0, k - step)]
        else:
            b[sym] = a[sym] + step if a[sym] + step <= d.max else max(d.min, a[sym] - step)
    if not loaded.dims:
        return {}
    with torch.inference_mode():
        out_a = loaded.flat(*make_inputs(loaded.inputs, a))
        out_b = loaded.flat(*make_inputs(loaded.inputs, b))
    axes: dict[str, dict[int, str]] = {}
    for name, ta, tb in zip(loaded.output_names, out_a, out_b):
        for axis, (sa, sb) in enumerate(zip(ta.shape, tb.shape)):
            matches = [s for s in loaded.dims if a[s] == sa and b[s] == sb]
            if len(matches) == 1:
                axes.setdefault(name, {})[axis] = matches[0]
            elif sa != sb:
                axes.setdefault(name, {})[axis] = f"{name}_dim{axis}"
    return axes


class NotApplicable(Exception):
    """A strategy that has nothing to do for this model (recorded, not an exporter failure)."""


def _export_cond(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    """The dynamo exporter after rewriting the Python branches (``if``/``elif``, early returns, conditional
    expressions) that froze as ``torch.cond``."""
    return _export_rewritten(loaded, path, opset, external, lines, loops=False)


def _export_scan(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    """The dynamo exporter after rewriting the loops over a dynamic size that froze as torch's ``scan`` (an
    ONNX Scan), and the branches as ``torch.cond``."""
    return _export_rewritten(loaded, path, opset, external, lines, loops=True)


def _export_rewritten(loaded: LoadedModel, path: Path, opset: int, external: bool, lines, loops: bool
                      ) -> list[Diagnostic]:
    what = "loop" if loops else "branch"
    if loaded.flat in _TOO_SLOW:
        raise NotApplicable(f"the dynamo export of this model {DYNAMO_OVER_LIMIT}")
    if not lines:
        raise NotApplicable(f"no source line of a frozen or failing {what} to rewrite")
    flat, rewrites = controlflow.with_cond(loaded.flat, lines, loops=loops)
    if not any(r.kind == ("loop" if loops else "if") for r in rewrites):
        where = ", ".join(f"{Path(f).name}:{n}" for f, n in lines[:3])
        raise NotApplicable(f"no `for`/`while` at {where} loops over a size in a form scan can take" if loops else
                            f"no `if` or conditional expression at {where} has a form torch.cond can take (both "
                            "sides returning, or assigning names)")
    if loaded.flat in _AUTO_SPENT:  # the rewritten model's shapes reason the same way
        _AUTO_SPENT.add(flat)
    diags = _export_dynamo(dataclasses.replace(loaded, flat=flat, model=flat.model), path, opset, external)
    return diags + [info("control-flow-kept", f"the `{'loop' if r.kind == 'loop' else 'if'}` at "
                         f"{Path(r.file).name}:{r.line} (module {r.module or 'the model'}) was exported as "
                         f"{'scan' if r.kind == 'loop' else 'torch.cond'}: `{r.code}`", module=r.module or None,
                         hint="write it this way in the model to export it without the rewrite") for r in rewrites]


def _export_script(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    """The TorchScript exporter on the model with its control-flow modules compiled by torch.jit.script."""
    try:
        flat, tries = controlflow.with_script(loaded.flat, lines)
    except ValueError as e:
        raise NotApplicable(str(e)) from None
    example = make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)
    # torch.jit.trace (not the exporter's own tracer) registers scripted submodules inside a traced wrapper
    with trace_grad(flat.model):
        traced = torch.jit.trace(flat, example, check_trace=False, strict=False)
    _export_torchscript(dataclasses.replace(loaded, flat=traced, model=flat.model), path, opset, external)
    kept = [t.module or "the model" for t in tries if t.ok]
    return [info("control-flow-kept", f"scripted {', '.join(kept)} with torch.jit.script: its if/for/while are "
                 "ONNX If/Loop", module=kept[0] if kept[0] != "the model" else None)]


STRATEGIES = {"dynamo": _export_dynamo, "torchscript": _export_torchscript, "cond": _export_cond,
              "script": _export_script, "scan": _export_scan, RESIZED: _export_dynamo_resized}
