"""The benchmark: PyTorch eager (and torch.compile) against ONNX Runtime (and OpenVINO), against the GEMM peak.

Method (``run``): one set of inputs per batch/sequence size, shared by every backend; warm-up; then
round-robin blocks of iterations over the backends (the order rotates every round, and each block
starts with one untimed iteration) so that machine noise hits all of them alike, until every backend
has ``min_runs`` timed iterations or ``max_seconds`` are spent. Per-iteration wall times give
p50/p90/p99/mean/std and throughput. The work per inference is counted in FLOPs on the reference ONNX
graph at the benchmarked shapes and set against the machine's measured fp32 GEMM peak.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from onnxport.bench.flopcount import flops
from onnxport.bench.harness import stats, timed_blocks
from onnxport.bench.peak import backend_precision, cache_dir, device_peak, peak_gflops
from onnxport.bench.resident import PER_CALL, RESIDENT, call_or_run
from onnxport.bench.tuning import tune
from onnxport.core.errors import UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.options import BenchOptions
from onnxport.core.samples import export_sizes, make_inputs, shapes_for
from onnxport.core.spec import InputSpec
from onnxport.runtime import environment
from onnxport.runtime.backends import (
    Backend,
    OpenVinoBackend,
    OrtBackend,
    OrtOptions,
    TorchBackend,
    compare_outputs,
    default_threads,
    openvino_available,
)
from onnxport.sources.base import LoadedModel


@dataclass(frozen=True)
class Run:
    """One backend at one input size."""

    backend: str
    batch: int
    seq: int | None
    shapes: dict[str, list[int]]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    runs: int
    throughput: float
    gflop: float | None = None  # work per inference (reference ONNX graph)
    gflops: float | None = None  # achieved, at the p50 time
    peak_pct: float | None = None  # of the measured GEMM peak in ``peak_precision``
    speedup: float | None = None  # PyTorch eager p50 / this p50
    max_abs_diff: float | None = None  # outputs against the first backend (PyTorch eager)
    peak_precision: str | None = None  # the precision of the peak ``peak_pct`` divides by (fp32, int8, bf16...)

    def to_dict(self) -> dict:
        """The report.json run dictionary: floats to 5 significant digits, non-finite ones as None."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = float(f"{v:.5g}") if math.isfinite(v) else None
        return d


@dataclass(frozen=True)
class BenchResult:
    """Every run, the thread count, the GEMM peak, the settings, the machine and (optionally) tuning."""

    threads: int
    runs: tuple[Run, ...]
    peak: dict | None
    settings: dict
    machine: dict
    load_average: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    tuned: dict | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """The report.json ``benchmark`` dictionary."""
        d = {"threads": self.threads, "runs": [r.to_dict() for r in self.runs],
             "peak_gflops": self.peak["gflops"] if self.peak else None, "peak": self.peak,
             "settings": self.settings, "machine": self.machine, "load_average": self.load_average,
             "notes": list(self.notes), "seconds": round(self.seconds, 2)}
        if self.tuned is not None:
            d["tuned"] = self.tuned
        return d


def bench_sizes(loaded: LoadedModel, batches: Sequence[int], seq_lens: Sequence[int] | None = None
                ) -> tuple[list[tuple[int, int | None, dict[str, int]]], list[str]]:
    """(batch, seq, dim sizes) to benchmark, and notes: batch on the leading dim, seq on token inputs' dims."""
    notes: list[str] = []
    sizes0 = export_sizes(loaded.dims)
    lead = loaded.inputs[0].shape[0] if loaded.inputs and loaded.inputs[0].shape else None
    batch_sym = lead if isinstance(lead, str) else None
    seq_syms = list(dict.fromkeys(
        d for s in loaded.inputs if s.dtype.startswith(("int", "uint")) for d in s.shape[1:]
        if isinstance(d, str) and d != batch_sym))
    if seq_lens and not seq_syms:
        raise UsageError("--seq needs an integer (token) input with a dynamic sequence dim",
                         "leave out the sequence sweep for this model")
    if any(b < 1 for b in batches) or any(s < 1 for s in seq_lens or ()):
        raise UsageError("batch and sequence sizes must be at least 1", "e.g. --batch 1 --batch 8")
    if batch_sym is None:
        fixed = int(lead) if isinstance(lead, int) else 1
        if any(b != fixed for b in batches):
            notes.append(f"the model's batch dim is fixed at {fixed}: benchmarked at batch {fixed} only")
        batches = [fixed]
    out = []
    for b in dict.fromkeys(batches):
        for s in (list(dict.fromkeys(seq_lens)) if seq_lens else [None]):
            sizes = dict(sizes0)
            if batch_sym:
                sizes[batch_sym] = b
            if s is not None:
                sizes.update({sym: s for sym in seq_syms})
            out.append((b, s if s is not None else (sizes[seq_syms[0]] if seq_syms else None), sizes))
    return out, notes


