"""The machinery every model kind's variants share: a variant is a pass — its builder writes a file (requires: the
proven export), its kind's judge re-proves it against PyTorch (ensures: parity), and it is chosen only when it
is clearly faster than the export.

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
from typing import Any, TypeVar

from onnxport.core.errors import DiskFull, disk_full
from onnxport.core.logs import Progress
from onnxport.core.onnxfile import move_model, remove_model
from onnxport.optimize.context import BuildOutcome, Skip
from onnxport.optimize.graph import replace_model, short_error
from onnxport.optimize.result import SkipReason

MIN_GAIN = 1.05  # a variant must beat the plain export by 5% to replace it (a smaller lead is timing noise)
BEST = "best.onnx"

V = TypeVar("V")


def clearly_faster(speedup: float | None) -> bool:
    """Whether a variant ``speedup`` times the export's speed is enough to replace the export."""
    return bool(speedup) and speedup >= MIN_GAIN


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
