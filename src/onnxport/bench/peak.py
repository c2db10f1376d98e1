"""The machine's measured GEMM peak (GFLOP/s): the CPU's peaks (fp32; int8 through ONNX Runtime's MatMulInteger,
u8×s8 as VNNI/AMX run it; bf16 through torch.mm), cached per CPU model and thread count, and a GPU's own matmul
peak (fp32 with TF32 off, TF32, fp16), cached per GPU name. The benchmark's "% peak" divides by the peak of the
device it runs on (:func:`device_peak`) in the precision the backend computes in (:func:`peak_gflops`): an int8
variant against the int8 peak, never the fp32 one (it would read "197 % of peak"); where the peak of that
precision was not measured there is no percentage."""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.runtime import environment
from onnxport.runtime.backends import default_threads
from onnxport.runtime.openvino import bf16_missing
from onnxport.runtime.sessions import session


def cache_dir() -> Path:
    """Where onnxport caches measurements: $ONNXPORT_CACHE_DIR, else $XDG_CACHE_HOME/onnxport, else ~/.cache."""
    if os.environ.get("ONNXPORT_CACHE_DIR"):
        return Path(os.environ["ONNXPORT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnxport"


def peak_key(threads: int) -> str:
    """The key of the peak measured on this machine's CPU model at ``threads`` in the peak cache file."""
    return f"{environment.cpu()['model']} | {threads} threads"


PEAK_SIZE = 1024  # the square GEMM the CPU peak is measured on: ~2 GFLOP, under a second on any 2-core CPU
PEAK_REPEATS = 3
PEAK_SECONDS_MAX = 1.0  # a precision whose single GEMM takes longer is not timed further (no native kernel)


def _time_best(fn: Callable[[], Any], repeats: int) -> float:
    """The best of ``repeats`` timed calls of ``fn`` in seconds, after one untimed call (fewer repeats when one
    call takes over :data:`PEAK_SECONDS_MAX`, so the measurement stays short and Ctrl-C acts between calls)."""
    t0 = time.perf_counter()
    fn()
    best = time.perf_counter() - t0  # the warm-up counts where it is all there is
    if best > PEAK_SECONDS_MAX:
        return best
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_gemm(threads: int, size: int = PEAK_SIZE, repeats: int = PEAK_REPEATS,
                 cpu_flags: Sequence[str] | None = None) -> dict:
    """Best-of-``repeats`` GEMM speed of square ``size`` matrices: fp32 (torch.mm and ONNX Runtime MatMul, the
    faster), int8 (ONNX Runtime MatMulInteger) and, where the CPU has native bf16 (``cpu_flags``, default: read
    here), bf16 (torch.mm). Without native bf16 there is no bf16 peak: bf16 there runs through conversions."""
    import torch
    from onnx import TensorProto, helper, numpy_helper

    t_start = time.perf_counter()
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
    sess = session(model, threads=threads)
    feed = {"A": a.numpy()}
    ort_s = _time_best(lambda: sess.run(None, feed), repeats)
    results = {"torch.mm": work / torch_s / 1e9, "onnxruntime MatMul": work / ort_s / 1e9}
    method = max(results, key=results.__getitem__)
    flags = environment.cpu()["flags"] if cpu_flags is None else cpu_flags
    native_bf16 = bf16_missing(flags) is None  # elsewhere bf16 is converted: no peak of its own
    by_precision: dict[str, float | None] = {
        "fp32": round(results[method], 2), "int8": round(measure_int8_gemm(threads, size, repeats), 2),
        "bf16": round(measure_bf16_gemm(threads, size, repeats), 2) if native_bf16 else None}
    return {"gflops": round(results[method], 2), "method": method,
            "by_method": {k: round(v, 2) for k, v in results.items()}, "by_precision": by_precision,
            "precision_methods": {"int8": "onnxruntime MatMulInteger (uint8 x int8)",
                                  "bf16": "torch.mm (bfloat16)" if native_bf16
                                  else f"not measured: {environment.this_cpu()} has no native bf16 (AVX512-BF16 / AMX-BF16)"},
            "size": size, "repeats": repeats, "threads": threads,
            "seconds": round(time.perf_counter() - t_start, 2),
            "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def measure_int8_gemm(threads: int, size: int = PEAK_SIZE, repeats: int = PEAK_REPEATS) -> float:
    """GOP/s of ONNX Runtime's MatMulInteger on square ``size`` matrices (uint8 activations, int8 weights: the
    kernel dynamic int8 runs, on VNNI/AMX where the CPU has them)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (size, size), dtype=np.uint8)
    b = rng.integers(-127, 127, (size, size), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "gemm_int8",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [size, size])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [size, size])],
        [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    sess = session(model, threads=threads)
    return 2.0 * size**3 / _time_best(lambda: sess.run(None, {"A": a}), repeats) / 1e9


def measure_bf16_gemm(threads: int, size: int = PEAK_SIZE, repeats: int = PEAK_REPEATS) -> float:
    """GFLOP/s of torch.mm in bfloat16 on square ``size`` matrices (AVX-512 BF16/AMX where the CPU has them)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=g).to(torch.bfloat16)
        b = torch.randn(size, size, generator=g).to(torch.bfloat16)
        out = torch.empty(size, size, dtype=torch.bfloat16)
        return 2.0 * size**3 / _time_best(lambda: torch.mm(a, b, out=out), repeats) / 1e9
    finally:
        torch.set_num_threads(saved)


def gemm_peak(threads: int | None = None, *, cache_file: str | Path | None = None, size: int = PEAK_SIZE,
              repeats: int = PEAK_REPEATS, refresh: bool = False) -> dict:
    """The machine's measured fp32 GEMM peak (GFLOP/s) at ``threads``, cached per CPU model and thread count.

    The cache is a JSON file (default: ``cache_dir()/peak.json``); ``refresh`` measures again.
    The result carries ``cached``: whether it came from the file, and ``cache_warning`` when the file could not
    be read or written (the measurement is then not kept: the next run measures again).
    """
    threads = threads or default_threads()
    path = Path(cache_file) if cache_file else cache_dir() / "peak.json"
    found = _cached(path, peak_key(threads), lambda: measure_gemm(threads, size, repeats), refresh)
    if found.get("cached") and "by_precision" not in found:  # measured before the int8/bf16 peaks were
        found = _cached(path, peak_key(threads), lambda: measure_gemm(threads, size, repeats), True)
    return found


def cache_problem(path: Path) -> str | None:
    """Why the measurement cache file ``path`` cannot be kept (None: it can): its folder cannot be made or
    written, or the path is not a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create the cache folder {path.parent}: {e.strerror or e}"
    if path.exists() and not path.is_file():
        return f"the cache path {path} is not a file"
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        return f"the cache {path} is not writable"
    return None


def _cached(path: Path, key: str, measure: Callable[[], dict], refresh: bool) -> dict:
    """``path[key]`` when it holds a measurement (and not ``refresh``), else ``measure()`` stored there (with a
    ``cache_warning`` when it cannot be stored)."""
    data: dict = {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    if not refresh and isinstance(data.get(key), dict) and data[key].get("gflops"):
        return {**data[key], "cached": True}
    problem = cache_problem(path)
    measured = measure()
    if problem is None:
        try:
            try:  # merge with what another process may have written meanwhile
                data = json.loads(path.read_text())
                data = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                data = {}
            data[key] = measured
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            problem = f"cannot write the cache {path}: {e.strerror or e}"
    if problem is not None:
        return {**measured, "cached": False,
                "cache_warning": f"{problem}; the GEMM peak is measured again on every run "
                                 "(set ONNXPORT_CACHE_DIR to a writable folder)"}
    return {**measured, "cached": False}


# --------------------------------------------------------------------------- GPU

GPU_PRECISIONS = ("fp32", "tf32", "fp16")  # fp32 with TF32 off (how onnxport proves fp32), TF32, fp16


def gpu_peak_key(device_name: str) -> str:
    """The key of a GPU's peak in the peak cache file."""
    return f"{device_name} | cuda"


def measure_gpu_gemm(size: int = 8192, repeats: int = 20, device_id: int = 0) -> dict:
    """Best-of-``repeats`` torch.mm speed of square ``size`` matrices on CUDA device ``device_id`` in fp32 with
    TF32 off, in TF32 and in fp16, timed with CUDA events after a warm-up (the switches are restored)."""
    import torch

    dev = torch.device("cuda", device_id)
    work = 2.0 * size**3
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    results: dict[str, float] = {}
    try:
        for precision in GPU_PRECISIONS:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
            dtype = torch.float16 if precision == "fp16" else torch.float32
            g = torch.Generator(device=dev).manual_seed(0)
            a = torch.randn(size, size, generator=g, device=dev, dtype=dtype)
            b = torch.randn(size, size, generator=g, device=dev, dtype=dtype)
            out = torch.empty(size, size, device=dev, dtype=dtype)
            for _ in range(3):
                torch.mm(a, b, out=out)
            torch.cuda.synchronize(dev)
            best = float("inf")
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.mm(a, b, out=out)
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1e3)
            results[precision] = work / best / 1e9
            del a, b, out
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])
    return {"gflops": round(results["fp32"], 2), "method": "torch.mm on cuda (CUDA events)",
            "by_precision": {k: round(v, 2) for k, v in results.items()}, "size": size, "repeats": repeats,
            "device": torch.cuda.get_device_name(dev),
            "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def gpu_peak(device_name: str | None = None, *, cache_file: str | Path | None = None, size: int = 8192,
             repeats: int = 20, refresh: bool = False) -> dict:
    """The GPU's measured matmul peak (``gflops``: fp32 with TF32 off; ``by_precision``: fp32, tf32, fp16),
    cached per GPU name in the same file as the CPU peak; ``device_name`` default: CUDA device 0's."""
    if device_name is None:
        import torch

        device_name = torch.cuda.get_device_name(0)
    return _cached(Path(cache_file) if cache_file else cache_dir() / "peak.json", gpu_peak_key(device_name),
                   lambda: measure_gpu_gemm(size, repeats), refresh)