def sizes_at(loaded: LoadedModel, seq: int | None = None, batch: int = 1) -> dict[str, int]:
    """The dim sizes of one benchmark point: ``batch`` on the leading dim, ``seq`` on the token inputs' dims
    (the export sizes elsewhere); see :func:`bench_sizes`."""
    return dict(bench_sizes(loaded, [batch], [seq] if seq else None)[0][0][2])


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None

def spec_feeds(specs: Sequence[InputSpec], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Random inputs (seed 0) for ``specs`` at the dim ``sizes``, keyed by spec name as the Backend protocol
    takes them (each backend maps spec names to its own graph's inputs)."""
    return {s.name: t.numpy() for s, t in zip(specs, make_inputs(specs, sizes, "random", 0))}


@dataclass(frozen=True)
class _Timing:
    """How each size is timed: warm-up calls, timed iterations per backend, the time cap, the block length and
    whether ONNX Runtime sessions are timed device-resident (bench/resident.py)."""

    warmup: int
    min_runs: int
    max_seconds: float
    block: int
    resident: bool = False


def run(loaded: LoadedModel, onnx_paths: dict[str, Path], options: BenchOptions = BenchOptions(), *,
        device: str = "cpu", providers: list | None = None, openvino: bool | None = None,
        tune_budget_s: float = 30.0, peak: bool = True, progress: Progress | None = None,
        extra_backends: Sequence[Backend] = ()) -> BenchResult:
    """Benchmark PyTorch eager (and torch.compile if ``options.compile``) against each ONNX file in
    ``onnx_paths``.

    ``onnx_paths`` maps a backend label (e.g. "onnxruntime", "onnxruntime:best") to a file; the first is
    the reference graph for FLOP counts and for OpenVINO (``openvino``: None = when installed).
    ``options.max_seconds`` bounds the timed loop per batch/seq size; ``options.min_runs`` timed iterations per
    backend end it earlier. ``options.tune_ort`` searches session options on the first file (``tune``, within
    ``tune_budget_s``) and adds the tuned session as "onnxruntime:tuned". ``peak`` measures (or reads the
    cached) GEMM peak for the roofline. ``options.io_binding`` runs ONNX Runtime through IO binding and times
    it device-resident (inputs bound once per size on the session's device, outputs kept there, a CUDA graph
    replayed: bench/resident.py; None: on with ``device`` "cuda"). ``device``: on "cuda" the
    "% peak" is of the GPU's own matmul peak in the precision each backend computes in (bench/peak.py), not of
    the CPU's. ``extra_backends``: more backends to time, unopened (a variant run with its recorded session
    options: runtime.SessionBackend). ``providers``: the provider chain every ONNX file runs on (default: the
    CPU).
    """
    o = options
    batches, seq_lens, threads, compile = o.batches, o.seq_lens, o.threads, o.compile
    warmup, min_runs, max_seconds, block, tune_ort = o.warmup, o.min_runs, o.max_seconds, o.block, o.tune_ort
    io_binding = device == "cuda" if o.io_binding is None else o.io_binding
    say = progress or noop
    t_start = time.perf_counter()
    threads = threads or default_threads()
    onnx_paths = _checked_paths(onnx_paths, threads)
    sizes_list, notes = bench_sizes(loaded, batches, seq_lens)
    load_start = _load_avg()
    reference = next(iter(onnx_paths.values()), None)
    peak_info = None
    if peak:
        say(f"reading the {'GPU matmul' if device == 'cuda' else 'CPU GEMM'} peak for '% peak' (measured once per "
            f"{'GPU' if device == 'cuda' else 'CPU and thread count, a few seconds'}; cached in {cache_dir()})")
        peak_info = device_peak(device, threads)
        if peak_info.get("cache_warning"):
            notes.append(f"warning: {peak_info['cache_warning']}")
    tuned = None
    if reference is not None and tune_ort:
        say("tuning ONNX Runtime session options")
        tuned = tune(reference, spec_feeds(loaded.inputs, sizes_list[0][2]), threads=threads,
                     budget_s=tune_budget_s, progress=say)
    backends = _backends(loaded, onnx_paths, threads, compile=compile, openvino=openvino, io_binding=io_binding,
                         tuned=tuned, notes=notes, providers=providers) + list(extra_backends)
    timing = _Timing(warmup, min_runs, max_seconds, block, resident=io_binding)
    rows = _bench_all(loaded, backends, sizes_list, reference, peak_info, timing, notes, say)
    settings = {"warmup": warmup, "min_runs": min_runs, "max_seconds": max_seconds, "block": block,
                "batches": list(batches), "seq_lens": list(seq_lens) if seq_lens else None, "compile": compile,
                "timing": f"{RESIDENT} (ONNX Runtime); {PER_CALL} (the others)" if io_binding else PER_CALL}
    return BenchResult(threads, tuple(rows), peak_info, settings, environment.summary(),
                       {"start": load_start, "end": _load_avg()}, tuple(notes), tuned,
                       time.perf_counter() - t_start)


def _checked_paths(onnx_paths: dict[str, Path], threads: int) -> dict[str, Path]:
    """``onnx_paths`` as Paths, after checking that each file exists and ``threads`` is at least 1."""
    if threads < 1:
        raise UsageError("--threads must be at least 1", "e.g. --threads 2")
    paths = {k: Path(v) for k, v in onnx_paths.items()}
    for label, p in paths.items():
        if not p.is_file():
            raise UsageError(f"ONNX file not found for {label}: {p}", "check the path")
    return paths


def _backends(loaded: LoadedModel, onnx_paths: dict[str, Path], threads: int, *, compile: bool,
              openvino: bool | None, io_binding: bool, tuned: dict | None, notes: list[str],
              providers: list | None = None) -> list[Backend]:
    """The backends to time, unopened: PyTorch eager first (the reference), then compile, ONNX files, the
    tuned session and OpenVINO on the reference file."""
    backends: list[Backend] = [TorchBackend(loaded, threads=threads)]
    if compile:
        backends.append(TorchBackend(loaded, threads=threads, compile=True))
    backends += [OrtBackend(p, threads=threads, name=label, io_binding=io_binding, providers=providers)
                 for label, p in onnx_paths.items()]
    reference = next(iter(onnx_paths.values()), None)
    if reference is not None and tuned is not None:
        backends.append(OrtBackend(reference, options=OrtOptions.from_dict(tuned["config"]),
                                   name="onnxruntime:tuned", providers=providers))
    if reference is not None and (openvino or (openvino is None and openvino_available())):
        if openvino_available():
            backends.append(OpenVinoBackend(reference, threads=threads))
        else:
            notes.append("openvino is not installed: skipped (pip install openvino)")
    return backends


def _first_line(e: Exception) -> str:
    """The first line of an error's message (at most 200 characters), or its repr when it has none."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else repr(e)


def _open_all(backends: list[Backend], notes: list[str]) -> list[Backend]:
    """Open each backend; optional ones (OpenVINO, torch.compile) that fail are noted and left out.

    If a required one fails, those already open are closed before the error propagates."""
    opened: list[Backend] = []
    try:
        for b in backends:
            try:
                b.open()
            except Exception as e:  # noqa: BLE001
                if b.name in ("openvino", "pytorch-compile"):
                    notes.append(f"{b.name} skipped: {_first_line(e) if str(e) else type(e).__name__}")
                    continue
                raise
            opened.append(b)
    except BaseException:
        for b in opened:
            b.close()
        raise
    return opened


def _bench_all(loaded: LoadedModel, backends: list[Backend], sizes_list: list[tuple[int, int | None, dict[str, int]]],
               reference: Path | None, peak_info: dict | None, timing: _Timing, notes: list[str],
               say: Progress) -> list[Run]:
    """Open ``backends``, time them at each size of ``sizes_list`` and close them: the rows of every size."""
    opened = _open_all(backends, notes)
    rows: list[Run] = []
    try:
        for batch, seq, sizes in sizes_list:
            label = f"batch {batch}" + (f", seq {seq}" if seq is not None else "")
            shapes = shapes_for(loaded.inputs, sizes)
            work = None
            if reference is not None:
                count = flops(reference, dict(shapes))
                work = count.total or None
                if count.unknown:
                    notes.append(f"{label}: {len(count.unknown)} node(s) with unknown shapes not counted in FLOPs")
            size = _Size(batch, seq, label, spec_feeds(loaded.inputs, sizes), shapes, work)
            rows += _bench_one(opened, size, peak_info, timing, notes, say)
    finally:
        for b in opened:
            b.close()
    return rows


def _warm(backends: list[Backend], feeds: dict[str, np.ndarray], warmup: int, notes: list[str], label: str
          ) -> tuple[list[Backend], dict[str, list[np.ndarray]]]:
    """Warm each backend up on ``feeds``: those that ran, and the outputs of their last call."""
    live: list[Backend] = []
    outputs: dict[str, list[np.ndarray]] = {}
    for b in backends:
        try:
            for _ in range(max(1, warmup)):
                outputs[b.name] = b.run(feeds)
            live.append(b)
        except Exception as e:  # noqa: BLE001 - one backend failing at a size must not hide the others
            notes.append(f"{label}: {b.name} fails: {_first_line(e)}")
    return live, outputs


@dataclass(frozen=True)
class _Size:
    """One input size to time: batch and seq, its label in notes and progress, the feeds, the input shapes and
    the reference graph's FLOPs at them (None: no reference file, or none counted)."""

    batch: int
    seq: int | None
    label: str
    feeds: dict[str, np.ndarray]
    shapes: dict[str, list[int]]
    work: int | None


def _call(backend: Backend, feeds: dict[str, np.ndarray], resident: bool, notes: list[str], label: str):
    """What is timed of ``backend``: device-resident where asked and it can bind (bench/resident.py), else its
    run() (noted when binding fails)."""
    call, why = call_or_run(backend, feeds, resident)
    if why:
        notes.append(f"{label}: {backend.name} timed per call (IO binding failed: {why})")
    return call


def _bench_one(backends: list[Backend], size: _Size, peak_info: dict | None, timing: _Timing, notes: list[str],
               say: Progress) -> list[Run]:
    """Warm up and time ``backends`` at one size: one Run each, speedups against PyTorch eager."""
    batch, seq, label, feeds, shapes, work = size.batch, size.seq, size.label, size.feeds, size.shapes, size.work
    say(f"{label}: warming up {', '.join(b.name for b in backends)}")
    live, outputs = _warm(backends, feeds, timing.warmup, notes, label)
    if not live:
        return []
    times = timed_blocks({b.name: _call(b, feeds, timing.resident, notes, label) for b in live},
                         seconds=timing.max_seconds, min_runs=timing.min_runs, block=timing.block,
                         enough_at_min_runs=True)
    ref_name = live[0].name
    ref_p50 = None
    rows = []
    for b in live:
        st = stats(times[b.name], batch)
        if b.name == "pytorch":
            ref_p50 = st["p50_ms"]
        gflops = work / (st["p50_ms"] / 1e3) / 1e9 if work else None
        top = peak_gflops(peak_info, b.name)
        pct = 100.0 * gflops / top if gflops and top else None
        diff = None if b.name == ref_name else compare_outputs(outputs[ref_name], outputs[b.name])
        rows.append(Run(b.name, batch, seq, shapes, st["p50_ms"], st["p90_ms"], st["p99_ms"], st["mean_ms"],
                        st["std_ms"], st["min_ms"], st["runs"], st["throughput"],
                        work / 1e9 if work else None, gflops, pct, None, diff,
                        backend_precision(b.name) if pct is not None else None))
    if ref_p50:
        rows = [Run(**{**r.__dict__, "speedup": ref_p50 / r.p50_ms}) for r in rows]
    say(f"{label}: " + ", ".join(f"{r.backend} {r.p50_ms:.2f} ms" for r in rows))
    return rows
