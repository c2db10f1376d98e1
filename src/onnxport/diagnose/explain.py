"""Explanations: which PyTorch module and source line a failure comes from, why, and what to do."""

from __future__ import annotations

import inspect
import re
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from onnxport.core.diagnostics import Diagnostic, error, warning
from onnxport.core.records import Attempt, Divergence, ExportResult
from onnxport.core.samples import Case, export_sizes, make_inputs
from onnxport.exporters.controlflow import same_file
from onnxport.exporters.evidence import DATA_DEPENDENT, SKIP_FILES, evidence_lines, user_line
from onnxport.exporters.opsets import candidate_opsets, op_version
from onnxport.exporters.strategies import CONTROL_FLOW
from onnxport.prove.localize import MAX_HELD, TooLarge, record_modules
from onnxport.prove.references import torch_outputs
from onnxport.runtime.placement import Placement, node_name
from onnxport.sources.base import LoadedModel

# --------------------------------------------------------------------------- where in the user's code


def module_at(model: torch.nn.Module, file: str, line: int) -> str | None:
    """The deepest module whose class's forward() contains ``file:line`` ('' for the root model)."""
    best: str | None = None
    for path, mod in model.named_modules():
        fn = getattr(type(mod), "forward", None)
        try:
            src = inspect.getsourcefile(fn)
            lines, start = inspect.getsourcelines(fn)
        except (TypeError, OSError):
            continue
        inside = bool(src) and same_file(src, file) and start <= line < start + len(lines)
        if inside and (best is None or path.count(".") + bool(path) > best.count(".") + bool(best)):
            best = path
    return best


def label(loaded: LoadedModel, path: str | None) -> str | None:
    if path is None:
        return None
    return path or f"{loaded.name} (the model's own forward)"


def _typed(loaded: LoadedModel, path: str, cls: str) -> str:
    return label(loaded, path) if not path else f"{path} ({cls})"


def _user_frame(frames) -> tuple[str, int] | None:
    for f in reversed(frames):
        if not any(s in f.filename.replace("\\", "/") for s in SKIP_FILES):
            return f.filename, f.lineno
    return None


def locate_op(loaded: LoadedModel, op: str) -> tuple[str | None, str | None, int | None]:
    """Run the model once and find the first call of aten ``op``: (module path, file, line)."""
    want = re.split(r"::|\.", op.removeprefix("aten::").removeprefix("aten."))[0]
    stack: list[str] = []
    hits: dict[str, tuple[str, tuple[str, int] | None]] = {}
    handles = []
    def enter(path: str):
        def hook(module, args) -> None:
            stack.append(path)
        return hook

    def leave(module, args, output) -> None:  # a forward hook must return None, or it replaces the output
        if stack:
            stack.pop()

    for path, mod in loaded.model.named_modules():
        handles.append(mod.register_forward_pre_hook(enter(path)))
        handles.append(mod.register_forward_hook(leave))

    class Finder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split("::")[-1]
            if name not in hits:
                hits[name] = (stack[-1] if stack else "", _user_frame(traceback.extract_stack()))
            return func(*args, **(kwargs or {}))

    try:
        with torch.inference_mode(), Finder():
            loaded.flat(*make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0))
    except Exception:  # noqa: BLE001 - best effort: the op may only fail under the exporter
        pass
    finally:
        for h in handles:
            h.remove()
    match = hits.get(want) or next((v for k, v in hits.items() if k.startswith(want) or want.startswith(k)), None)
    if match is None:
        return None, None, None
    module, frame = match
    return module, (frame[0] if frame else None), (frame[1] if frame else None)


# --------------------------------------------------------------------------- export failures

_UNSUPPORTED = [
    re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)'"),
    re.compile(r"Exporting the operator '([\w:.]+)' to ONNX opset version \d+ is not supported"),
    re.compile(r"ONNX export failed on an operator with unrecognized namespace ([\w:.]+)"),
]
_SPECIALIZED = re.compile(r"Constraints violated \(([^)]*)\)")




