"""Layer 5: timing PyTorch against ONNX Runtime (warm blocks), FLOP counts, the GEMM peak, session tuning.

Modules: ``harness`` (the timing loop and its statistics), ``resident`` (what it calls for a session on a GPU:
IO binding with inputs and outputs kept on the device, a CUDA graph replayed), ``flopcount`` (work per inference), ``peak`` (the
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
from onnxport.bench.resident import PER_CALL, RESIDENT, ResidentRun, call_or_run, resident_run, timed_call
from onnxport.bench.runs import BenchResult, Run, bench_sizes, run, sizes_at
from onnxport.bench.tuning import TUNE_KEYS, tune

__all__ = ["PER_CALL", "RESIDENT", "TUNE_KEYS", "BenchResult", "FlopCount", "ResidentRun", "Run", "bench_sizes", "best_of",
           "cache_dir", "call_or_run", "device_peak", "flops", "resident_run", "timed_call",
           "gemm_peak", "gpu_peak", "gpu_peak_key", "interleave", "measure_gemm", "measure_gpu_gemm", "peak_gflops",
           "peak_key", "run", "sizes_at", "stats", "timed_blocks", "tune"]
