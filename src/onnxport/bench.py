"""Benchmark harness: PyTorch vs ONNX Runtime (and OpenVINO), honest, comparable, against the GEMM peak.

Method (``run``): one set of inputs per batch/sequence size, shared by every backend; warm-up; then
round-robin blocks of iterations over the backends (the order rotates every round, and each block
starts with one untimed iteration) so that machine noise hits all of them alike, until every backend
has ``min_runs`` timed iterations or ``max_seconds`` are spent. Per-iteration wall times give
p50/p90/p99/mean/std and throughput. The work per inference is counted in FLOPs on the reference ONNX
graph at the benchmarked shapes and set against the machine's measured fp32 GEMM peak.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import environment
from .backends import (
    Backend,
    OpenVinoBackend,
    OrtBackend,
    OrtOptions,
    TorchBackend,
    compare_outputs,
    default_threads,
    openvino_available,
)
from .errors import UsageError
from .samples import export_sizes, make_inputs, shapes_for
from .sources.base import LoadedModel

Progress = Callable[[str], None]
TUNE_KEYS = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "graph_optimization_level",
             "enable_mem_pattern", "enable_cpu_mem_arena")


# --------------------------------------------------------------------------- statistics


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


# --------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one inference: total, per op type, and the counted nodes whose shapes stayed unknown."""

    total: int
    by_op: dict[str, int]
    unknown: tuple[str, ...] = ()


_MATMUL = {"MatMul", "MatMulInteger", "FusedMatMul", "QLinearMatMul", "DynamicQuantizeMatMul",
           "MatMulIntegerToFloat"}
_CONV = {"Conv", "ConvInteger", "FusedConv", "QLinearConv", "NhwcConv"}
_COUNTED = _MATMUL | _CONV | {"Gemm", "FusedGemm", "ConvTranspose", "Attention", "MultiHeadAttention", "Einsum"}


def _load(model: Any):
    import onnx

    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    return onnx.load(str(model), load_external_data=False)


def _static(model, shapes: dict[str, Sequence[int]]):
    """A copy of ``model`` with its inputs fixed to ``shapes`` and stale value_info removed."""
    from onnx import TensorShapeProto

    for inp in model.graph.input:
        if inp.name in shapes and inp.type.HasField("tensor_type"):
            dims = inp.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[inp.name]:
                dims.dim.append(TensorShapeProto.Dimension(dim_value=int(d)))
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    return model


