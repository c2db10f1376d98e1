"""The strategy chain: try the exporters in order, record every attempt, keep the first export that froze
nothing."""

from __future__ import annotations

import dataclasses
import functools
import re
import time
import traceback
import warnings
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxport.core.diagnostics import Diagnostic
from onnxport.core.errors import DiskFull, ExportFailed, UsageError, disk_full, one_line
from onnxport.core.logs import captured_output
from onnxport.core.onnxfile import external_threshold, move_model, remove_model, state_bytes
from onnxport.core.records import Attempt, ExportResult
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.exporters import controlflow, packed, patches
from onnxport.exporters.evidence import (
    DATA_DEPENDENT,
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
    AUTO_OVER_LIMIT,
    BASE_EXPORTER,
    CHOICES,
    CONTROL_FLOW,
    DYNAMO_OVER_LIMIT,
    EXPORTERS,
    RESIZED,
    STRATEGIES,
    NotApplicable,
    resized_sizes,
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
    """Export ``loaded`` to ``path``: the first file :func:`candidates` offers (the caller does not prove it)."""
    found = candidates(loaded, path, exporter=exporter, opset=opset, external_data_threshold=external_data_threshold,
                       device=device, gpu=gpu, placement_of=placement_of)
    try:
        return next(found)
    finally:
        found.close()


Candidates = Generator[ExportResult, "str | None", tuple[Attempt, ...]]
"""Export files offered one at a time: ``send`` why the last one was not proven to get the next; the attempts
(all of them, each rejected one marked) are the generator's return value when no strategy is left."""


def candidates(loaded: LoadedModel, path: str | Path, *, exporter: str = "auto", opset: int | None = None,
               external_data_threshold: int | None = None, device: str = "cpu", gpu: GpuOptions | None = None,
               placement_of: PlacementOf | None = None) -> Candidates:
    """The exports of ``loaded``, each written to ``path`` and offered in turn until the caller proves one.

    ``auto`` tries the dynamo exporter; the TorchScript exporter when dynamo fails, fixes a declared dim or its
    file is not proven; then the control-flow strategies (``cond``: the ``if`` as torch.cond, ``script``:
    torch.jit.script of the modules holding control flow, ``scan``: loops over a dynamic size as torch's scan,
    tried only when the model's code has such a loop); then the TorchScript exporter if not tried yet; then
    dynamo again at other example sizes (odd, not 1: another path through size tests and divisibility
    guards) when its first export failed, fixed a dim or was not proven. Each export that froze nothing is
    offered as soon as it is made; those caught freezing a branch, a loop or a dynamic dim are offered last, in
    order (parity judges them). Raises ExportFailed when no strategy exports anything.

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
    tries = _Tries(loaded, path, exporter, opset, state_bytes(loaded.flat) > threshold, placed_of)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_model(path)
    plan = list(order)
    try:
        while (name := tries.next_strategy(plan)) is not None:
            made = tries.run(name)
            if made is not None and not made[0].frozen:
                tries.rejected(made[0], (yield tries.offer(made)))
        for entry in [d for d in tries.done if d[0].frozen]:  # frozen ones last: parity judges them
            tries.rejected(entry[0], (yield tries.offer(entry)))
        if not tries.done:
            summary = "; ".join(f"{a.exporter}: {a.error}" for a in tries.attempts if not a.not_applicable)
            raise ExportFailed(f"no exporter could export the model ({summary})",
                               "see the attempts in report.json; try --exporter torchscript or dynamo, or another "
                               "--opset", code="export-failed", attempts=tuple(tries.attempts),
                               diagnostics=tuple(tries.failed_diags))
        return tuple(tries.attempts)
    finally:
        for target in tries.targets:
            remove_model(target)


Done = tuple[Attempt, Path, list[Diagnostic]]  # a successful attempt, its file and what it saw


@dataclass
class _Tries:
    """The state of one chain: the attempts so far, the files that worked, the scratch files to remove."""

    loaded: LoadedModel
    path: Path
    exporter: str
    opset: int | None
    external: bool
    placed_of: PlacementOf | None
    attempts: list[Attempt] = field(default_factory=list)
    done: list[Done] = field(default_factory=list)
    failed_diags: list[Diagnostic] = field(default_factory=list)
    targets: list[Path] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.perf_counter)

    def next_strategy(self, plan: list[str]) -> str | None:
        """The next strategy of ``plan`` worth running (None: none is left)."""
        auto = self.exporter == "auto"
        while True:
            if not plan:
                if not auto or RESIZED in self.tried or not _dynamo_worth_resizing(self.attempts):
                    return None
                plan.append(RESIZED)
            name = plan.pop(0)
            if auto and name == "torchscript":
                if "torchscript" in self.tried:
                    continue
                if self.done and not _plain_failed(self.done[0][0]) and "torchscript-deferred" not in self.tried:
                    self.tried.add("torchscript-deferred")  # the dynamo file froze a branch or loop: the
                    plan.append("torchscript")  # control-flow strategies keep it, so they go first
                    continue
            if auto and name == "scan" and not controlflow.holds_loop(self.loaded.model):
                continue  # no loop in the model's own code for scan to keep
            self.tried.add(name)
            return name

    def run(self, name: str) -> Done | None:
        """One strategy (with its opset fallbacks), recorded; its file when it worked."""
        loaded = self.loaded
        base = BASE_EXPORTER[name]
        use_opset = min(self.opset, exporter_max_opset(base)) if self.opset else default_opset(base)
        target = self.path.with_name(f".{name}-{self.path.name}")
        self.targets.append(target)
        lines = evidence_lines(self.attempts, [d for _, _, ds in self.done for d in ds] + self.failed_diags, loaded,
                               explicit=self.exporter == name)
        attempt, diags, failed, tries = _export_one(name, loaded, target, use_opset, self.external, lines,
                                                    self.attempts, fallback=self.opset is None,
                                                    placed_of=self.placed_of)
        if name == RESIZED:
            attempt = dataclasses.replace(attempt, exporter="dynamo", note="; ".join(
                filter(None, (f"{RESIZED_NOTE} ({_sizes_text(loaded)})", attempt.note))))
        self.attempts.extend([*tries, attempt])
        self.failed_diags.extend(failed)
        if not attempt.ok:
            return None
        self.done.append((attempt, target, diags))
        return self.done[-1]

    def offer(self, chosen: Done) -> ExportResult:
        """``chosen``'s file moved to the chain's path, as an export result."""
        remove_model(self.path)
        move_model(chosen[1], self.path)
        diags = list(chosen[2])
        for a, _, ds in self.done:  # what other attempts saw is history: keep it, as info
            if a is not chosen[0]:
                diags += [dataclasses.replace(d, severity="info", message=f"{a.exporter} attempt: {d.message}")
                          for d in ds if d.code != "control-flow-kept"]
        return ExportResult(self.path, chosen[0].exporter, chosen[0].opset, time.perf_counter() - self.started,
                            tuple(self.attempts), self.external, tuple(diags))

    def rejected(self, attempt: Attempt, why: str | None) -> None:
        """``attempt``'s file was not proven (``why``): marked so in the attempts."""
        marked = dataclasses.replace(attempt, unproven=why or "not proven")
        self.attempts = [marked if a is attempt else a for a in self.attempts]
        self.done = [(marked, p, ds) if a is attempt else (a, p, ds) for a, p, ds in self.done]


def _sizes_text(loaded: LoadedModel) -> str:
    return ", ".join(f"{k}={v}" for k, v in (resized_sizes(loaded.dims) or {}).items())


def _plain_failed(attempt: Attempt) -> bool:
    """Whether the first plain export calls for the other plain exporter: it failed, fixed a declared dim or was
    not proven (a frozen branch or loop goes to the control-flow strategies first)."""
    return not attempt.ok or attempt.unproven is not None or (attempt.frozen or "").startswith(_DIM_FREEZES)


_DIM_FREEZES = ("dynamic dim", "torch.export assumed")


def _dynamo_worth_resizing(attempts: list[Attempt]) -> bool:
    """Whether dynamo is worth another try at other example sizes: its export failed on a shape guard, fixed a
    declared dim, or was not proven; once only."""
    first = next((a for a in attempts if a.exporter == "dynamo"), None)
    if first is None:
        return False
    if first.ok:
        return first.unproven is not None or (first.frozen or "").startswith(_DIM_FREEZES)
    detail = first.detail or ""
    if AUTO_OVER_LIMIT in detail or DYNAMO_OVER_LIMIT in detail:  # torch.export ran out of time: it would again
        return False
    return bool(_SHAPE_FAILURE.search(detail)) and not DATA_DEPENDENT.search(detail)


RESIZED_NOTE = "exported at other example sizes"
_RUN_NODE = re.compile(r"running (\w+) node")


def _opsets_to_try(broken: str, opset: int) -> list[int]:
    """The lower opsets worth another export when onnxruntime cannot run the opset-``opset`` one (newest first):
    every one when it cannot load the file (a missing kernel); when one node fails at run time, only those where
    that node's operator has another version (a shape error is the same at every opset)."""
    node = _RUN_NODE.search(broken)
    if "cannot run" not in broken or node is None:
        return list(range(opset - 1, MIN_OPSET - 1, -1))
    return candidate_opsets(opset, [node.group(1)])
_SHAPE_FAILURE = re.compile(r"Constraints violated|specializ", re.I)


def _attempt(name: str, loaded: LoadedModel, target: Path, opset: int, external: bool,
             lines: list[tuple[str, int]], before: list[Attempt]
             ) -> tuple[Attempt, list[Diagnostic], list[Diagnostic]]:
    """One strategy, its output captured: (the attempt, what it saw when it worked, what it saw when it failed)."""
    t0 = time.perf_counter()
    chatter: list[str] = []
    try:
        with (warnings.catch_warnings(record=True) as caught, captured_output(chatter),
              patches.applied(loaded, BASE_EXPORTER[name]) as patched):
            warnings.simplefilter("always")
            made = [*(STRATEGIES[name](loaded, target, opset, external, lines) or []), *patched]
    except NotApplicable as e:
        return Attempt(name, False, time.perf_counter() - t0, opset, str(e), not_applicable=True), [], []
    except Exception as e:  # noqa: BLE001 - every failure is recorded and the next strategy tried
        if disk_full(e):
            raise DiskFull(f"the {name} export") from e
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
        versions = _opsets_to_try(broken, opset)
        if not versions:
            return attempt, diags, failed, tries  # no other opset changes the failing operator: parity says why
        lower, skipped = _lower_opsets(name, loaded, target, versions, external,
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


