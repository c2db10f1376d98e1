"""Layer 5: timing PyTorch against ONNX Runtime (warm blocks), FLOP counts, the GEMM peak, session tuning.

Modules: ``harness`` (the timing loop and its statistics), ``flopcount`` (work per inference), ``peak`` (the
cached fp32 GEMM peak of the CPU, the matmul peaks of a GPU), ``tuning`` (session-option search) and ``runs`` (the benchmark itself).
"""

from onnxport.bench.flopcount import FlopCount, flops
from onnxport.bench.harness import best_of, interleave, stats, timed_blocks
from onnxport.bench.peak import (
    cache_dir,
    device_peak,
    gemm_peak,
    gpu_peak,
    gpu_peak_key,
    measure_gemm,
    measure_gpu_gemm,
    peak_gflops,
    peak_key,
)
from onnxport.bench.runs import BenchResult, Run, bench_sizes, run, sizes_at
from onnxport.bench.tuning import TUNE_KEYS, tune

__all__ = ["TUNE_KEYS", "BenchResult", "FlopCount", "Run", "bench_sizes", "best_of", "cache_dir", "device_peak", "flops",
           "gemm_peak", "gpu_peak", "gpu_peak_key", "interleave", "measure_gemm", "measure_gpu_gemm", "peak_gflops",
           "peak_key", "run", "sizes_at", "stats", "timed_blocks", "tune"]
