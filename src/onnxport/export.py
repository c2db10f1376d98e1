"""Export strategies (dynamo, TorchScript), tried in order; every attempt is recorded."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

from . import controlflow, custom_ops
from .diagnostics import Diagnostic, info, warning
from .errors import ExportFailed, UsageError
from .samples import export_sizes, make_inputs
from .sources.base import LoadedModel

EXPORTERS = ("dynamo", "torchscript")  # the plain exporters, tried first
CONTROL_FLOW = ("cond", "script")  # tried by auto when the plain ones fail or freeze a branch or loop
CHOICES = ("auto", *EXPORTERS, *CONTROL_FLOW)
BASE_EXPORTER = {"dynamo": "dynamo", "torchscript": "torchscript", "cond": "dynamo", "script": "torchscript"}
MIN_OPSET = 17
EXTERNAL_DATA_THRESHOLD = 2 * 1024**3


@dataclass(frozen=True)
class Attempt:
    """One try of one exporter."""

    exporter: str
    ok: bool
    seconds: float
    opset: int
    error: str | None = None
    detail: str | None = None
    guards: tuple[tuple[str, str, int], ...] = ()  # (guard expression, user file, line) from torch.export
    frozen: str | None = None  # why a successful export is known to have fixed a branch, loop or dynamic dim
    note: str | None = None  # what the strategy changed (e.g. the `if` rewritten as torch.cond)

    def to_dict(self) -> dict:
        out = {"exporter": self.exporter, "ok": self.ok, "seconds": round(self.seconds, 3), "opset": self.opset,
               "error": self.error}
        if self.frozen:
            out["frozen"] = self.frozen
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class ExportResult:
    """The ONNX file written by the first exporter that succeeded, and all attempts."""

    path: Path
    exporter: str
    opset: int
    seconds: float
    attempts: tuple[Attempt, ...]
    external_data: bool
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def guards(self) -> tuple[tuple[str, str, int], ...]:
        """Shape guards from every attempt (a failed or frozen one names the thresholds of the branches)."""
        return tuple(dict.fromkeys(g for a in self.attempts for g in a.guards))


# --------------------------------------------------------------------------- opsets


@functools.lru_cache(maxsize=1)
def onnxruntime_max_opset() -> int:
    """The newest default-domain opset the installed onnxruntime accepts (probed once)."""
    import onnxruntime as ort
    from onnx import helper

    for version in range(onnx.defs.onnx_opset_version(), MIN_OPSET - 1, -1):
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        ir = min(onnx.IR_VERSION, 10)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=ir)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception:  # noqa: BLE001 - a refusal means this opset is too new
            continue
    return MIN_OPSET


def exporter_max_opset(exporter: str) -> int:
    """The newest opset an exporter of the installed torch can write."""
    from torch.onnx import _constants

    if exporter == "torchscript":
        return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 17))
    return int(getattr(_constants, "ONNX_MAX_OPSET", 18))


def default_opset(exporter: str) -> int:
    """The newest opset both ``exporter`` and onnxruntime support, at least 17."""
    return max(MIN_OPSET, min(exporter_max_opset(exporter), onnxruntime_max_opset()))


# --------------------------------------------------------------------------- strategies


def _dim_objects(loaded: LoadedModel) -> tuple:
    dims = {}
    for sym, d in loaded.dims.items():
        if d.min != d.max:
            dims[sym] = torch.export.Dim(sym, min=d.min, max=d.max)
    shapes = []
    for spec in loaded.inputs:
        axes = {i: dims[d] for i, d in enumerate(spec.shape) if isinstance(d, str) and d in dims}
        shapes.append(axes or None)
    return tuple(shapes)


def _export_dynamo(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    example = make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)
    customs = custom_ops.discover_loaded(loaded)  # autograd.Functions with symbolic(): opaque ops + translations
    torch._logging.set_logs(dynamic=logging.INFO)  # guard log lines name the user code that fixed a shape
    try:
        with custom_ops.opaque(customs):
            program = torch.onnx.export(
                loaded.flat, example, dynamo=True, dynamic_shapes=_dim_objects(loaded),
                input_names=[s.name for s in loaded.inputs], output_names=list(loaded.output_names),
                opset_version=opset, optimize=True, verbose=False,
                custom_translation_table=custom_ops.translation_table(customs, opset) or None,
            )
    finally:
        torch._logging.set_logs()
    program.save(str(path), external_data=external)
    return narrowed_dims(loaded, getattr(program, "exported_program", None))


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
        torch.onnx.export(
            loaded.flat, example, str(raw), dynamo=False, input_names=[s.name for s in loaded.inputs],
            output_names=list(loaded.output_names), dynamic_axes=dynamic_axes or None, opset_version=opset,
            do_constant_folding=True,
        )
        save_model(onnx.load(str(raw)), path, external)
    return []


def _output_axes(loaded: LoadedModel) -> dict[str, dict[int, str]]:
    """Which output axes follow which dynamic dim, found by running the model at two sizes."""
    a = export_sizes(loaded.dims)
    b = {}
    for i, (sym, d) in enumerate(loaded.dims.items()):
        step = i + 1
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
    """The dynamo exporter after rewriting the Python ``if`` statements that froze as ``torch.cond``."""
    if not lines:
        raise NotApplicable("no source line of a frozen or failing branch to rewrite")
    flat, rewrites = controlflow.with_cond(loaded.flat, lines)
    if not rewrites:
        where = ", ".join(f"{Path(f).name}:{n}" for f, n in lines[:3])
        raise NotApplicable(f"no `if` at {where} has a form torch.cond can take (both sides returning, or both "
                            "assigning the same name)")
    diags = _export_dynamo(dataclasses.replace(loaded, flat=flat, model=flat.model), path, opset, external)
    return diags + [info("control-flow-kept", f"the `if` at {Path(r.file).name}:{r.line} (module "
                         f"{r.module or 'the model'}) was exported as torch.cond: `{r.code}`", module=r.module or None,
                         hint="write it this way in the model to export it without the rewrite") for r in rewrites]


def _export_script(loaded: LoadedModel, path: Path, opset: int, external: bool, lines=()) -> list[Diagnostic]:
    """The TorchScript exporter on the model with its control-flow modules compiled by torch.jit.script."""
    try:
        flat, tries = controlflow.with_script(loaded.flat, lines)
    except ValueError as e:
        raise NotApplicable(str(e)) from None
    example = make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)
    # torch.jit.trace (not the exporter's own tracer) registers scripted submodules inside a traced wrapper
    traced = torch.jit.trace(flat, example, check_trace=False, strict=False)
    _export_torchscript(dataclasses.replace(loaded, flat=traced, model=flat.model), path, opset, external)
    kept = [t.module or "the model" for t in tries if t.ok]
    return [info("control-flow-kept", f"scripted {', '.join(kept)} with torch.jit.script: its if/for/while are "
                 "ONNX If/Loop", module=kept[0] if kept[0] != "the model" else None)]


STRATEGIES = {"dynamo": _export_dynamo, "torchscript": _export_torchscript, "cond": _export_cond,
              "script": _export_script}


# --------------------------------------------------------------------------- files


def external_threshold() -> int:
    """Weights above this many bytes go to external data (env ONNXPORT_EXTERNAL_DATA_THRESHOLD, default 2 GiB:
    protobuf cannot hold more in one file)."""
    return int(os.environ.get("ONNXPORT_EXTERNAL_DATA_THRESHOLD", EXTERNAL_DATA_THRESHOLD))


def save_model(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Save ``model``; with ``external`` the weights go to ``<name>.data`` beside it."""
    path = Path(path)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        data = path.with_name(path.name + ".data")
        if data.exists():  # onnx creates it owner-only; serving and Triton containers read it as another user
            data.chmod(path.stat().st_mode & 0o777)
    else:
        onnx.save_model(model, str(path))