def explain_attempts(attempts: Sequence[Attempt], loaded: LoadedModel, failed: bool) -> list[Diagnostic]:
    """Translate each failed exporter attempt into a diagnostic naming the op, module and line."""
    out: list[Diagnostic] = []
    make = error if failed else warning
    for a in attempts:
        if a.ok or not a.detail:
            continue
        text = a.detail
        op = next((m.group(1) for rx in _UNSUPPORTED if (m := rx.search(text))), None)
        if op:
            module, file, line = locate_op(loaded, op)
            where = f" in module {label(loaded, module)} at {Path(file).name}:{line}" if file else ""
            out.append(make(
                "unsupported-operator",
                f"{a.exporter} exporter: no ONNX translation for {op}{where}",
                module=label(loaded, module), node=op,
                hint="try a newer --opset if ONNX added the operator later; register a custom op (an onnxscript "
                     "custom_translation_table entry for the dynamo exporter, a symbolic() for the TorchScript "
                     "exporter) with an ONNX Runtime implementation; or rewrite that line with supported operators",
            ))
            continue
        m = _SPECIALIZED.search(text)
        if m:
            out.append(make(
                "dynamic-dim-specialized",
                f"{a.exporter} exporter: the declared range of {m.group(1)} cannot hold: {a.error}",
                hint="the model fixes or restricts this size (a shape test, a reshape to a constant, a Python loop "
                     "over it); declare the range it really supports with --dim, or rewrite that code",
            ))
            continue
        if DATA_DEPENDENT.search(text):
            loc = user_line(text)
            module = module_at(loaded.model, *loc) if loc else None
            where = f" at {Path(loc[0]).name}:{loc[1]}" if loc else ""
            mod = f" (module {label(loaded, module)})" if module is not None else ""
            out.append(make(
                "data-dependent-control-flow",
                f"{a.exporter} exporter: Python control flow depends on tensor values{where}{mod}",
                module=label(loaded, module),
                hint="replace the Python `if`/loop on tensor values with tensor ops (torch.where, masking) or "
                     "torch.cond for a real branch; .item(), .tolist() and nonzero()-sized shapes tie the graph "
                     "to the example's values",
            ))
    return out


def enrich(diags: list[Diagnostic], loaded: LoadedModel, guards: Sequence[tuple[str, str, int]]) -> list[Diagnostic]:
    """Name modules in tracer warnings, and the code line that fixed or narrowed a dynamic dim."""
    sizes = export_sizes(loaded.dims)
    out = []
    for d in diags:
        if d.code == "tracer-warning" and d.source is not None:
            module = module_at(loaded.model, *d.source)
            if module is not None:
                d = replace(d, module=label(loaded, module))
        elif d.code in ("dynamic-dim-fixed", "dynamic-dim-narrowed") and guards:
            sym = re.search(r"\('(\w+)'\)|assumed (\w+) in", d.message)
            name = (sym.group(1) or sym.group(2)) if sym else None
            for expr, file, line in guards:
                fixed_to = re.fullmatch(r"Eq\(\w+, (\d+)\)", expr)
                relevant = (int(fixed_to.group(1)) == sizes.get(name) if fixed_to
                            else d.code == "dynamic-dim-narrowed")
                if name and relevant:
                    module = module_at(loaded.model, file, line)
                    d = replace(d, message=f"{d.message} (by `{expr}` at {Path(file).name}:{line})",
                                module=label(loaded, module))
                    break
        out.append(d)
    return out


# --------------------------------------------------------------------------- traps found by running PyTorch


def static_traps(loaded: LoadedModel) -> list[Diagnostic]:
    """Python scalar arguments of forward() that the export bakes in as constants."""
    out = []
    try:
        params = list(inspect.signature(loaded.model.forward).parameters.values())
    except (TypeError, ValueError):
        return out
    bound = {b[1] for b in loaded.flat._binding if b[0] == "kw"}
    n_pos = sum(1 for b in loaded.flat._binding if b[0] == "pos")
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    bound |= {p.name for p in positional[:n_pos]}
    for p in params:
        if p.name in bound or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kind = p.annotation if p.annotation in (int, float, bool) else (
            type(p.default) if isinstance(p.default, (int, float, bool)) else None)
        if kind is None:
            continue
        dtype = {int: "int64", float: "float32", bool: "bool"}[kind]
        out.append(warning(
            "scalar-argument",
            f"forward() argument '{p.name}' is a Python {kind.__name__} (default {p.default!r}); the export bakes "
            "this value into the graph as a constant",
            module=label(loaded, ""),
            hint=f"to vary it at inference time, pass it as a 0-d tensor input: -i '{p.name}:{dtype}[]'",
        ))
    return out


def runtime_traps(loaded: LoadedModel, case: Case) -> list[Diagnostic]:
    """Random ops (two runs differ) and NaN/Inf in PyTorch's own outputs, each with the module responsible."""
    out = []
    inputs = make_inputs(loaded.inputs, case.sizes, case.values, case.seed)
    try:
        torch.manual_seed(1)
        first = record_modules(loaded, inputs, budget=MAX_HELD)
        torch.manual_seed(2)
        second = record_modules(loaded, inputs, budget=MAX_HELD)
    except TooLarge:  # every module's output held twice (SAM's ViT: 10 GiB): the model's outputs only
        first, second = (_outputs(loaded, inputs, seed) for seed in (1, 2))
    for (path, cls, a), (_, _, b) in zip(first, second):
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            out.append(error(
                "nondeterministic",
                f"PyTorch gives different outputs for the same input: module {_typed(loaded, path, cls)} "
                "draws random numbers in inference",
                module=label(loaded, path),
                hint="remove random ops from inference (torch.rand*, dropout applied by hand with training=True); "
                     "no export can match a random model",
            ))
            break
    for path, cls, a in first:
        if not np.isfinite(a).all():
            out.append(warning(
                "nan-in-pytorch",
                f"PyTorch itself produces NaN/Inf, first in module {_typed(loaded, path, cls)} on "
                f"'{case.label}' inputs",
                module=label(loaded, path),
                hint="the model is numerically unsafe on these inputs (log/sqrt/div of non-positive values, "
                     "overflow); parity compares NaN positions, but deployments will see the same NaNs",
            ))
            break
    return out


