"""The machine's measured fp32 GEMM peak (GFLOP/s), cached per CPU model and thread count."""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnxport import environment
from onnxport.runtime.backends import default_threads


def cache_dir() -> Path:
    """Where onnxport caches measurements: $ONNXPORT_CACHE_DIR, else $XDG_CACHE_HOME/onnxport, else ~/.cache."""
    if os.environ.get("ONNXPORT_CACHE_DIR"):
        return Path(os.environ["ONNXPORT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnxport"


def peak_key(threads: int) -> str:
    """The key of the peak measured on this machine's CPU model at ``threads`` in the peak cache file."""
    return f"{environment.cpu()['model']} | {threads} threads"


def _time_best(fn: Callable[[], Any], repeats: int) -> float:
    """The best of ``repeats`` timed calls of ``fn`` in seconds, after one untimed call."""
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
    key = peak_key(threads)
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