def _shape_table(model) -> dict[str, list[int | None]]:
    table: dict[str, list[int | None]] = {}
    for init in model.graph.initializer:
        table[init.name] = list(init.dims)
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            table[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return table


def _attr(node, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _prod(xs: Sequence[int]) -> int:
    return int(math.prod(xs))


def _node_flops(node, table: dict[str, list[int | None]]) -> int | None:
    """FLOPs of one node (multiply-add = 2), or None when a needed shape is unknown."""

    def shape(i: int) -> list[int] | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        s = table.get(node.input[i])
        return None if s is None or any(d is None for d in s) else s  # type: ignore[return-value]

    out = table.get(node.output[0]) if node.output else None
    out = None if out is None or any(d is None for d in out) else out
    op = node.op_type
    if op in _MATMUL or op in ("Gemm", "FusedGemm"):
        a = shape(0)
        if a is None or out is None:
            return None
        if op in ("Gemm", "FusedGemm"):
            k = a[0] if _attr(node, "transA", 0) else a[1]
        elif len(a) == 1:
            k = a[0]
        else:
            k = a[-2] if _attr(node, "transA", 0) else a[-1]
        return 2 * _prod(out) * k
    if op in _CONV:
        w = shape(3 if op == "QLinearConv" else 1)
        if w is None or out is None:
            return None
        return 2 * _prod(out) * _prod(w[1:])  # W: [Cout, Cin/groups, *kernel]
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        return None if x is None or w is None else 2 * _prod(x) * _prod(w[1:])  # W: [Cin, Cout/groups, *k]
    if op == "Attention" and node.domain in ("", "ai.onnx"):
        return _onnx_attention(node, shape(0), shape(1), shape(2))
    if op == "Attention":  # com.microsoft: packed input projection, then attention
        x, w = shape(0), shape(1)
        if x is None or w is None or len(x) != 3:
            return None
        b, s, _ = x
        sizes = _attr(node, "qkv_hidden_sizes") or [w[1] // 3] * 3
        return 2 * b * s * w[0] * w[1] + 2 * b * s * s * (sizes[0] + sizes[2])
    if op == "MultiHeadAttention":
        q, k, v = shape(0), shape(1), shape(2)
        if q is None or k is None or v is None or len(q) != 3 or len(k) != 3 or len(v) != 3:
            return None
        return 2 * q[0] * q[1] * k[1] * (q[2] + v[2])
    if op == "Einsum":
        return _einsum(str(_attr(node, "equation", b"")), [shape(i) for i in range(len(node.input))])
    return 0


def _onnx_attention(node, q: list[int] | None, k: list[int] | None, v: list[int] | None) -> int | None:
    """ONNX Attention (opset 23): Q·Kᵀ and softmax·V, with 3-D [B,S,hidden] or 4-D [B,heads,S,head] inputs."""
    if q is None or k is None or v is None:
        return None
    if len(q) == 4:
        b, heads, s, d = q
        length, dv = k[2], v[3]
        return 2 * b * heads * s * length * (d + dv)
    if len(q) == 3:
        b, s, hidden_q = q
        q_heads = _attr(node, "q_num_heads") or 1
        kv_heads = _attr(node, "kv_num_heads") or q_heads
        length = k[1]
        hidden_v = v[-1] // kv_heads * q_heads
        return 2 * b * s * length * (hidden_q + hidden_v)
    return None


def _einsum(eq: str, shapes: list[list[int] | None]) -> int | None:
    if "->" not in eq or "." in eq or any(s is None for s in shapes):
        return None
    lhs, rhs = eq.replace(" ", "").split("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for term, s in zip(terms, shapes):
        if s is None or len(term) != len(s):
            return None
        sizes.update(zip(term, s))
    contracted = set(sizes) - set(rhs)
    if not contracted or len(terms) < 2:
        return 0  # a transpose, reduction or elementwise product: not GEMM work
    return 2 * _prod(list(sizes.values()))


def _run_shapes(source: Any, model, shapes: dict[str, Sequence[int]]) -> dict[str, list[int | None]]:
    """Exact shapes of the counted nodes' tensors, by running ``source`` once in ONNX Runtime on zeros."""
    import onnx
    import onnxruntime as ort

    table = _shape_table(model)
    full = _load(source) if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
    known = {o.name for o in full.graph.output}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*model.graph.value_info, *model.graph.output]}
    wanted = [t for n in model.graph.node if n.op_type in _COUNTED for t in [*n.input, *n.output[:1]]
              if t and t in types and t not in known and any(d is None for d in table.get(t, [None]))]
    for name in dict.fromkeys(wanted):
        full.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    feeds = {}
    for inp in full.graph.input:
        if inp.name in {i.name for i in full.graph.initializer}:
            continue
        dims = shapes.get(inp.name) or [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = np.zeros(dims, onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(full.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for name, value in zip(names, sess.run(None, feeds)):
        table[name] = list(np.shape(value))
    return table


def _count(model, table: dict[str, list[int | None]] | None = None) -> FlopCount:
    table = table if table is not None else _shape_table(model)
    by_op: dict[str, int] = {}
    unknown: list[str] = []
    for node in model.graph.node:
        if node.op_type not in _COUNTED:
            continue
        f = _node_flops(node, table)
        if f is None:
            unknown.append(node.name or node.op_type)
            continue
        if f:
            by_op[node.op_type] = by_op.get(node.op_type, 0) + f
    return FlopCount(sum(by_op.values()), by_op, tuple(unknown))


def flops(model: Any, shapes: dict[str, Sequence[int]]) -> FlopCount:
    """FLOPs of one inference of ``model`` (path or ModelProto) with its inputs at ``shapes``.

    Counts MatMul/Gemm (2·M·N·K), Conv (2·Cout·Hout·Wout·Cin/groups·kh·kw·batch), ConvTranspose,
    ONNX and com.microsoft Attention/MultiHeadAttention and contracting Einsums, from ONNX shape
    inference (with data propagation) after fixing the inputs; nodes inside subgraphs are not counted.
    When ONNX shape inference leaves counted nodes unknown, ONNX Runtime's symbolic shape inference is
    tried, and if shapes are still missing the graph is run once on zeros to read them.
    """
    import onnx

    base = _static(_load(model), shapes)
    try:
        inferred = onnx.shape_inference.infer_shapes(base, data_prop=True)
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer may still be countable below
        inferred = base
    best = _count(inferred)
    if best.unknown:
        try:
            import tempfile

            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            cwd = os.getcwd()
            with tempfile.TemporaryDirectory(prefix="onnxport-symshape-") as tmp:
                os.chdir(tmp)  # when it gives up (e.g. on a custom op) it saves a model into the working dir
                try:
                    other = _count(SymbolicShapeInference.infer_shapes(base, auto_merge=True))
                finally:
                    os.chdir(cwd)
            if len(other.unknown) < len(best.unknown):
                best = other
        except Exception:  # noqa: BLE001 - optional second opinion
            pass
    if best.unknown:
        with contextlib.suppress(Exception):  # e.g. a model over 2 GB, or one ONNX Runtime cannot run
            best = _count(inferred, _run_shapes(model, inferred, shapes))
    return best


# --------------------------------------------------------------------------- GEMM peak


def cache_dir() -> Path:
    """Where onnxport caches measurements: $ONNXPORT_CACHE_DIR, else $XDG_CACHE_HOME/onnxport, else ~/.cache."""
    if os.environ.get("ONNXPORT_CACHE_DIR"):
        return Path(os.environ["ONNXPORT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnxport"


def _peak_key(threads: int) -> str:
    return f"{environment.cpu()['model']} | {threads} threads"


def _time_best(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_gemm(threads: int, size: int = 2048, repeats: int = 5) -> dict:
    """Best-of-``repeats`` fp32 GEMM speed of square ``size`` matrices: torch.mm and ONNX Runtime MatMul."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    work = 2.0 * size**3
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=g)
        b = torch.randn(size, size, generator=g)
        out = torch.empty(size, size)
        torch_s = _time_best(lambda: torch.mm(a, b, out=out), repeats)
    finally:
        torch.set_num_threads(saved)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])], "gemm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [size, size])],
        [numpy_helper.from_array(b.numpy(), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {"A": a.numpy()}
    ort_s = _time_best(lambda: sess.run(None, feed), repeats)
    results = {"torch.mm": work / torch_s / 1e9, "onnxruntime MatMul": work / ort_s / 1e9}
    method = max(results, key=results.__getitem__)
    return {"gflops": round(results[method], 2), "method": method,
            "by_method": {k: round(v, 2) for k, v in results.items()}, "size": size, "repeats": repeats,
            "threads": threads, "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def gemm_peak(threads: int | None = None, *, cache_file: str | Path | None = None, size: int = 2048,
              repeats: int = 5, refresh: bool = False) -> dict:
    """The machine's measured fp32 GEMM peak (GFLOP/s) at ``threads``, cached per CPU model and thread count.

    The cache is a JSON file (default: ``cache_dir()/peak.json``); ``refresh`` measures again.
    The result carries ``cached``: whether it came from the file.
    """
    threads = threads or default_threads()
    path = Path(cache_file) if cache_file else cache_dir() / "peak.json"
    key = _peak_key(threads)
    data: dict = {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    if not refresh and isinstance(data.get(key), dict) and data[key].get("gflops"):
        return {**data[key], "cached": True}
    measured = measure_gemm(threads, size, repeats)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # merge with what another process may have written meanwhile
            data = json.loads(path.read_text())
            data = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            data = {}
        data[key] = measured
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return {**measured, "cached": False}


# --------------------------------------------------------------------------- tuning


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
    say = progress or (lambda _: None)
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


# --------------------------------------------------------------------------- the benchmark


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
    peak_pct: float | None = None  # of the measured fp32 GEMM peak
    speedup: float | None = None  # PyTorch eager p50 / this p50
    max_abs_diff: float | None = None  # outputs against the first backend (PyTorch eager)

    def to_dict(self) -> dict:
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


def run(loaded: LoadedModel, onnx_paths: dict[str, Path], *, batches: Sequence[int] = (1, 8),
        seq_lens: Sequence[int] | None = None, threads: int | None = None, warmup: int = 5, min_runs: int = 50,
        max_seconds: float = 10.0, block: int = 5, compile: bool = False, openvino: bool | None = None,
        tune_ort: bool = False, tune_budget_s: float = 30.0, peak: bool = True,
        progress: Progress | None = None, io_binding: bool = False) -> BenchResult:
    """Benchmark PyTorch eager (and torch.compile if ``compile``) against each ONNX file in ``onnx_paths``.

    ``onnx_paths`` maps a backend label (e.g. "onnxruntime", "onnxruntime:best") to a file; the first is
    the reference graph for FLOP counts and for OpenVINO (``openvino``: None = when installed).
    ``max_seconds`` bounds the timed loop per batch/seq size; ``min_runs`` timed iterations per backend
    end it earlier. ``tune_ort`` searches session options on the first file (``tune``) and adds the tuned
    session as "onnxruntime:tuned". ``peak`` measures (or reads the cached) GEMM peak for the roofline.
    ``io_binding`` runs ONNX Runtime through IO binding (inputs bound once per size on the session's device).
    """
    say = progress or (lambda _: None)
    t_start = time.perf_counter()
    threads = threads or default_threads()
    if threads < 1:
        raise UsageError("--threads must be at least 1", "e.g. --threads 2")
    onnx_paths = {k: Path(v) for k, v in onnx_paths.items()}
    for label, p in onnx_paths.items():
        if not p.is_file():
            raise UsageError(f"ONNX file not found for {label}: {p}", "check the path")
    sizes_list, notes = bench_sizes(loaded, batches, seq_lens)
    load_start = _load_avg()
    reference = next(iter(onnx_paths.values()), None)
    peak_info = None
    if peak:
        say("measuring the fp32 GEMM peak (cached after the first time)")
        peak_info = gemm_peak(threads)

    def feeds_for(sizes: dict[str, int]) -> dict[str, np.ndarray]:
        return {s.name: t.numpy() for s, t in zip(loaded.inputs, make_inputs(loaded.inputs, sizes, "random", 0))}

    tuned = None
    backends: list[Backend] = [TorchBackend(loaded, threads=threads)]
    if compile:
        backends.append(TorchBackend(loaded, threads=threads, compile=True))
    backends += [OrtBackend(p, threads=threads, name=label, io_binding=io_binding) for label, p in onnx_paths.items()]
    if reference is not None and tune_ort:
        say("tuning ONNX Runtime session options")
        tuned = tune(reference, feeds_for(sizes_list[0][2]), threads=threads, budget_s=tune_budget_s,
                     progress=say)
        backends.append(OrtBackend(reference, options=OrtOptions.from_dict(tuned["config"]),
                                   name="onnxruntime:tuned"))
    if reference is not None and (openvino or (openvino is None and openvino_available())):
        if openvino_available():
            backends.append(OpenVinoBackend(reference, threads=threads))
        else:
            notes.append("openvino is not installed: skipped (pip install openvino)")
    opened: list[Backend] = []
    try:
        for b in backends:
            try:
                b.open()
                opened.append(b)
            except Exception as e:  # noqa: BLE001
                if b.name in ("openvino", "pytorch-compile"):
                    notes.append(f"{b.name} skipped: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
                    continue
                raise
        rows: list[Run] = []
        for batch, seq, sizes in sizes_list:
            label = f"batch {batch}" + (f", seq {seq}" if seq is not None else "")
            feeds = feeds_for(sizes)
            shapes = shapes_for(loaded.inputs, sizes)
            work = None
            if reference is not None:
                count = flops(reference, {k: v for k, v in shapes.items()})
                work = count.total or None
                if count.unknown:
                    notes.append(f"{label}: {len(count.unknown)} node(s) with unknown shapes not counted in FLOPs")
            rows += _bench_one(opened, feeds, batch, seq, shapes, work, peak_info, warmup, min_runs, max_seconds,
                               block, notes, label, say)
    finally:
        for b in opened:
            b.close()
    settings = {"warmup": warmup, "min_runs": min_runs, "max_seconds": max_seconds, "block": block,
                "batches": list(batches), "seq_lens": list(seq_lens) if seq_lens else None, "compile": compile,
                "timing": "wall time per run() call incl. numpy↔framework conversion; interleaved blocks"}
    return BenchResult(threads, tuple(rows), peak_info, settings, environment.summary(),
                       {"start": load_start, "end": _load_avg()}, tuple(notes), tuned,
                       time.perf_counter() - t_start)


def _bench_one(backends: list[Backend], feeds: dict[str, np.ndarray], batch: int, seq: int | None,
               shapes: dict[str, list[int]], work: int | None, peak_info: dict | None, warmup: int, min_runs: int,
               max_seconds: float, block: int, notes: list[str], label: str, say: Progress) -> list[Run]:
    say(f"{label}: warming up {', '.join(b.name for b in backends)}")
    live: list[Backend] = []
    outputs: dict[str, list[np.ndarray]] = {}
    for b in backends:
        try:
            for _ in range(max(1, warmup)):
                outputs[b.name] = b.run(feeds)
            live.append(b)
        except Exception as e:  # noqa: BLE001 - one backend failing at a size must not hide the others
            notes.append(f"{label}: {b.name} fails: {str(e).strip().splitlines()[0][:200] if str(e).strip() else e!r}")
    if not live:
        return []
    times = timed_blocks({b.name: functools.partial(b.run, feeds) for b in live}, seconds=max_seconds,
                         min_runs=min_runs, block=block, enough_at_min_runs=True)
    ref_name = live[0].name
    ref_p50 = None
    rows = []
    for b in live:
        st = stats(times[b.name], batch)
        if b.name == "pytorch":
            ref_p50 = st["p50_ms"]
        gflops = work / (st["p50_ms"] / 1e3) / 1e9 if work else None
        pct = 100.0 * gflops / peak_info["gflops"] if gflops and peak_info and peak_info.get("gflops") else None
        diff = None if b.name == ref_name else compare_outputs(outputs[ref_name], outputs[b.name])
        rows.append(Run(b.name, batch, seq, shapes, st["p50_ms"], st["p90_ms"], st["p99_ms"], st["mean_ms"],
                        st["std_ms"], st["min_ms"], st["runs"], st["throughput"],
                        work / 1e9 if work else None, gflops, pct, None, diff))
    if ref_p50:
        rows = [Run(**{**r.__dict__, "speedup": ref_p50 / r.p50_ms}) for r in rows]
    say(f"{label}: " + ", ".join(f"{r.backend} {r.p50_ms:.2f} ms" for r in rows))
    return rows
