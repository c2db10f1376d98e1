"""The strategy chain: try the exporters in order, record every attempt, keep the first export that froze
nothing."""

from __future__ import annotations

import dataclasses
import functools
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import onnx

from onnxport.core.diagnostics import Diagnostic
from onnxport.core.errors import ExportFailed, UsageError, one_line
from onnxport.core.logs import captured_output
from onnxport.core.onnxfile import external_threshold, move_model, remove_model, state_bytes
from onnxport.core.records import Attempt, ExportResult
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.exporters import controlflow, packed
from onnxport.exporters.evidence import (
    data_dependent_before,
    evidence_lines,
    first_line,
    frozen_reason,
    parse_guards,
    tracer_warnings,
)
from onnxport.exporters.opsets import (
    MIN_OPSET,
    candidate_opsets,
    default_opset,
    exporter_max_opset,
    lower_opsets,
    onnxruntime_max_opset,
    placement_problem,
)
from onnxport.exporters.strategies import (
    BASE_EXPORTER,
    CHOICES,
    CONTROL_FLOW,
    EXPORTERS,
    STRATEGIES,
    NotApplicable,
)
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.placement import Placement
from onnxport.runtime.sessions import GpuOptions, placement, session
from onnxport.sources.base import LoadedModel

# --------------------------------------------------------------------------- strategies


# --------------------------------------------------------------------------- entry point


PlacementOf = Callable[[Path], Placement]
"""Where a session on the GPU would put an ONNX file's nodes (:func:`onnxport.runtime.placement`)."""