def _outputs(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...], seed: int) -> list[tuple[str, str, np.ndarray]]:
    """The model's floating outputs as :func:`record_modules` gives its modules' (path "": the model)."""
    torch.manual_seed(seed)
    return [("", type(loaded.model).__name__, a.astype(np.float32))
            for a in torch_outputs(loaded, inputs) if a.dtype.kind == "f"]


def explain_divergence(div: Divergence, loaded: LoadedModel, diags: Sequence[Diagnostic]) -> Diagnostic:
    """One diagnostic for the localized divergence, naming a frozen branch when tracing warned inside it."""
    mod = label(loaded, div.module) or div.label
    typed = mod if not div.module else f"{mod} ({div.module_type})"
    node = f"ONNX node {div.node} ({div.op})" if div.node else "the ONNX graph"
    if div.onnx_error:
        hint = ("a size was baked into this node at export (typical of the TorchScript exporter's Reshape); "
                "the dynamo exporter with dynamic shapes avoids it" if div.op in ("Reshape", "Expand", "Tile")
                else "onnxruntime cannot run this node at these shapes")
        return error("onnxruntime-error",
                     f"ONNX Runtime fails in {node}, exported from module {mod}, on case '{div.case}': "
                     f"{div.onnx_error}", module=mod, node=div.node, hint=hint)
    frozen = [d for d in diags if d.code in ("tracer-warning", "data-dependent-control-flow", "dynamic-dim-narrowed")
              and d.module == mod]
    if frozen:
        return error("frozen-branch",
                     f"module {typed} took a fixed path during export: its output differs from "
                     f"PyTorch on case '{div.case}' (max abs error {div.max_abs_err:.3g}, {node})",
                     module=mod, node=div.node,
                     hint="the branch or loop in this module's forward was frozen to the example's path; rewrite it "
                          "with torch.where/masking or torch.cond so the graph keeps both paths")
    err = "" if div.max_abs_err is None else f" (max abs error {div.max_abs_err:.3g})"
    return error("divergence",
                 f"outputs first differ at module {typed}, {node}, on case '{div.case}'{err}",
                 module=mod, node=div.node,
                 hint="every module before this one matches; look at this module's ops (and the node named) for a "
                      "wrong export, a changed weight or an operator with different semantics in ONNX")


# --------------------------------------------------------------------------- control flow


def unreached_branches(sites, loaded: LoadedModel) -> list[Diagnostic]:
    """A warning for each If side or Loop the proof could not reach with any case it tried."""
    out = []
    for s in sites:
        if s.covered:
            continue
        seen = ", ".join(f"{k} on '{v}'" for k, v in s.seen.items()) or "never run"
        what = "only one side" if s.op == "If" else "only one trip count"
        out.append(warning(
            "branch-unreached",
            f"ONNX {s.op} {s.node} (module {label(loaded, s.module) or '?'}) was exercised on {what} ({seen}): the "
            "other is kept in the graph but not proven against PyTorch",
            module=label(loaded, s.module), node=s.node,
            hint="run `onnxport compare` with inputs that take the other path (e.g. --dim sizes across the "
                 "threshold, values of the other sign) to prove it too",
        ))
    return out


_LINE_FIXES = [
    (re.compile(r"\.(item|tolist)\(\)"), "keep the value a tensor (drop .{0}()): an exporter can only carry "
     "tensors, a Python number is baked in as the example's value"),
    (re.compile(r"\bnonzero\b|\[[^\]]*[<>]=?[^\]]*\]"), "its size depends on the values; use a fixed-size form "
     "(a mask multiplied in, torch.where) instead of selecting elements"),
]


def _source_line(file: str, line: int) -> str:
    try:
        return Path(file).read_text().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