def external_data_files(path: Path) -> list[Path]:
    """The external data files an ONNX file refers to (none for a self-contained file)."""
    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return [path.parent / loc for loc in sorted(locations)]


def _relocated(src: Path, new_loc: str) -> onnx.ModelProto:
    """``src``'s graph (weights not loaded) with every external-data reference pointing at ``new_loc``."""
    model = onnx.load(str(src), load_external_data=False)
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = new_loc
    return model


def copy_model(src: Path, dst: Path) -> None:
    """Copy an ONNX file and its external data (renamed to ``<dst>.data``); the weights are copied as bytes,
    never loaded, so this works for models of any size."""
    src, dst = Path(src), Path(dst)
    data = external_data_files(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not data:
        shutil.copyfile(src, dst)
        return
    if len(data) != 1:
        raise UsageError(f"{src} spreads its weights over {len(data)} external data files",
                         "re-export it with onnxport (one .data file per model)")
    if not data[0].is_file():
        raise UsageError(f"{src.name} refers to external data {data[0].name}, which is missing",
                         "keep the .data file beside the .onnx file")
    shutil.copyfile(data[0], dst.parent / (dst.name + ".data"))
    tmp = dst.with_name(dst.name + ".tmp")
    onnx.save_model(_relocated(src, dst.name + ".data"), str(tmp))
    os.replace(tmp, dst)


def move_model(src: Path, dst: Path) -> None:
    """Move an ONNX file (and its external data, renamed to ``<dst>.data``) into place atomically."""
    src, dst = Path(src), Path(dst)
    data = external_data_files(src)
    if not data:
        os.replace(src, dst)
        return
    model = onnx.load(str(src), load_external_data=False)
    new_loc = dst.name + ".data"
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = new_loc
    if len(data) != 1:
        raise ExportFailed(f"{src} spreads its weights over {len(data)} files", "re-export with onnxport")
    os.replace(data[0], dst.parent / new_loc)
    tmp = dst.with_name(dst.name + ".tmp")
    onnx.save_model(model, str(tmp))
    os.replace(tmp, dst)
    src.unlink(missing_ok=True)


# --------------------------------------------------------------------------- entry point


@contextlib.contextmanager
def captured_output(sink: list[str] | None = None):
    """Keep exporter chatter (Python prints, logging and C++ logs on fd 1 and 2) off the terminal.

    stdout belongs to ``--json`` and stderr to onnxport's own messages; what the exporters print is
    appended to ``sink`` (it holds, e.g., the TorchScript graph at the point of failure).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as tmp:
        for fd in (1, 2):
            os.dup2(tmp.fileno(), fd)
        try:
            with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            if sink is not None:
                tmp.seek(0)
                sink.append(tmp.read().decode("utf-8", "replace") + out.getvalue() + err.getvalue())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
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


def export(loaded: LoadedModel, path: str | Path, *, exporter: str = "auto", opset: int | None = None,
           external_data_threshold: int | None = None) -> ExportResult:
    """Export ``loaded`` to ``path``.

    ``auto`` tries the dynamo exporter, then the TorchScript exporter; when both fail, or the one that worked
    is caught freezing a branch, a loop or a dynamic dim, it goes on with the control-flow strategies (``cond``:
    the ``if`` as torch.cond, ``script``: torch.jit.script of the modules holding control flow) and keeps the
    first export that froze nothing (else the first that worked, for parity to judge).
    """
    path = Path(path)
    if exporter not in CHOICES:
        raise UsageError(f"unknown exporter '{exporter}'", f"use one of {', '.join(CHOICES)}")
    order = [*EXPORTERS, *CONTROL_FLOW] if exporter == "auto" else [exporter]
    if opset is not None:
        newest = max(exporter_max_opset(BASE_EXPORTER[e]) for e in order)
        newest = min(newest, onnxruntime_max_opset())
        if opset < 7 or opset > newest:
            raise UsageError(f"opset {opset} is not supported here (newest usable: {newest})",
                             f"pick an opset between {MIN_OPSET} and {newest}, or leave --opset out")
    threshold = external_data_threshold
    if threshold is None:
        threshold = int(os.environ.get("ONNXPORT_EXTERNAL_DATA_THRESHOLD", EXTERNAL_DATA_THRESHOLD))
    size = sum(t.numel() * t.element_size() for t in loaded.flat.state_dict().values())
    external = size > threshold
    attempts: list[Attempt] = []
    done: list[tuple[Attempt, Path, list[Diagnostic]]] = []  # successful attempts with their files
    failed_diags: list[Diagnostic] = []
    t_all = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".data")):
        stale.unlink(missing_ok=True)
    try:
        for name in order:
            if done and name in EXPORTERS:
                continue  # one plain export is enough: the other would freeze the same way
            if any(not a.frozen for a, _, _ in done):
                break
            base = BASE_EXPORTER[name]
            use_opset = min(opset, exporter_max_opset(base)) if opset else default_opset(base)
            target = path.with_name(f".{name}-{path.name}")
            lines = evidence_lines(attempts, [d for _, _, ds in done for d in ds] + failed_diags, loaded,
                                   explicit=exporter == name)
            t0 = time.perf_counter()
            chatter: list[str] = []
            try:
                with warnings.catch_warnings(record=True) as caught, captured_output(chatter):
                    warnings.simplefilter("always")
                    made = STRATEGIES[name](loaded, target, use_opset, external, lines)
            except NotApplicable as e:
                attempts.append(Attempt(name, False, time.perf_counter() - t0, use_opset, f"not applicable: {e}"))
                continue
            except Exception as e:  # noqa: BLE001 - every failure is recorded and the next strategy tried
                detail = ("".join(traceback.format_exception_only(type(e), e))[-6000:] + "\n"
                          + "".join(chatter)[-6000:])
                attempts.append(Attempt(name, False, time.perf_counter() - t0, use_opset, _first_line(e), detail,
                                        parse_guards(chatter)))
                failed_diags.extend(_tracer_warnings(caught))
                continue
            diags = _tracer_warnings(caught) + list(made or [])
            if name in CONTROL_FLOW and (refused := _ort_refuses(target)):
                attempts.append(Attempt(name, False, time.perf_counter() - t0, use_opset,
                                        f"onnxruntime cannot load the result: {refused}"))
                continue
            written = onnx.load(str(target), load_external_data=False)
            actual = next((o.version for o in written.opset_import if o.domain in ("", "ai.onnx")), use_opset)
            guards = parse_guards(chatter)
            frozen = frozen_reason(loaded, written, diags, guards)
            if not frozen and name == "torchscript":
                frozen = _data_dependent_before(attempts)
            note = "; ".join(d.message for d in diags if d.code == "control-flow-kept") or None
            attempt = Attempt(name, True, time.perf_counter() - t0, actual, guards=guards, frozen=frozen, note=note)
            attempts.append(attempt)
            done.append((attempt, target, diags))
        if not done:
            summary = "; ".join(f"{a.exporter}: {a.error}" for a in attempts
                                if not (a.error or "").startswith("not applicable"))
            err = ExportFailed(f"no exporter could export the model ({summary})",
                               "see the attempts in report.json; try --exporter torchscript or dynamo, or another "
                               "--opset", code="export-failed")
            err.attempts = tuple(attempts)  # type: ignore[attr-defined]
            err.diagnostics = tuple(failed_diags)  # type: ignore[attr-defined]
            raise err
        chosen = next((d for d in done if not d[0].frozen), done[0])
        move_model(chosen[1], path)
        diags = list(chosen[2])
        for a, _, ds in done:  # what other attempts saw is history: keep it, as info
            if a is not chosen[0]:
                diags += [dataclasses.replace(d, severity="info", message=f"{a.exporter} attempt: {d.message}")
                          for d in ds if d.code != "control-flow-kept"]
        return ExportResult(path, chosen[0].exporter, chosen[0].opset, time.perf_counter() - t_all,
                            tuple(attempts), external, tuple(diags))
    finally:
        for name in order:
            tmp = path.with_name(f".{name}-{path.name}")
            for leftover in (tmp, tmp.with_name(tmp.name + ".data")):
                leftover.unlink(missing_ok=True)


def _ort_refuses(path: Path) -> str | None:
    """Why onnxruntime refuses to load ``path`` (None when it loads). The TorchScript exporter can write Loop
    bodies with inconsistent types; such a file is no better than a failed export."""
    from .runtime import session

    try:
        session(path, opt_level="disable")
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        return str(getattr(e, "message", e)).split("failed:")[-1].strip()[:300]
    return None


def _data_dependent_before(attempts: list[Attempt]) -> str | None:
    """A trace taken after the dynamo exporter met control flow on tensor values has frozen that flow."""
    from .diagnose import _DATA_DEPENDENT, _user_line

    for a in attempts:
        if a.exporter == "dynamo" and not a.ok and a.detail and _DATA_DEPENDENT.search(a.detail):
            loc = _user_line(a.detail)
            where = f" at {Path(loc[0]).name}:{loc[1]}" if loc else ""
            return f"traced past control flow on tensor values{where} (the dynamo exporter stopped there)"
    return None


def evidence_lines(attempts: list[Attempt], diags: list[Diagnostic], loaded: LoadedModel,
                   explicit: bool = False) -> list[tuple[str, int]]:
    """User source lines where earlier attempts froze or failed on control flow: shape guards, tracer
    warnings and the line an exporter error points at. With ``explicit`` (the user chose a control-flow
    strategy) and no evidence, every ``if`` of the model's own code."""
    from .diagnose import _user_line

    lines: list[tuple[str, int]] = []
    for a in attempts:
        lines += [(file, line) for _, file, line in a.guards]
        if not a.ok and a.detail and (loc := _user_line(a.detail)):
            lines.append(loc)
    for d in diags:
        if d.code == "tracer-warning" and d.severity == "warning" and d.module and ":" in d.module:
            file, _, line = d.module.rpartition(":")
            if line.isdigit():
                lines.append((file, int(line)))
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


def _tracer_warnings(caught: list[warnings.WarningMessage]) -> list[Diagnostic]:
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
            module=f"{w.filename}:{w.lineno}",
            hint="the traced graph may have frozen a value or branch here; parity on several shapes checks it",
        ))
    return out
