"""What a run was asked to do: one frozen :class:`Options` record, composed of one small record per option
family (load, export, proof, optimize, bench, runtime). The CLI builds it once from its shared option groups,
:mod:`onnxport.api` from its keywords; the pipeline's entries take ``(source, out, options)`` and hand each
stage the family it reads. Nothing is read from process-wide state.

Every value is checked when the record is made (:meth:`Options.checked`), before any slow work: a tolerance
that is not a finite number >= 0, a batch size or thread count below 1 or a budget <= 0 is a UsageError
(exit 2) naming the option.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.onnxfile import external_threshold
from onnxport.core.records import FP32, Tolerance
from onnxport.core.spec import Dim, InputSpec, merge_dims, parse_dim, parse_input

DEVICES = ("cpu", "cuda")
PLAIN_EXPORTERS = ("dynamo", "torchscript")  # --exporter: the plain exporters (onnxport.exporters.strategies)
CONTROL_FLOW_EXPORTERS = ("cond", "script", "scan")  # those that keep data-dependent control flow
EXPORTER_CHOICES = ("auto", *PLAIN_EXPORTERS, *CONTROL_FLOW_EXPORTERS)


@dataclass(frozen=True)
class GpuOptions:
    """How the GPU providers are configured (TensorRT options follow ONNX Runtime's names)."""

    device_id: int = 0
    fp16: bool = False  # trt_fp16_enable: TensorRT may run layers in fp16
    trt_workspace_bytes: int = 2 * 1024**3  # trt_max_workspace_size
    trt_engine_cache: str | None = None  # folder for built engines (trt_engine_cache_enable + _path)
    tensorrt: bool = True  # put TensorRT first when it is available
    tf32: bool = False  # the CUDA provider's use_tf32: off, so fp32 MatMul/Conv are fp32 (strict proof)

    def tensorrt_options(self) -> dict:
        opts: dict = {"device_id": self.device_id, "trt_fp16_enable": self.fp16,
                      "trt_max_workspace_size": int(self.trt_workspace_bytes)}
        if self.trt_engine_cache:
            opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(self.trt_engine_cache),
                        trt_timing_cache_enable=True, trt_timing_cache_path=str(self.trt_engine_cache))
        return opts

    def cuda_options(self) -> dict:
        return {"device_id": self.device_id, "cudnn_conv_algo_search": "EXHAUSTIVE",
                "do_copy_in_default_stream": True, "use_tf32": "1" if self.tf32 else "0"}


@dataclass(frozen=True)
class LoadOptions:
    """How the model source is loaded (``--input``, ``--dim``, ``--model-args``, ``--weights``, ``--task``,
    ``--trust-remote-code``, ``--compare``, ``--working-sizes``, ``--strict-dims``)."""

    inputs: tuple[str | InputSpec, ...] = ()
    dims: tuple[str | Dim, ...] = ()
    model_args: Mapping[str, Any] | str | None = None
    weights: str | None = None
    task: str | None = None
    trust_remote_code: bool = False
    compare: tuple[str, ...] | Mapping[str, str] | None = None
    working_sizes: bool = False  # the default now; kept for the command lines that spell it
    strict_dims: bool = False  # a dim the model runs at some sizes of only is an error (exit 2)


@dataclass(frozen=True)
class ExportOptions:
    """How the model is exported (``--exporter``, ``--opset``, ``--max-length`` for a KV cache)."""

    exporter: str = "auto"
    opset: int | None = None
    max_length: int | None = None  # causal LMs exported with their KV cache only


@dataclass(frozen=True)
class ProofOptions:
    """How the export is proven (``--atol``/``--rtol``) and on what data besides the generated cases
    (``--samples``, read with ``--tokenizer`` or ``--preprocess``)."""

    tolerance: Tolerance = FP32
    samples: str | Path | None = None
    tokenizer: str | Path | None = None
    preprocess: str | None = None


@dataclass(frozen=True)
class OptimizeOptions:
    """Which variants are built (``--variants``: a list of names, "auto" or "all"; None: none), how long
    the search may take (``--budget``) and the sequence length of the traffic they are timed at (``--seq``)."""

    variants: tuple[str, ...] | str | None = None
    budget: float | None = None
    seq: int | None = None

    @property
    def enabled(self) -> bool:
        return self.variants is not None


@dataclass(frozen=True)
class BenchOptions:
    """How the benchmark times PyTorch against ONNX Runtime (``bench``'s options; convert runs a short one)."""

    batches: tuple[int, ...] = (1, 8)
    seq_lens: tuple[int, ...] | None = None
    threads: int | None = None
    warmup: int = 5
    min_runs: int = 50
    max_seconds: float = 10.0
    block: int = 5  # timed calls per backend in a row (each round starts with an untimed one)
    tune_ort: bool = False
    compile: bool = False
    io_binding: bool | None = None  # None: on with --device cuda
    onnx_files: tuple[str | Path, ...] = ()  # files to time instead of a new export (the first is proven)


