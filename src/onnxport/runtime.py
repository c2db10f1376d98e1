"""ONNX Runtime session factory: providers and session options in one place."""

from __future__ import annotations

from pathlib import Path

from .errors import UsageError

OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "all": "ORT_ENABLE_ALL"}


def session(path: str | Path, *, providers: list | None = None, threads: int | None = None,
            opt_level: str = "all", log_severity: int = 3, inter_op_threads: int | None = None,
            execution_mode: str | None = None, enable_mem_pattern: bool | None = None,
            enable_cpu_mem_arena: bool | None = None):
    """An InferenceSession on ``path`` (CPU provider and ORT_ENABLE_ALL unless told otherwise).

    ``inter_op_threads``, ``execution_mode`` ("sequential"/"parallel"), ``enable_mem_pattern`` and
    ``enable_cpu_mem_arena`` keep ONNX Runtime's defaults when None.
    """
    import onnxruntime as ort

    ort.set_default_logger_severity(log_severity)  # kernel errors are reported by the caller, not logged
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    opts.log_severity_level = log_severity
    if threads:
        opts.intra_op_num_threads = threads
    if inter_op_threads:
        opts.inter_op_num_threads = inter_op_threads
    if execution_mode is not None:  # "sequential" | "parallel"
        opts.execution_mode = getattr(ort.ExecutionMode, f"ORT_{execution_mode.upper()}")
    if enable_mem_pattern is not None:
        opts.enable_mem_pattern = enable_mem_pattern
    if enable_cpu_mem_arena is not None:
        opts.enable_cpu_mem_arena = enable_cpu_mem_arena
    try:
        return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
        raise UsageError(f"onnxruntime cannot load {Path(path).name}: {str(e).strip().splitlines()[0][:300]}",
                         "run 'onnxport check' on the file; the model may use an operator or opset this "
                         "onnxruntime lacks") from None
