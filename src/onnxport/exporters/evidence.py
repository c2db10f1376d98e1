"""What an export attempt tells about the model: the root line of an error, shape guards, tracer warnings,
and whether a successful export froze a branch, a loop or a dynamic dim."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import onnx
import torch

from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.records import Attempt
from onnxport.exporters import controlflow
from onnxport.sources.base import LoadedModel

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(exc: BaseException) -> str:
    """The most telling line of an exporter error (the root cause in torch.onnx's exception summary)."""
    text = _ANSI.sub("", str(exc))
    if "## Exception summary" in text:
        for line in text.split("## Exception summary", 1)[1].splitlines():
            line = line.strip()
            if line.startswith("<class"):
                cls, _, msg = line.partition(">: ")
                return f"{cls.rsplit('.', 1)[-1].rstrip(chr(39))}: {msg[:300]}"
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "[torch.onnx]")):
            return f"{type(exc).__name__}: {line[:300]}"
    return type(exc).__name__


def data_dependent_before(attempts: list[Attempt]) -> str | None:
    """A trace taken after the dynamo exporter met control flow on tensor values has frozen that flow."""
    for a in attempts:
        if a.exporter == "dynamo" and not a.ok and a.detail and DATA_DEPENDENT.search(a.detail):
            loc = user_line(a.detail)
            where = f" at {Path(loc[0]).name}:{loc[1]}" if loc else ""
            return f"traced past control flow on tensor values{where} (the dynamo exporter stopped there)"
    return None


def evidence_lines(attempts: list[Attempt], diags: list[Diagnostic], loaded: LoadedModel,
                   explicit: bool = False) -> list[tuple[str, int]]:
    """User source lines where earlier attempts froze or failed on control flow: shape guards, tracer
    warnings and the line an exporter error points at. With ``explicit`` (the user chose a control-flow
    strategy) and no evidence, every ``if`` of the model's own code."""
    lines: list[tuple[str, int]] = []
    for a in attempts:
        lines += [(file, line) for _, file, line in a.guards]
        if not a.ok and a.detail and (loc := user_line(a.detail)):
            lines.append(loc)
    for d in diags:
        if d.code == "tracer-warning" and d.severity == "warning" and d.source is not None:
            lines.append(d.source)
    if not lines and explicit:
        lines = controlflow.if_lines(loaded.model)
    return list(dict.fromkeys(lines))


def frozen_reason(loaded: LoadedModel, model: onnx.ModelProto, diags: list[Diagnostic],
                  guards: tuple[tuple[str, str, int], ...]) -> str | None:
    """Why an export that worked is known to have fixed a path: a narrowed or fixed dynamic dim, or a tensor
    turned into a Python value while tracing user code. None when nothing says so."""
    for d in diags:
        if d.code == "dynamic-dim-narrowed":
            return d.message.split(":")[0]
    for d in diags:
        if d.code == "tracer-warning" and d.severity == "warning":
            return f"tracing turned a tensor into a Python value at {d.message.split(': ')[0]}"
    fixed = []
    by_name = {i.name: i for i in model.graph.input}
    for spec in loaded.inputs:
        value = by_name.get(spec.name)
        if value is None:
            continue
        for axis, sym in enumerate(spec.shape):
            dims = value.type.tensor_type.shape.dim
            if isinstance(sym, str) and sym in loaded.dims and loaded.dims[sym].min != loaded.dims[sym].max \
                    and axis < len(dims) and dims[axis].HasField("dim_value") and sym not in fixed:
                fixed.append(sym)
    if fixed:
        where = next((f" by `{e}` at {Path(f).name}:{n}" for e, f, n in guards if e.startswith("Eq(")), "")
        return f"dynamic dim {', '.join(fixed)} came out fixed{where}"
    return None


SKIP_FILES = ("/torch/", "/onnxport/", "site-packages", "<frozen", "<string>", "/typer/", "/click/")
_GUARD = re.compile(r"eval (?!\[guard suppressed\])(.+?) \[guard added\] \((.+?):(\d+) in \w+\)")


def parse_guards(chatter: list[str]) -> tuple[tuple[str, str, int], ...]:
    """Shape guards torch.export added from user code: (expression, file, line)."""
    found = []
    for text in chatter:
        for m in _GUARD.finditer(text):
            expr, file, line = m.group(1), m.group(2), int(m.group(3))
            if "/torch/" in file or file.startswith(("torch/", "utils/", "nn/", "_")) or "site-packages" in file:
                continue
            if (expr, file, line) not in found:
                found.append((expr, file, line))
    return tuple(found)


def tracer_warnings(caught: list[warnings.WarningMessage]) -> list[Diagnostic]:
    """TracerWarnings as diagnostics; those raised inside PyTorch's own code are kept as info."""
    out: list[Diagnostic] = []
    seen: set[tuple[str, int]] = set()
    for w in caught:
        if not issubclass(w.category, torch.jit.TracerWarning):
            continue
        key = (w.filename, w.lineno)
        if key in seen:
            continue
        seen.add(key)
        inside_torch = "/torch/" in w.filename.replace("\\", "/")
        out.append((info if inside_torch else warning)(
            "tracer-warning",
            f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:240]}",
            module=f"{w.filename}:{w.lineno}", source=(w.filename, w.lineno),
            hint="the traced graph may have frozen a value or branch here; parity on several shapes checks it",
        ))
    return out


DATA_DEPENDENT = re.compile(
    r"data-dependent|GuardOnDataDependentSymNode|Data dependent|data dependent|unbacked", re.IGNORECASE)


_USER_LINE = [re.compile(r'File "([^"]+)", line (\d+)'), re.compile(r"# File: (\S+?):(\d+) in")]


def user_line(text: str) -> tuple[str, int] | None:
    for rx in _USER_LINE:
        for m in rx.finditer(text):
            if not any(s in m.group(1) for s in SKIP_FILES):
                return m.group(1), int(m.group(2))
    return None