QUICK_BENCH = BenchOptions(batches=(1, 8), warmup=2, min_runs=20, max_seconds=1.5, block=2)  # convert's short one


@dataclass(frozen=True)
class RuntimeOptions:
    """Where ONNX Runtime and PyTorch run (``--device``), the GPU providers' settings and the compiled
    custom-op libraries loaded into every session (``--custom-op-library``)."""

    device: str = "cpu"
    gpu: GpuOptions = field(default_factory=GpuOptions)
    custom_op_libraries: tuple[str | Path, ...] = ()


@dataclass(frozen=True)
class Options:
    """Everything a pipeline run was asked for. ``bench`` None: no benchmark; ``optimize.variants`` None: no
    variants. ``command`` is the command line recorded in the report, ``log_name`` the file beside it holding
    what the libraries printed, ``force`` allows overwriting earlier results in OUT."""

    load: LoadOptions = field(default_factory=LoadOptions)
    export: ExportOptions = field(default_factory=ExportOptions)
    proof: ProofOptions = field(default_factory=ProofOptions)
    optimize: OptimizeOptions = field(default_factory=OptimizeOptions)
    bench: BenchOptions | None = None
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    force: bool = False
    command: str | None = None
    log_name: str | None = None

    def but(self, **changes: Any) -> Options:
        """A copy with whole families (or top-level fields) replaced."""
        return replace(self, **changes)

    def checked(self) -> Options:
        """``self`` after checking every value that can be checked without the model (UsageError otherwise)."""
        check_tolerance(self.proof.tolerance)
        if self.runtime.device not in DEVICES:
            raise UsageError(f"unknown --device '{self.runtime.device}'", "use cpu or cuda")
        if self.export.exporter not in EXPORTER_CHOICES:
            raise UsageError(f"unknown exporter '{self.export.exporter}'", f"use one of {', '.join(EXPORTER_CHOICES)}")
        _at_least("--opset", self.export.opset, 1)
        _at_least("--max-length", self.export.max_length, 2)
        _at_least("--seq", self.optimize.seq, 1)
        if self.optimize.budget is not None and not (math.isfinite(self.optimize.budget) and self.optimize.budget > 0):
            raise UsageError(f"--budget must be a number of seconds > 0, got {self.optimize.budget}", "e.g. --budget 300")
        if self.bench is not None:
            check_bench(self.bench)
        check_load(self.load, self.bench)
        external_threshold()  # a malformed ONNXPORT_EXTERNAL_DATA_THRESHOLD fails here, not after the export
        return self


