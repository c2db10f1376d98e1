"""The public Python API: façades over the pipeline (what the CLI calls).

Each façade takes the options as keywords (``inputs``, ``dims``, ``tolerance``, ``device``, … — every field
of the records in :mod:`onnxport.core.options`) or a ready :class:`~onnxport.core.options.Options` as
``options`` (the keywords then change it), builds one frozen record and hands it to the pipeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from onnxport import pipeline
from onnxport.core.errors import UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.options import QUICK_BENCH, BenchOptions, Options, RuntimeOptions, from_keywords
from onnxport.core.outdir import RESULT_FILES, prepare_out
from onnxport.core.records import CheckResult
from onnxport.pipeline import load_model
from onnxport.prove.check import check

__all__ = ["RESULT_FILES", "Options", "benchmark", "check_file", "compare_file", "convert", "export", "load_model",
           "optimize_file", "prepare_out", "use_runtime"]


def options_from(options: Options | None = None, *, bench: BenchOptions | Mapping[str, Any] | None = None,
                 **kw: Any) -> Options:
    """One :class:`Options` from ``options`` (default: the defaults) changed by the keywords; ``bench`` may be a
    BenchOptions or a dict of its fields (an empty dict: no benchmark)."""
    built = from_keywords(options, **kw)
    if bench is not None:
        if isinstance(bench, Mapping):
            bench = from_keywords(Options(bench=BenchOptions()), **dict(bench)).bench if bench else None
        built = built.but(bench=bench)
    return built


def export(source: str, out: str | Path, *, options: Options | None = None, progress: Progress = noop,
           **kw: Any) -> dict:
    """Export, check and prove ``source``; write OUT/model.onnx and OUT/report.json. Returns the report.

    Keywords: the fields of :mod:`onnxport.core.options` (``inputs``, ``dims``, ``model_args``, ``weights``,
    ``task``, ``exporter``, ``opset``, ``tolerance``, ``samples``, ``device``, ``custom_op_libraries``, …)."""
    return pipeline.run_pipeline(source, out, options_from(options, **kw), progress)


def convert(source: str, out: str | Path, *, bench: BenchOptions | Mapping[str, Any] | None = None,
            optimize: bool = True, options: Options | None = None, progress: Progress = noop, **kw: Any) -> dict:
    """The whole pipeline for ``source``: export, check, prove, optimize (``variants``: "auto" (default) builds
    the variants that can win for this model on this device and lists the others as skipped with the reason,
    "all" every one, or a list; ``budget``: seconds for the variant search; ``optimize=False`` skips it), then a
    short benchmark (``bench``: a BenchOptions or a dict of its fields; ``{}`` skips it).

    ``samples``: the user's own inputs (a .npz/.npy, a .txt/.jsonl of texts, a folder of images; ``tokenizer``:
    the tokenizer folder for texts, ``preprocess``: ``"file.py:function"`` for images): every sample is proven
    against PyTorch (``validation.samples``), static int8 calibrates on them and every variant is judged on them.
    Every façade here takes these three keywords."""
    base = options or Options()
    if bench is None and base.bench is None:  # the short benchmark, at the traffic's length; keywords may change it
        seq = kw.get("seq", base.optimize.seq)
        base = base.but(bench=replace(QUICK_BENCH, seq_lens=(seq,) if seq else None))
    built = options_from(base, bench=bench, **kw)
    if not optimize and built.optimize.variants:
        raise UsageError("--variants and --no-optimize contradict each other", "drop one of them")
    names = (built.optimize.variants or "auto") if optimize else None  # checked by the pipeline for the model's kind
    built = built.but(optimize=replace(built.optimize, variants=names))
    return pipeline.run_pipeline(source, out, built, progress)


def benchmark(source: str, out: str | Path, *, onnx_files: Sequence[str | Path] = (),
              bench: BenchOptions | Mapping[str, Any] | None = None, options: Options | None = None,
              progress: Progress = noop, **kw: Any) -> dict:
    """Prove and benchmark: export ``source`` into OUT (or prove the given ONNX files against it), then time
    PyTorch against ONNX Runtime on each file. The report's ``benchmark`` holds the runs."""
    if bench is None and (options is None or options.bench is None):
        bench = BenchOptions()
    built = options_from(options, bench=bench, **kw)
    if not onnx_files:
        return pipeline.run_pipeline(source, out, built, progress)
    built = built.but(bench=replace(built.bench, onnx_files=tuple(onnx_files)))
    return pipeline.compare_file(source, onnx_files[0], out, built, progress)


def compare_file(source: str, onnx_path: str | Path, out: str | Path, *, options: Options | None = None,
                 progress: Progress = noop, **kw: Any) -> dict:
    """Prove any ONNX file (exported by onnxport or not) against the PyTorch model; localize a divergence."""
    return pipeline.compare_file(source, onnx_path, out, options_from(options, **kw), progress)


def optimize_file(source: str, onnx_path: str | Path, out: str | Path, *, variants: str | Sequence[str] | None = None,
                  options: Options | None = None, progress: Progress = noop, **kw: Any) -> dict:
    """Prove ``onnx_path``, then build every optimized variant into OUT/variants/ and re-prove each against
    PyTorch; OUT/best.onnx is the fastest one that passed."""
    built = options_from(options, **kw)
    names = variants if variants is not None else (built.optimize.variants or "all")  # checked before the proof
    return pipeline.compare_file(source, onnx_path, out, built.but(optimize=replace(built.optimize, variants=names)),
                                 progress)


def use_runtime(custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu") -> RuntimeOptions:
    """The runtime options of ``device`` with ``custom_op_libraries`` loaded into every later ONNX Runtime
    session; fails early (exit 4) when ``device`` cannot be used here."""
    options = RuntimeOptions(device=device, custom_op_libraries=tuple(custom_op_libraries or ()))
    pipeline.use_runtime(options)
    return options


def check_file(path: str | Path) -> CheckResult:
    """Structural checks and graph summary of an ONNX file (no PyTorch needed)."""
    return check(path)
