"""The one timing loop: interleaved warm blocks of calls, and the statistics of their wall times."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence

import numpy as np

from onnxport.core.errors import UsageError


def stats(times_s: Sequence[float], batch: int) -> dict:
    """Statistics of per-iteration times in seconds: percentiles (numpy, linear), mean, std (ddof=0) in ms.

    ``throughput`` is items per second: ``batch`` / mean seconds.
    """
    if not len(times_s):
        raise UsageError("no timings to summarize", "run the benchmark for at least one iteration")
    t = np.asarray(times_s, dtype=np.float64)
    p50, p90, p99 = np.percentile(t, [50, 90, 99], method="linear")
    mean = float(t.mean())
    return {"p50_ms": float(p50) * 1e3, "p90_ms": float(p90) * 1e3, "p99_ms": float(p99) * 1e3,
            "mean_ms": mean * 1e3, "std_ms": float(t.std()) * 1e3, "min_ms": float(t.min()) * 1e3,
            "max_ms": float(t.max()) * 1e3, "runs": int(t.size),
            "throughput": batch / mean if mean > 0 else float("inf")}


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` runs of ``fn``, in seconds (a whole run timed: a generation loop, a pipeline)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def interleave(names: Sequence[str], round_index: int) -> list[str]:
    """The backend order of one round: ``names`` rotated by the round number."""
    if not names:
        return []
    k = round_index % len(names)
    return list(names[k:]) + list(names[:k])


def timed_blocks(runs: dict[str, Callable[[], object]], *, seconds: float, min_runs: int = 5, block: int = 3,
                 enough_at_min_runs: bool = False) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument ``runs[name]``, interleaved in blocks.

    Each round gives every callable one untimed call (caches and the other runtime's spinning threads
    settle) then ``block`` timed calls, in an order rotated per round. It stops once ``seconds`` have passed
    and each has ``min_runs`` times; with ``enough_at_min_runs``, as soon as each has ``min_runs`` (``seconds``
    is then a cap). Blocks keep each model's weights warm in the cache, as in production; interleaving them
    spreads machine noise over all alike. GC is off while timing.
    """
    times: dict[str, list[float]] = {n: [] for n in runs}
    block = max(1, min(block, min_runs))
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    t_end = time.perf_counter() + seconds
    try:
        r = 0
        while True:
            for name in interleave(list(runs), r):
                fn = runs[name]
                fn()
                for _ in range(block):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
            r += 1
            counted = all(len(t) >= min_runs for t in times.values())
            late = time.perf_counter() >= t_end
            if (counted and (late or enough_at_min_runs)) or (late and enough_at_min_runs) or r > 100_000:
                break
    finally:
        if gc_was:
            gc.enable()
    return times
