"""ONNX Runtime session-option search: one setting changed at a time, each timed against the best so far."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from onnxport.bench.harness import timed_blocks
from onnxport.core.logs import Progress, noop
from onnxport.runtime.backends import OrtBackend, OrtOptions, default_threads

TUNE_KEYS = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "graph_optimization_level",
             "enable_mem_pattern", "enable_cpu_mem_arena")
"""The session options ``tune`` searches and returns, in order."""


def _measure(backends: list[OrtBackend], feeds: dict[str, np.ndarray], seconds: float, min_runs: int = 5,
             block: int = 3) -> list[float]:
    """Interleaved p50 (ms) of already-open ONNX Runtime backends on ``feeds`` within about ``seconds``."""
    for b in backends:
        b.run(feeds)
    times = timed_blocks({str(i): functools.partial(b.run, feeds) for i, b in enumerate(backends)},
                         seconds=seconds, min_runs=min_runs, block=block)
    return [float(np.percentile(times[str(i)], 50)) * 1e3 for i in range(len(backends))]


def _candidates(threads: int) -> list[dict]:
    """One-setting changes tried in turn against the best configuration so far."""
    out: list[dict] = [{"graph_optimization_level": lvl} for lvl in ("extended", "basic")]
    for n in sorted({threads - 1, threads // 2} - {0, threads}, reverse=True):
        out.append({"intra_op_num_threads": n})
    if threads > 1:
        out.append({"execution_mode": "parallel", "inter_op_num_threads": min(2, threads)})
    out += [{"enable_mem_pattern": False}, {"enable_cpu_mem_arena": False}, {"graph_optimization_level": "disable"}]
    return out


def tune(onnx_path: str | Path, feeds: dict[str, np.ndarray], *, threads: int | None = None,
         budget_s: float = 30.0, progress: Progress | None = None) -> dict:
    """Search ONNX Runtime session options for ``onnx_path`` on ``feeds`` within about ``budget_s`` seconds.

    Starts from the defaults (all threads, sequential, ORT_ENABLE_ALL, arena and memory pattern on) and
    tries one change at a time, each measured interleaved with the best so far; a change is kept when
    its p50 is at least 3% lower. Returns ``{"config": {<TUNE_KEYS>}, "p50_ms", "baseline_p50_ms",
    "speedup", "trials": [...], "seconds"}``.
    """
    say = progress or noop
    threads = threads or default_threads()
    t_start = time.perf_counter()
    best = {"intra_op_num_threads": threads, "inter_op_num_threads": 1, "execution_mode": "sequential",
            "graph_optimization_level": "all", "enable_mem_pattern": True, "enable_cpu_mem_arena": True}
    cands = _candidates(threads)
    per_trial = max(0.2, budget_s / (len(cands) + 3))
    current = OrtBackend(onnx_path, options=OrtOptions.from_dict(best), name="tune:best")
    current.open()
    (baseline,) = _measure([current], feeds, per_trial / 2)
    best_p50 = baseline
    trials: list[dict] = [{"change": {}, "p50_ms": round(baseline, 4), "accepted": True}]
    say(f"tune: defaults p50 {baseline:.2f} ms")
    for change in cands:
        if time.perf_counter() - t_start > budget_s:
            break
        config = {**best, **change}
        cand = OrtBackend(onnx_path, options=OrtOptions.from_dict(config), name="tune:candidate")
        try:
            cand.open()
            best_p50, cand_p50 = _measure([current, cand], feeds, per_trial)
        except Exception as e:  # noqa: BLE001 - a setting this model cannot run with is simply not chosen
            trials.append({"change": change, "p50_ms": None, "accepted": False, "error": str(e)[:200]})
            continue
        accepted = cand_p50 < 0.97 * best_p50
        if accepted:  # confirm in a second window: one noisy window must not pick a setting
            best_p50, cand_p50 = _measure([current, cand], feeds, per_trial)
            accepted = cand_p50 < 0.97 * best_p50
        trials.append({"change": change, "p50_ms": round(cand_p50, 4), "best_p50_ms": round(best_p50, 4),
                       "accepted": accepted})
        say(f"tune: {change} p50 {cand_p50:.2f} ms vs {best_p50:.2f} ms{' (kept)' if accepted else ''}")
        if accepted:
            current.close()
            best, current, best_p50 = config, cand, cand_p50
        else:
            cand.close()
    current.close()
    return {"config": {k: best[k] for k in TUNE_KEYS}, "p50_ms": round(best_p50, 4),
            "baseline_p50_ms": round(baseline, 4), "speedup": round(baseline / best_p50, 4) if best_p50 else None,
            "trials": trials, "seconds": round(time.perf_counter() - t_start, 2)}