def export(loaded: LoadedModel, path: str | Path, *, exporter: str = "auto", opset: int | None = None,
           external_data_threshold: int | None = None, device: str = "cpu", gpu: GpuOptions | None = None,
           placement_of: PlacementOf | None = None) -> ExportResult:
    """Export ``loaded`` to ``path``.

    ``auto`` tries the dynamo exporter, then the TorchScript exporter; when both fail, or the one that worked
    is caught freezing a branch, a loop or a dynamic dim, it goes on with the control-flow strategies (``cond``:
    the ``if`` as torch.cond, ``script``: torch.jit.script of the modules holding control flow, ``scan``: loops
    over a dynamic size as torch's scan, tried only when the model's code has such a loop) and keeps the first
    export that froze nothing (else the first that worked, for parity to judge).

    With no ``opset`` given, an export onnxruntime cannot run is made again at lower opsets; and on ``device``
    "cuda" (with the GPU providers' settings ``gpu``) an export whose placement leaves compute nodes on the CPU (an operator
    version the CUDA provider has no kernel for) is made again at the lower opsets where those operators change
    version, keeping the newest whose placement is clean (else the first: the placement diagnostic warns).
    ``placement_of`` replaces the real placement (a simulated one in tests).
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
    threshold = external_threshold() if external_data_threshold is None else external_data_threshold
    placed_of = (placement_of or functools.partial(placement, device="cuda", gpu=gpu)) if device == "cuda" else None
    size = state_bytes(loaded.flat)
    external = size > threshold
    attempts: list[Attempt] = []
    done: list[tuple[Attempt, Path, list[Diagnostic]]] = []  # successful attempts with their files
    failed_diags: list[Diagnostic] = []
    t_all = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_model(path)
    try:
        for name in order:
            if done and name in EXPORTERS:
                continue  # one plain export is enough: the other would freeze the same way
            if any(not a.frozen for a, _, _ in done):
                break
            if name == "scan" and exporter == "auto" and not controlflow.holds_loop(loaded.model):
                continue  # no loop in the model's own code for scan to keep
            base = BASE_EXPORTER[name]
            use_opset = min(opset, exporter_max_opset(base)) if opset else default_opset(base)
            target = path.with_name(f".{name}-{path.name}")
            lines = evidence_lines(attempts, [d for _, _, ds in done for d in ds] + failed_diags, loaded,
                                   explicit=exporter == name)
            attempt, diags, failed, tries = _export_one(name, loaded, target, use_opset, external, lines, attempts,
                                                        fallback=opset is None, placed_of=placed_of)
            attempts.extend(tries)
            attempts.append(attempt)
            failed_diags.extend(failed)
            if attempt.ok:
                done.append((attempt, target, diags))
        if not done:
            summary = "; ".join(f"{a.exporter}: {a.error}" for a in attempts
                                if not a.not_applicable)
            raise ExportFailed(f"no exporter could export the model ({summary})",
                               "see the attempts in report.json; try --exporter torchscript or dynamo, or another "
                               "--opset", code="export-failed", attempts=tuple(attempts),
                               diagnostics=tuple(failed_diags))
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
            remove_model(path.with_name(f".{name}-{path.name}"))


def _attempt(name: str, loaded: LoadedModel, target: Path, opset: int, external: bool,
             lines: list[tuple[str, int]], before: list[Attempt]
             ) -> tuple[Attempt, list[Diagnostic], list[Diagnostic]]:
    """One strategy, its output captured: (the attempt, what it saw when it worked, what it saw when it failed)."""
    t0 = time.perf_counter()
    chatter: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught, captured_output(chatter):
            warnings.simplefilter("always")
            made = STRATEGIES[name](loaded, target, opset, external, lines)
    except NotApplicable as e:
        return Attempt(name, False, time.perf_counter() - t0, opset, str(e), not_applicable=True), [], []
    except Exception as e:  # noqa: BLE001 - every failure is recorded and the next strategy tried
        detail = "".join(traceback.format_exception_only(type(e), e))[-6000:] + "\n" + "".join(chatter)[-6000:]
        return (Attempt(name, False, time.perf_counter() - t0, opset, first_line(e), detail, parse_guards(chatter)),
                [], tracer_warnings(caught))
    diags = tracer_warnings(caught) + list(made or [])
    if name in CONTROL_FLOW and (refused := _ort_refuses(target)):
        return (Attempt(name, False, time.perf_counter() - t0, opset, f"onnxruntime cannot load the result: {refused}"),
                [], [])
    written = onnx.load(str(target), load_external_data=False)
    actual = next((o.version for o in written.opset_import if o.domain in ("", "ai.onnx")), opset)
    guards = parse_guards(chatter)
    frozen = frozen_reason(loaded, written, diags, guards)
    if not frozen and name == "torchscript":
        frozen = data_dependent_before(before)
    note = "; ".join(d.message for d in diags if d.code in ("control-flow-kept", packed.CODE)) or None
    return Attempt(name, True, time.perf_counter() - t0, actual, guards=guards, frozen=frozen, note=note), diags, []


Made = tuple[Attempt, list[Diagnostic], list[Diagnostic]]


def _export_one(name: str, loaded: LoadedModel, target: Path, opset: int, external: bool,
                lines: list[tuple[str, int]], before: list[Attempt], *, fallback: bool,
                placed_of: PlacementOf | None) -> tuple[Attempt, list[Diagnostic], list[Diagnostic], list[Attempt]]:
    """One strategy at ``opset``, then (``fallback``: no opset was given) the opset fallbacks: onnxruntime
    cannot run the export, and (``placed_of``: on a GPU) its placement leaves compute nodes on the CPU.
    Returns the attempt kept (its file at ``target``), its diagnostics, its failure diagnostics and the tries
    rejected before it."""
    attempt, diags, failed = _attempt(name, loaded, target, opset, external, lines, before)
    tries: list[Attempt] = []
    if not (attempt.ok and fallback):
        return attempt, diags, failed, tries
    if broken := _ort_cannot_run(target, loaded, opset):
        if _custom_domain(target):
            return attempt, diags, failed, tries  # no opset changes a custom operator: parity says why
        lower, skipped = _lower_opsets(name, loaded, target, range(opset - 1, MIN_OPSET - 1, -1), external,
                                       lines, before + [attempt], lambda p, v: _ort_cannot_run(p, loaded, v),
                                       f"onnxruntime could not run the opset-{opset} export")
        if lower is None:  # else the newest opset onnxruntime runs; parity says why none does
            return attempt, diags, failed, tries
        tries = [dataclasses.replace(attempt, ok=False, error=broken), *skipped]
        attempt, diags, failed = lower
    placed = _placed(placed_of, target)
    problem = placement_problem(placed, attempt.opset)
    if placed is None or problem is None:
        return attempt, diags, failed, tries
    ops = placed.compute_op_types
    versions = candidate_opsets(attempt.opset, ops)

    def why_not(path: Path, version: int) -> str | None:
        return _ort_cannot_run(path, loaded, version) or placement_problem(_placed(placed_of, path), version)

    lower, rejected = _lower_opsets(name, loaded, target, versions, external, lines, before + tries + [attempt],
                                    why_not, f"at opset {attempt.opset} {', '.join(ops)} ran on the CPU")
    if lower is None:
        tried = (f"opset{'s' if len(versions) > 1 else ''} {', '.join(map(str, versions))} did not" if versions
                 else "no lower opset changes them")
        note = f"opset {attempt.opset} kept: {', '.join(ops)} stay on the CPU ({tried})"
        kept = dataclasses.replace(attempt, note="; ".join(filter(None, (attempt.note, note))))
        return kept, diags, failed, tries + rejected
    return (*lower, tries + [dataclasses.replace(attempt, ok=False, error=problem), *rejected])


def _lower_opsets(name: str, loaded: LoadedModel, target: Path, versions: Iterable[int], external: bool,
                  lines: list[tuple[str, int]], before: list[Attempt], why_not: Callable[[Path, int], str | None],
                  reason: str) -> tuple[Made | None, list[Attempt]]:
    """``name`` again at each of ``versions`` (newest first) until ``why_not`` finds nothing wrong with the
    export, written over ``target``: (that attempt, its diagnostics, its failure diagnostics — None when no
    version is good or one fails to export: ``target`` then still holds the first export) and the tries
    rejected, each with its reason."""
    rejected: list[Attempt] = []
    trials: dict[int, Path] = {}

    def build(version: int) -> Made | None:
        trials[version] = trial = target.with_name(f".opset{version}-{target.name}")
        made = _attempt(name, loaded, trial, version, external, lines, before + rejected)
        return made if made[0].ok else None

    def reject(version: int, made: Made) -> str | None:
        why = why_not(trials[version], version)
        if why is not None:
            rejected.append(dataclasses.replace(made[0], ok=False, error=why))
        return why

    try:
        kept, _ = lower_opsets(versions, build, reject)
        if kept is None:
            return None, rejected
        version, (attempt, diags, failed) = kept
        move_model(trials[version], target)
        note = "; ".join(filter(None, (attempt.note, f"opset {version}: {reason}")))
        return (dataclasses.replace(attempt, note=note), diags, failed), rejected
    finally:
        for trial in trials.values():
            remove_model(trial)


def _custom_domain(path: Path) -> bool:
    """Whether ``path`` imports an operator domain of its own (not ONNX's or onnxruntime's)."""
    model = onnx.load(str(path), load_external_data=False)
    return any(o.domain not in ("", "ai.onnx", "com.microsoft") for o in model.opset_import)


def _placed(placed_of: PlacementOf | None, path: Path) -> Placement | None:
    """``placed_of(path)``, None when there is none or it cannot say (the file then stays as it is)."""
    if placed_of is None:
        return None
    try:
        return placed_of(path)
    except Exception:  # noqa: BLE001 - a placement that cannot be read changes nothing
        return None


def _ort_cannot_run(path: Path, loaded: LoadedModel, opset: int) -> str | None:
    """Why onnxruntime cannot load ``path`` or run it on the export example (None when it can): an operator
    version it has no kernel for, or one it refuses at run time (e.g. RotaryEmbedding's cache shapes)."""
    try:
        sess = session(path)
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        msg = str(getattr(e, "message", e)).split("failed:")[-1].strip()
        return f"onnxruntime cannot load the opset-{opset} export: {one_line(msg, 240)}"
    feed = FeedMap.of(loaded.inputs, sess)
    try:
        sess.run(None, feed(make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)))
    except Exception as e:  # noqa: BLE001
        return f"onnxruntime cannot run the opset-{opset} export: {one_line(e, 240)}"
    return None


def _ort_refuses(path: Path) -> str | None:
    """Why onnxruntime refuses to load ``path`` (None when it loads). The TorchScript exporter can write Loop
    bodies with inconsistent types; such a file is no better than a failed export."""
    try:
        session(path, opt_level="disable")
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        return str(getattr(e, "message", e)).split("failed:")[-1].strip()[:300]
    return None


