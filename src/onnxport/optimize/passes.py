"""The machinery every model kind's variants share: a variant is a pass — its builder writes a file (requires: the
proven export), its kind's judge re-proves it against PyTorch (ensures: parity), and it is chosen only when it
is clearly faster than the export.

* :class:`VariantPass`: one variant as a pass, in the manner of onnx-ir's ``PassBase`` (requires → call →
  ensures → result), whatever the kind: the kind gives its builder, its judge and how it records a variant the
  pass did not bring to a verdict (:class:`Unmade`);
* :func:`choose_best`: the one best-selection (the passing entry with the highest speedup over the export; the
  export itself unless that one is clearly faster), :func:`fastest` its ranking;
* :func:`build_into`: a builder run into a temporary name beside its file, moved into OUT/variants/ when written;
  its seconds recorded; :class:`~onnxport.optimize.context.Skip` and a crash caught (a crashing builder is a
  failed variant, never a crash of the run);
* :class:`Budget`: ``--budget`` (no variant started after it);
* :func:`each_variant`: the loop over the names asked for, the plan's and the budget's skips recorded, the
  progress line saying which and about how long is left;
* :data:`MIN_GAIN` / :func:`clearly_faster`: a variant replaces the export only when at least 5% faster;
  :func:`install_best` copies the chosen one to OUT/best.onnx.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from onnxport.core.errors import DiskFull, disk_full
from onnxport.core.logs import Progress
from onnxport.core.onnxfile import move_model, remove_model
from onnxport.optimize.context import BuildOutcome, Skip
from onnxport.optimize.graph import replace_model, short_error
from onnxport.optimize.result import SkipReason

MIN_GAIN = 1.05  # a variant must beat the plain export by 5% to replace it (a smaller lead is timing noise)
BEST = "best.onnx"

V = TypeVar("V")
R = TypeVar("R")


def clearly_faster(speedup: float | None) -> bool:
    """Whether a variant ``speedup`` times the export's speed is enough to replace the export."""
    return bool(speedup) and speedup >= MIN_GAIN


class Entry(Protocol):
    """What the best-selection reads of any kind's variant record."""

    @property
    def name(self) -> str: ...

    @property
    def passed(self) -> bool: ...


E = TypeVar("E", bound=Entry)
T = TypeVar("T")


def fastest(entries: Sequence[T], speedup: Callable[[T], float | None],
            size: Callable[[T], int | None] = lambda e: None,
            passed: Callable[[T], bool] = lambda e: e.passed) -> T | None:
    """The passing entry with the highest ``speedup`` (ties: the smaller ``size``); None when none passed with
    a speedup. The one ranking every best-selection uses (:func:`choose_best`, and
    :func:`~onnxport.optimize.choice.select_best` over report.json dicts, which reads ``passed`` through its
    own accessor)."""
    ranked = [(s, e) for e in entries if passed(e) and (s := speedup(e)) is not None]
    if not ranked:
        return None
    return min(ranked, key=lambda se: (-se[0], size(se[1]) or 0))[1]


def choose_best(entries: Sequence[E], speedup: Callable[[E], float | None],
                size: Callable[[E], int | None] = lambda e: None, baseline: str = "export") -> E | None:
    """Every kind's best: the :func:`fastest` passing entry when it is :func:`clearly_faster` than the export
    (``baseline``), else the export when it passed (a smaller lead is timing noise, and the export is the file
    proven most strictly), else None."""
    base = next((e for e in entries if e.name == baseline and e.passed), None)
    top = fastest(entries, speedup, size)
    if top is not None and top.name != baseline and clearly_faster(speedup(top)):
        return top
    return base


def install_best(path: Path, out: Path) -> Path:
    """Copy the chosen file (and its external data) to OUT/best.onnx; returns that path."""
    best = Path(out) / BEST
    replace_model(Path(path), best)
    return best


@dataclass(frozen=True)
class Built:
    """One builder's run: its outcome, or the Skip it raised, or why it crashed; ``seconds``: building alone
    (a proof the builder made itself is counted in ``outcome.prove_seconds``)."""

    dst: Path
    outcome: BuildOutcome | None
    seconds: float
    skip: Skip | None = None
    error: str | None = None  # ``Type: message`` of a builder that crashed

    @property
    def file(self) -> Path | None:
        """The file the variant runs (a session-option variant runs one built before)."""
        if self.outcome is None:
            return None
        return self.outcome.path or self.dst


def build_into(builder: Callable[[Path, Path, Any], BuildOutcome], src: Path, dst: Path, ctx: Any) -> Built:
    """Run ``builder(src, tmp, ctx)`` into a temporary name beside ``dst`` and move what it wrote to ``dst`` (a
    stale ``dst`` removed first, a half-written one never left there)."""
    remove_model(dst)
    tmp = dst.with_name(f".{dst.stem}.building.onnx")
    remove_model(tmp)
    t0 = time.perf_counter()
    try:
        outcome = builder(src, tmp, ctx)
        if tmp.exists():
            move_model(tmp, dst)
    except Skip as e:
        return Built(dst, None, time.perf_counter() - t0, skip=e)
    except Exception as e:  # noqa: BLE001 - a tool that crashes is a failed variant, not a crash
        if disk_full(e):
            raise DiskFull(str(dst.name)) from e
        return Built(dst, None, time.perf_counter() - t0, error=short_error(e))
    finally:
        remove_model(tmp)
    return Built(dst, outcome, time.perf_counter() - t0 - outcome.prove_seconds)