def check_tolerance(tol: Tolerance) -> None:
    """A tolerance is two finite numbers >= 0 (nan or inf would prove anything or nothing)."""
    for name, value in (("--atol", tol.atol), ("--rtol", tol.rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise UsageError(f"{name} must be a finite number >= 0, got {value}",
                             f"e.g. {name} {FP32.atol if name == '--atol' else FP32.rtol}")


def check_bench(b: BenchOptions) -> None:
    """Batch sizes, sequence lengths, threads and runs are >= 1, the time per size > 0."""
    for b_ in b.batches:
        _at_least("--batch", b_, 1)
    if not b.batches:
        raise UsageError("no batch size to time", "give --batch N")
    for s in b.seq_lens or ():
        _at_least("--seq", s, 1)
    _at_least("--threads", b.threads, 1)
    _at_least("--min-runs", b.min_runs, 1)
    if not (math.isfinite(b.max_seconds) and b.max_seconds > 0):
        raise UsageError(f"--seconds must be > 0, got {b.max_seconds}", "e.g. --seconds 10")


MAX_BATCH = 65536  # bench --batch: beyond this no input is realistic, and the machine would be killed first
MEMORY_SHARE = 4  # the declared inputs at their largest sizes may take at most 1/4 of the machine's memory


def check_load(load: LoadOptions, bench: BenchOptions | None = None) -> None:
    """The declared inputs and dims, before the model is loaded: no zero-size axis (a proof on empty tensors
    proves nothing), no dim declared with one size only (that is a fixed size: write it in --input), and the
    inputs at their largest declared sizes (and bench's largest --batch) fit in a share of this machine's memory."""
    if isinstance(load.model_args, str):
        parse_model_args(load.model_args)  # bad JSON is refused here, before the model is loaded
    specs = [i if isinstance(i, InputSpec) else parse_input(i) for i in load.inputs]
    dims = [d if isinstance(d, Dim) else parse_dim(d) for d in load.dims]
    for spec in specs:
        if 0 in spec.shape:
            raise UsageError(f"--input '{spec.name}' has a zero-size axis ({spec})",
                             "a proof on empty tensors checks nothing: give the axis a size, or a dim symbol")
    for d in dims:
        if d.min == d.max:
            raise UsageError(f"--dim {d} declares one size only, so the dim cannot vary",
                             f"write the size in --input instead of '{d.symbol}' (it is then fixed), or give a range "
                             f"with two sizes at least, e.g. -d {d.symbol}={d.min}..{d.min * 2}")
    if bench is not None and max(bench.batches, default=1) > MAX_BATCH:
        raise UsageError(f"--batch {max(bench.batches)} is beyond any realistic batch (at most {MAX_BATCH})",
                         "time the batch sizes you serve, e.g. --batch 1,8,32")
    if not specs:
        return
    declared = merge_dims(specs, dims)
    largest = {sym: d.max for sym, d in declared.items()}
    if bench is not None:
        largest.update({sym: max(largest[sym], *bench.batches) for sym in largest if "batch" in sym.lower()})
    need = sum(_bytes(spec, largest) for spec in specs)
    limit = machine_memory() // MEMORY_SHARE
    if need > limit:
        raise UsageError(f"at their largest declared sizes the inputs alone take {need / 2**30:.1f} GiB, more than "
                         f"a quarter of this machine's memory ({limit * MEMORY_SHARE / 2**30:.1f} GiB)",
                         "declare the ranges the model really serves with --dim (or smaller sizes in --input)")


def parse_model_args(text: str | None) -> dict[str, Any]:
    """Parse ``--model-args`` JSON (an object of constructor keyword arguments)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--model-args is not valid JSON: {e.msg} at column {e.colno}",
                         """write a JSON object, e.g. '{"vocab_size": 30000}'""") from None
    if not isinstance(value, dict):
        raise UsageError("--model-args must be a JSON object", """write e.g. '{"num_classes": 10}'""")
    return value


def _bytes(spec: InputSpec, sizes: dict[str, int]) -> int:
    n = 1
    for axis in spec.shape:
        n *= sizes.get(axis, 1) if isinstance(axis, str) else int(axis)
    return n * np.dtype(spec.dtype if spec.dtype != "bfloat16" else "float16").itemsize


def machine_memory() -> int:
    """Bytes of memory on this machine (64 GiB when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30


def _at_least(option: str, value: int | None, low: int) -> None:
    if value is not None and value < low:
        raise UsageError(f"{option} must be at least {low}, got {value}", f"e.g. {option} {max(low, 2)}")


def from_keywords(base: Options | None = None, **kw: Any) -> Options:
    """An :class:`Options` from the flat keywords of :mod:`onnxport.api` (each keyword goes to the family
    that has a field of that name; ``tolerance`` to proof, ``budget``/``seq``/``variants`` to optimize,
    ``device``/``custom_op_libraries``/``gpu`` to runtime). An unknown keyword is a TypeError, as for any call."""
    base = base or Options()
    families = {f.name: getattr(base, f.name) for f in fields(Options) if f.name not in _TOP}
    changes: dict[str, dict[str, Any]] = {name: {} for name in families}
    top: dict[str, Any] = {}
    for key, value in kw.items():
        if key in _TOP:
            top[key] = value
            continue
        owner = _OWNER.get(key)
        if owner is None:
            raise TypeError(f"unexpected keyword argument '{key}'")
        changes[owner][key] = _normalized(key, value)
    built = {}
    for name, record in families.items():
        if name == "bench":
            continue
        built[name] = replace(record, **changes[name]) if changes[name] else record
    if changes["bench"]:
        built["bench"] = replace(families["bench"] or BenchOptions(), **changes["bench"])
    return replace(base, **built, **top)


_TOP = ("force", "command", "log_name")
_OWNER: dict[str, str] = {
    **{f.name: "load" for f in fields(LoadOptions)}, **{f.name: "export" for f in fields(ExportOptions)},
    **{f.name: "proof" for f in fields(ProofOptions)}, **{f.name: "optimize" for f in fields(OptimizeOptions)},
    **{f.name: "bench" for f in fields(BenchOptions) if f.name not in ("seq_lens",)}, "seq_lens": "bench",
    **{f.name: "runtime" for f in fields(RuntimeOptions)},
}
_OWNER["seq"] = "optimize"  # --seq of convert/optimize: the traffic's length (bench sweeps seq_lens)


def _normalized(key: str, value: Any) -> Any:
    """Sequences as tuples (the record stays hashable and frozen), everything else as given."""
    if key in ("inputs", "dims", "custom_op_libraries", "batches", "onnx_files"):
        return tuple(value or ())
    if key == "seq_lens":
        return tuple(value) if value else None
    if key == "compare" and value is not None and not isinstance(value, (str, Mapping)):
        return tuple(value)
    if key == "variants" and isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(value)
    return value