def device_peak(device: str, threads: int | None = None, *, cache_file: str | Path | None = None) -> dict:
    """The peak the benchmark on ``device`` is set against: the GPU's own on "cuda", else the CPU GEMM peak."""
    if device == "cuda":
        return gpu_peak(cache_file=cache_file)
    return gemm_peak(threads, cache_file=cache_file)


def backend_precision(backend: str, cpu_flags: Sequence[str] | None = None) -> str:
    """The precision a benchmark backend computes its matmuls in, read from its label: int8 files (int8), bf16
    ones and OpenVINO's default on a CPU with native bf16 (bf16), fp16 and TensorRT files (fp16), tf32 (TF32);
    every other one: fp32. ``cpu_flags``: this CPU's features (default: read here)."""
    name = backend.lower()
    if "int8" in name:
        return "int8"
    if "bf16" in name:
        return "bf16"
    if name == "openvino":  # OpenVINO's defaults: bf16 inference precision where the CPU has native bf16
        flags = environment.cpu()["flags"] if cpu_flags is None else cpu_flags
        return "bf16" if bf16_missing(flags) is None else "fp32"
    if "fp16" in name or "tensorrt" in name:
        return "fp16"
    return "tf32" if "tf32" in name else "fp32"


def peak_gflops(peak: dict | None, backend: str, cpu_flags: Sequence[str] | None = None) -> float | None:
    """The GFLOP/s a backend's achieved speed is a percentage of: the peak in the backend's precision
    (:func:`backend_precision`); the fp32 peak for fp32, TF32 and fp16 where no peak of that precision was
    measured (fp16 on a CPU runs through casts); None for int8 and bf16 without their own measured peak."""
    if not peak:
        return None
    by = peak.get("by_precision") or {}
    precision = backend_precision(backend, cpu_flags)
    value = by.get(precision)
    if value is None and precision in ("int8", "bf16"):
        return None
    value = value or peak.get("gflops")
    return float(value) if value else None