def _smallest_change(file: str, line: int, script_refusal: str | None) -> str:
    """The code change at ``file:line`` that would let the control flow export."""
    code = _source_line(file, line)
    where = f"{Path(file).name}:{line}" + (f" `{code}`" if code else "")
    refused = f"; torch.jit.script refused the module: {script_refusal}" if script_refusal else ""
    for rx, fix in _LINE_FIXES:
        m = rx.search(code)
        if m:
            return f"at {where}: " + fix.format(m.group(1) if m.groups() else "") + refused
    if code.startswith(("for ", "while ")):
        return (f"at {where}: loop a fixed maximum number of times and mask the extra steps "
                f"(`h = torch.where(i < steps, step(h), h)` with `steps` a tensor){refused}")
    if code.startswith("if "):
        return (f"at {where}: compute both sides and pick with torch.where, or write the branch as "
                f"torch.cond(pred, true_fn, false_fn, operands){refused}")
    return f"at {where}: express this with tensor ops so no Python value is taken from a tensor{refused}"


def lost_control_flow(result, loaded: LoadedModel) -> list[Diagnostic]:
    """When the kept export froze a branch, loop or dim (no strategy kept it): where, and the smallest change."""
    chosen = next((a for a in result.attempts if a.ok and a.exporter == result.exporter), None)
    if chosen is None or not chosen.frozen:
        return []
    tried = [a for a in result.attempts if a.exporter in CONTROL_FLOW]
    traced = [d for d in result.diagnostics if d.code == "tracer-warning"]
    own = evidence_lines([chosen], [] if chosen.guards else traced, loaded)  # the kept file's own evidence first
    lines = list(dict.fromkeys(own + evidence_lines(list(result.attempts), traced, loaded)))
    script = next((a for a in tried if a.exporter == "script" and not a.ok), None)
    refusal = None
    if script and script.error and "could not compile" in script.error:
        refusal = script.error.split("control flow: ", 1)[-1]
    file, line = lines[0] if lines else (None, None)
    module = module_at(loaded.model, file, line) if file else None
    strategies = ", ".join(f"{a.exporter} ({(a.error or 'froze it')[:120]})" for a in tried) or "none applied"
    return [warning(
        "control-flow-frozen",
        f"no export strategy kept the control flow{f' at {Path(file).name}:{line}' if file else ''}: the "
        f"{chosen.exporter} export {chosen.frozen}; tried {strategies}",
        module=label(loaded, module), source=(file, line) if file else None,
        hint=_smallest_change(file, line, refusal) if file else
        "rewrite the branch or loop with tensor ops (torch.where, masking) or torch.cond",
    )]


# --------------------------------------------------------------------------- placement on the GPU


def placement(placed: Placement | None, result: ExportResult | None = None) -> list[Diagnostic]:
    """What the GPU placement shows: compute nodes left on the CPU (``cpu-compute-node``: the op types and
    the opset or provider that fixes them) and providers listed but unloadable (``provider-unloadable``)."""
    if placed is None or placed.device == "cpu":
        return []
    out = [warning("provider-unloadable", line, hint="install the provider's libraries to use it; the others in "
                   "the chain run the model meanwhile (onnxport doctor shows what loads)")
           for line in placed.providers_unloadable]
    nodes = placed.cpu_compute_nodes
    if not nodes:
        return out
    if nodes[0].startswith("all "):
        out.append(warning("cpu-compute-node", f"{nodes[0]} run on the CPU under --device {placed.device}: the "
                           f"session uses {', '.join(placed.providers_used)} only",
                           hint="the GPU provider did not start: run onnxport doctor (cuDNN and the CUDA libraries "
                                "must load)"))
        return out
    ops = placed.compute_op_types
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    copies = f"; {placed.memcpy_nodes} Memcpy node(s) copy between host and GPU" if placed.memcpy_nodes else ""
    out.append(warning("cpu-compute-node", f"{len(nodes)} compute node(s) run on the CPU under --device "
                       f"{placed.device} ({', '.join(ops)}): {shown}{copies}", node=node_name(nodes[0]),
                       hint=_placement_fix(ops, result)))
    return out


def _placement_fix(ops: Sequence[str], result: ExportResult | None) -> str:
    """The opset that gives ``ops`` another version, else the provider that lacks the kernel."""
    opset = result.opset if result is not None else None
    versions = candidate_opsets(opset, ops) if opset else []
    tried = bool(result) and any(not a.ok and " on the CPU" in (a.error or "") for a in result.attempts)
    kinds = ", ".join(f"{op}-{v}" if (v := op_version(op, opset or 0)) else op for op in ops) if opset else ", ".join(ops)
    if versions and not tried:
        return (f"export with --opset {versions[0]}, where {', '.join(ops)} have an older version the CUDA provider "
                f"may run (with --opset left out, onnxport picks the newest opset that keeps them on the GPU)")
    why = (f"opset{'s' if len(versions) > 1 else ''} {', '.join(map(str, versions))} left them there too" if versions
           else "no opset down to 17 gives them another version")
    return (f"this onnxruntime's CUDA provider has no kernel for {kinds} ({why}): each run pays host-device "
            "copies around them; TensorRT in the provider chain may take them, or rewrite the operator in the model")
