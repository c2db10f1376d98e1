"""The public Python API: façades over the pipeline (what the CLI calls)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxport.core.errors import UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.records import FP32, CheckResult, Tolerance
from onnxport.core.spec import Dim, InputSpec
from onnxport.optimize import parse_names
from onnxport.pipeline import RESULT_FILES, compare_file, load_model, prepare_out, run_pipeline, use_runtime
from onnxport.prove.check import check

__all__ = ["RESULT_FILES", "benchmark", "check_file", "compare_file", "convert", "export", "load_model",
           "optimize_file", "prepare_out", "use_runtime"]


def export(source: str, out: str | Path, *, inputs: Sequence[str | InputSpec] | None = None,
           dims: Sequence[str | Dim] | None = None, model_args: dict | str | None = None,
           weights: str | None = None, task: str | None = None, exporter: str = "auto", opset: int | None = None,
           tolerance: Tolerance = FP32, force: bool = False, trust_remote_code: bool = False,
           command: str | None = None, progress: Progress = noop, **kwargs: Any) -> dict:
    """Export, check and prove ``source``; write OUT/model.onnx and OUT/report.json. Returns the report.

    Further keywords (``device``, ``custom_op_libraries``) are those of :func:`convert`."""
    return run_pipeline(source, out, inputs=inputs, dims=dims, model_args=model_args, weights=weights, task=task,
                     exporter=exporter, opset=opset, tolerance=tolerance, force=force,
                     trust_remote_code=trust_remote_code, command=command, progress=progress, **kwargs)


QUICK_BENCH = {"batches": (1, 8), "warmup": 2, "min_runs": 20, "max_seconds": 2.0}


def convert(source: str, out: str | Path, *, bench: dict | None = None, optimize: bool = True, **kwargs: Any) -> dict:
    """The whole pipeline for ``source``: export, check, prove, optimize (``variants``: "auto" (default) builds
    the variants that can win for this model on this device and lists the others as skipped with the reason,
    "all" every one, or a list; ``budget``: seconds for the variant search; ``optimize=False`` skips it), then a
    short benchmark (``bench``: options for bench.run; ``{}`` skips it).

    ``samples``: the user's own inputs (a .npz/.npy, a .txt/.jsonl of texts, a folder of images; ``tokenizer``:
    the tokenizer folder for texts, ``preprocess``: ``"file.py:function"`` for images): every sample is proven
    against PyTorch (``validation.samples``), static int8 calibrates on them and every variant is judged on them.
    Every façade here takes these three keywords."""
    if not optimize and kwargs.get("variants"):
        raise UsageError("--variants and --no-optimize contradict each other", "drop one of them")
    kwargs["variants"] = parse_names(kwargs.get("variants") or "auto") if optimize else None
    if bench is None:
        bench = {**QUICK_BENCH, **({"seq_lens": [kwargs["seq"]]} if kwargs.get("seq") else {})}
    return run_pipeline(source, out, bench=bench, **kwargs)


def benchmark(source: str, out: str | Path, *, onnx_files: Sequence[str | Path] = (), bench: dict | None = None,
              **kwargs: Any) -> dict:
    """Prove and benchmark: export ``source`` into OUT (or prove the given ONNX files against it), then time
    PyTorch against ONNX Runtime on each file. The report's ``benchmark`` holds the runs."""
    opts = dict(bench or {})
    if onnx_files:
        kwargs.pop("exporter", None)
        kwargs.pop("opset", None)
        return compare_file(source, onnx_files[0], out, bench=opts or {"batches": (1, 8)},
                            extra_files=list(onnx_files[1:]), **kwargs)
    return run_pipeline(source, out, bench=opts or {"batches": (1, 8)}, **kwargs)


def optimize_file(source: str, onnx_path: str | Path, out: str | Path, *, variants: str | Sequence[str] | None = None,
                  **kwargs: Any) -> dict:
    """Prove ``onnx_path``, then build every optimized variant into OUT/variants/ and re-prove each against
    PyTorch; OUT/best.onnx is the fastest one that passed."""
    names = parse_names(variants)  # an unknown name fails before the (slow) proof
    return compare_file(source, onnx_path, out, variants=names, **kwargs)


def check_file(path: str | Path) -> CheckResult:
    """Structural checks and graph summary of an ONNX file (no PyTorch needed)."""
    return check(path)