@dataclass(frozen=True)
class Budget:
    """``--budget``: no variant is started ``seconds`` after ``start`` (None: no budget)."""

    start: float
    seconds: float | None = None

    @property
    def deadline(self) -> float | None:
        return None if self.seconds is None else self.start + self.seconds

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() > self.start + self.seconds

    def why(self) -> str:
        return f"not built: the --budget of {self.seconds or 0:.0f} s was spent"


def each_variant(names: Sequence[str], run: Callable[[str, Progress], V], skip: Callable[[str, str, SkipReason], V],
                 progress: Progress, budget: Budget, planned_out: Mapping[str, tuple[str, SkipReason]] = {}
                 ) -> list[V]:
    """``run(name, progress)`` for every name in order, except those the plan leaves out (``planned_out``: name ->
    (why, reason)) and those after the budget is spent, which are ``skip(name, why, reason)``. The progress
    line is prefixed ``[i/n, about s left]``."""
    todo = [n for n in names if n not in planned_out]
    spent: list[float] = []
    entries: list[V] = []
    for name in names:
        if name in planned_out:
            entries.append(skip(name, *planned_out[name]))
            continue
        if budget.spent():
            entries.append(skip(name, budget.why(), SkipReason.BUDGET))
            continue
        left = len(todo) - len(spent)
        eta = f", about {sum(spent) / len(spent) * left:.0f} s left" if spent else ""
        prefix = f"[{len(spent) + 1}/{len(todo)}{eta}] "
        t0 = time.perf_counter()
        entries.append(run(name, lambda message, prefix=prefix: progress(prefix + message)))
        spent.append(time.perf_counter() - t0)
    return entries


@dataclass(frozen=True)
class Unmade:
    """A variant its pass did not bring to a verdict: the ``stage`` it stopped at ("requires": no proven file to
    start from; "call": its builder skipped or crashed; "ensures": its judge could not run it), why in words,
    the :class:`SkipReason` of a skip, the file when one was built, the builder's notes and seconds."""

    name: str
    stage: str
    why: str
    reason: SkipReason | None = None
    path: Path | None = None
    notes: tuple[str, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class VariantPass(Generic[R]):
    """One variant as a pass, in the manner of onnx-ir's ``PassBase``: :meth:`requires` (the proven export it
    starts from exists), :meth:`call` (the kind's build: ``build()``, usually :func:`build_into`; None: the
    export itself, the baseline), :meth:`ensures` (the kind's judge re-proves the file against PyTorch:
    ``judge(built)``, the :class:`Built` record). Calling the pass runs the three and returns the kind's record: the judge's, or
    ``unmade(Unmade)``'s for a variant stopped on the way. ``raised``: what a judge raises that stops the run
    rather than the variant (a full disk always; the plain kind's judge: every typed onnxport error, since it
    records a file onnxruntime cannot load itself, while a decoder's session raises UsageError for that)."""

    name: str
    src: Path
    build: Callable[[], Built] | None
    judge: Callable[[Built], R]
    unmade: Callable[[Unmade], R]
    baseline_notes: tuple[str, ...] = ()
    raised: tuple[type[Exception], ...] = ()

    def requires(self) -> Unmade | None:
        """None when the pass can run; else why not."""
        if self.src.exists():
            return None
        return Unmade(self.name, "requires", f"the proven file {self.src.name} is missing")

    def call(self) -> Built | Unmade:
        """The built file (the export itself for the baseline), or why there is none."""
        if self.build is None:
            return Built(self.src, BuildOutcome(notes=self.baseline_notes, path=self.src), 0.0)
        made = self.build()
        if made.skip is not None:
            return Unmade(self.name, "call", str(made.skip), made.skip.reason, notes=made.skip.notes,
                          seconds=made.seconds)
        if made.outcome is None:
            return Unmade(self.name, "call", made.error or "the builder wrote nothing", seconds=made.seconds)
        return made

    def ensures(self, made: Built) -> R:
        """The judge's record of the built file; a judge that cannot run it gives an :class:`Unmade`."""
        file = made.file or made.dst
        notes = made.outcome.notes if made.outcome is not None else ()
        try:
            return self.judge(made)
        except (DiskFull, *self.raised):
            raise
        except Exception as e:  # noqa: BLE001 - a variant failing is recorded, the others go on
            if disk_full(e):
                raise DiskFull() from e
            return self.unmade(Unmade(self.name, "ensures", short_error(e), path=file, notes=notes,
                                      seconds=made.seconds))

    def __call__(self) -> R:
        stopped = self.requires()
        if stopped is not None:
            return self.unmade(stopped)
        made = self.call()
        return self.unmade(made) if isinstance(made, Unmade) else self.ensures(made)
