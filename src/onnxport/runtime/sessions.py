"""ONNX Runtime session factory: providers, session options, custom-op libraries and IO binding in one place.

``--device cuda`` asks for the provider chain TensorRT → CUDA → CPU: ONNX Runtime gives each node to the first
provider in the list that can run it, so every node TensorRT cannot take goes to CUDA and every node neither
can take falls back to the CPU. TensorRT joins the chain only when its library loads
(:mod:`onnxport.runtime.libraries`). :func:`placement` reports which providers a session really uses and which
nodes ended up on the CPU, compute nodes told from shape nodes (from ONNX Runtime's verbose "Node placements"
log written while the session is created; :mod:`onnxport.runtime.placement`).
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onnxport.core.errors import EnvironmentProblem, UsageError
from onnxport.core.logs import captured_fds
from onnxport.core.onnxfile import file_bytes, inline_limit
from onnxport.core.options import DEVICES, GpuOptions, RuntimeOptions
from onnxport.runtime import ops
from onnxport.runtime.libraries import Probe, status, tensorrt_loadable
from onnxport.runtime.placement import Placement, classify, count_memcpy, parse_placement

if TYPE_CHECKING:
    import onnx

__all__ = ["DEVICES", "GpuOptions", "Placement", "parse_placement"]  # re-exported from onnxport.runtime.placement (with the rest below)

OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "all": "ORT_ENABLE_ALL"}
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_INSTALL_HINT = ("install onnxruntime-gpu (pip uninstall onnxruntime && pip install onnxruntime-gpu) and a CUDA "
                    "build of torch (https://pytorch.org/get-started/locally/) on a machine with an NVIDIA GPU and "
                    "driver, or use --device cpu")


# --------------------------------------------------------------------------- providers


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build offers."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def provider_chain(device: str = "cpu", *, gpu: GpuOptions | None = None,
                   available: Sequence[str] | None = None, probe: Probe | None = None) -> list:
    """The providers to ask ONNX Runtime for on ``device``: CPU alone, or TensorRT → CUDA → CPU with their
    options, keeping only those this onnxruntime offers (``available``: a simulated list in tests).

    TensorRT is kept only when its library loads (:func:`~onnxport.runtime.libraries.tensorrt_loadable`):
    onnxruntime-gpu lists it without TensorRT installed, and asking for it then prints an "EP Error" block
    and falls back (:func:`unloadable_providers` says what was dropped). ``probe`` is a simulated library
    probe; with a simulated ``available`` list and no probe, the listed providers are taken as loadable.

    ``cuda`` without the CUDA provider is an EnvironmentProblem (exit 4) naming what to install."""
    if device not in DEVICES:
        raise UsageError(f"unknown --device '{device}'", "use cpu or cuda")
    if device == "cpu":
        return [CPU]
    have = set(available_providers() if available is None else available)
    gpu = gpu or GpuOptions()
    if CUDA not in have:
        raise EnvironmentProblem(
            f"--device cuda needs ONNX Runtime's CUDAExecutionProvider; this onnxruntime offers only "
            f"{', '.join(sorted(have)) or 'none'}", GPU_INSTALL_HINT, code="cuda-unavailable")
    chain: list = []
    if gpu.tensorrt and TENSORRT in have and TENSORRT not in unloadable_providers(have, probe, simulated=available):
        chain.append((TENSORRT, gpu.tensorrt_options()))
    chain.append((CUDA, gpu.cuda_options()))
    chain.append(CPU)
    return chain


def unloadable_providers(available: Sequence[str] | set[str] | None = None, probe: Probe | None = None, *,
                         simulated: Sequence[str] | None = None) -> dict[str, str]:
    """The providers onnxruntime lists but cannot start here, each with one line saying why
    ({provider: line}); today TensorRT without its library. ``available`` None: this onnxruntime's list.
    ``simulated`` (a simulated provider list, as in :func:`provider_chain`) without a ``probe``: nothing."""
    have = set(available_providers() if available is None else available)
    if TENSORRT not in have or (probe is None and simulated is not None):
        return {}
    if tensorrt_loadable(probe):
        return {}
    tried = status("tensorrt", probe).tried
    return {TENSORRT: f"{TENSORRT} is listed by onnxruntime but TensorRT's library does not load (tried "
                      f"{', '.join(tried[:3])}): left out of the provider chain; install TensorRT "
                      f"(pip install tensorrt-cu12) to use it"}


def provider_names(chain: Sequence) -> list[str]:
    """Just the names of a provider list that may hold (name, options) pairs."""
    return [p[0] if isinstance(p, tuple) else p for p in chain]


def check_device(device: str, *, torch_cuda: bool | None = None, available: Sequence[str] | None = None) -> None:
    """Fail early (exit 4, with what to install) when ``device`` cannot be used by PyTorch or ONNX Runtime."""
    if device not in DEVICES:
        raise UsageError(f"unknown --device '{device}'", "use cpu or cuda")
    if device == "cpu":
        return
    if torch_cuda is None:
        import torch

        torch_cuda = bool(torch.cuda.is_available())
    if not torch_cuda:
        raise EnvironmentProblem("--device cuda was asked for but PyTorch sees no CUDA device (a CPU-only torch "
                                 "build, no NVIDIA driver, or no GPU)", GPU_INSTALL_HINT, code="cuda-unavailable")
    provider_chain("cuda", available=available)


def runtime_providers(options: RuntimeOptions) -> list:
    """The provider chain of a run's runtime options (:func:`provider_chain` of its device and GPU settings)."""
    return provider_chain(options.device, gpu=options.gpu)


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """PyTorch's TF32 switches off (matmul and cuDNN, float32 matmul precision "highest") for the fp32 proof on
    a GPU, restored afterwards; onnxruntime's side is :attr:`GpuOptions.tf32` (off by default)."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


# --------------------------------------------------------------------------- sessions


EXECUTION_MODES = ("sequential", "parallel")


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session options that matter for speed (None = ONNX Runtime's default: not set).

    ``execution_mode`` and ``graph_optimization_level`` default to "sequential" and "all" (what bench times);
    None there means "not given" too (:meth:`from_tuned`): :func:`session` leaves the execution mode unset, and
    a caller passes no ``opt_level``."""

    intra_op_num_threads: int | None = None
    inter_op_num_threads: int | None = None
    execution_mode: str | None = "sequential"
    graph_optimization_level: str | None = "all"
    enable_mem_pattern: bool | None = None
    enable_cpu_mem_arena: bool | None = None

    def __post_init__(self) -> None:
        if self.execution_mode is not None and self.execution_mode not in EXECUTION_MODES:
            raise UsageError(f"unknown execution mode '{self.execution_mode}'", "use sequential or parallel")
        if self.graph_optimization_level is not None and self.graph_optimization_level not in OPT_LEVELS:
            raise UsageError(f"unknown graph optimization level '{self.graph_optimization_level}'",
                             f"use one of {', '.join(OPT_LEVELS)}")

    @classmethod
    def from_dict(cls, d: dict) -> OrtOptions:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def from_tuned(cls, tuned: object) -> OrtOptions | None:
        """The options report.json's ``benchmark.tuned`` sets (bench's tuning: flat, or its result
        ``{"config": {...}, "p50_ms": ...}``), each field None where the report gives no usable value (ONNX
        Runtime's default): thread counts only when positive ints, the memory switches only when booleans.
        None when it sets nothing (not an object, or no such key). An execution mode or optimization level it
        does not know is a UsageError naming the report's key."""
        if not isinstance(tuned, dict):
            return None
        if isinstance(tuned.get("config"), dict):
            tuned = tuned["config"]
        intra, inter = (tuned.get(key) for key in ("intra_op_num_threads", "inter_op_num_threads"))
        mode, level = tuned.get("execution_mode"), tuned.get("graph_optimization_level")
        if mode is not None and mode not in EXECUTION_MODES:
            raise UsageError(f"report.json benchmark.tuned.execution_mode is {mode!r}",
                             "use 'sequential' or 'parallel', or re-run the benchmark")
        if level is not None and level not in OPT_LEVELS:
            raise UsageError(f"report.json benchmark.tuned.graph_optimization_level is {level!r}",
                             f"use one of {', '.join(OPT_LEVELS)}, or re-run the benchmark")
        mem, arena = (tuned.get(key) for key in ("enable_mem_pattern", "enable_cpu_mem_arena"))
        found = cls(intra_op_num_threads=intra if isinstance(intra, int) and intra > 0 else None,
                    inter_op_num_threads=inter if isinstance(inter, int) and inter > 0 else None,
                    execution_mode=mode, graph_optimization_level=level,
                    enable_mem_pattern=mem if isinstance(mem, bool) else None,
                    enable_cpu_mem_arena=arena if isinstance(arena, bool) else None)
        return None if found == cls.unset() else found

    @classmethod
    def unset(cls) -> OrtOptions:
        """Every option left to ONNX Runtime (execution mode and optimization level too)."""
        return cls(execution_mode=None, graph_optimization_level=None)


def session(source: str | Path | onnx.ModelProto, *, providers: list | None = None, threads: int | None = None,
            opt_level: str = "all", options: OrtOptions | None = None, log_severity: int = 3,
            log_sink: list[str] | None = None, keep_verbose: bool = False):
    """An InferenceSession on ``source`` (a file, or a model held in memory; ``providers``: a provider chain,
    default the CPU; ORT_ENABLE_ALL unless told otherwise).

    ``options``: the inter-op threads, execution mode, memory pattern and CPU arena to set (None: ONNX
    Runtime's defaults; ``threads`` and ``opt_level`` are given on their own). Registered custom-op libraries
    and Python implementations (custom_ops) are loaded into every session.

    With ``log_sink`` a session is created with verbose logging, everything written while it is created
    (file descriptors 1 and 2) is appended to the sink (see :func:`placement`), and the session returned is
    created again at ``log_severity``: a session keeps the log level it was created with, and the verbose one
    would log on stderr at every run. ``keep_verbose`` returns the verbose session itself, on one thread (for
    a caller that reads it and drops it). What onnxruntime prints on stdout while a session is created (its "EP Error"
    fallback notice) never reaches stdout: it goes to the sink, else to stderr.
    """
    kw: dict = dict(threads=threads, opt_level=opt_level)
    if options is not None:
        kw.update(inter_op_threads=options.inter_op_num_threads, execution_mode=options.execution_mode,
                  enable_mem_pattern=options.enable_mem_pattern, enable_cpu_mem_arena=options.enable_cpu_mem_arena)
    try:
        if log_sink is None:
            return _open(source, providers, log_severity, None, **kw)
        # one thread: a pool's threads log verbosely as they start, maybe after the capture has ended
        verbose = _open(source, providers, 0, log_sink, restore=log_severity,
                        **{**kw, "threads": 1, "inter_op_threads": 1})
        if keep_verbose:
            return verbose
        del verbose
        return _open(source, providers, log_severity, log_sink, **kw)
    except EnvironmentProblem:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
        raise _load_error(source, e) from None


def write_optimized(src: str | Path, dst: str | Path, *, opt_level: str = "extended", providers: list | None = None,
                    external: bool | None = None) -> Path:
    """Write ``src`` as ONNX Runtime optimizes it at ``opt_level`` to ``dst`` (offline optimization; default
    extended: portable, no hardware-specific layouts), opened like every session (custom ops, spinning stop).

    The weights go to ``<dst name>.data`` beside it when ``external`` (None: when ``src`` is over
    :func:`~onnxport.core.onnxfile.inline_limit`). Raises what onnxruntime raises, and RuntimeError when it
    wrote nothing."""
    src, dst = Path(src), Path(dst)
    if external is None:
        external = file_bytes(src) > inline_limit()
    config = {"session.optimized_model_external_initializers_file_name": dst.name + ".data"} if external else {}
    _open(src, providers, 3, None, opt_level=opt_level, optimized=dst, config=config)
    if not dst.exists():
        raise RuntimeError("onnxruntime wrote no optimized model")
    return dst


def _options(ort, severity: int, *, threads: int | None = None, opt_level: str = "all",
             inter_op_threads: int | None = None, execution_mode: str | None = None,
             enable_mem_pattern: bool | None = None, enable_cpu_mem_arena: bool | None = None,
             optimized: Path | None = None, config: dict[str, str] | None = None):
    """The ``ort.SessionOptions`` of every session onnxport opens (None: ONNX Runtime's default)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    opts.log_severity_level = severity
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
    if optimized is not None:
        opts.optimized_model_filepath = str(optimized)
    # Worker threads stop spinning when a run ends: a spinning pool left behind by one session (or by a
    # benchmark of another variant) otherwise takes the cores from the next one; a run's own parallel
    # sections still spin. Measured: three MiniLM sessions timed in turn ran 1.7-2.8x slower without it.
    for key, value in {"session.force_spinning_stop": "1", **(config or {})}.items():
        opts.add_session_config_entry(key, value)
    return opts


def _open(source: str | Path | onnx.ModelProto, providers: list | None, severity: int, sink: list[str] | None, *,
          restore: int | None = None, **options):
    """One InferenceSession at log ``severity`` (``options``: those of :func:`_options`); with ``sink`` and
    severity 0 its creation's fd 1 and 2 go to the sink. The default logger's severity is set to ``restore``
    afterwards, even on failure. Raises what onnxruntime raises."""
    import onnxruntime as ort

    opts = _options(ort, severity, **options)
    chain = providers or [CPU]
    printed = io.StringIO()
    fds = captured_fds(sink, (1, 2)) if sink is not None and severity == 0 else contextlib.nullcontext()
    try:
        with _prepared(source, opts) as loadable, fds, _printed_to(printed, chain):
            # set inside the capture: a pool thread of an earlier session that starts now logs into the sink,
            # not onto the terminal (its start is logged at the default logger's severity of that moment)
            ort.set_default_logger_severity(severity)
            try:
                return ort.InferenceSession(loadable, opts, providers=chain)
            finally:  # still inside the capture: a thread the session started logs nothing verbose after it
                if restore is not None:
                    ort.set_default_logger_severity(restore)
    finally:
        if restore is not None:
            ort.set_default_logger_severity(restore)
        if printed.getvalue():
            (sink.append if sink is not None else sys.stderr.write)(printed.getvalue())


@contextlib.contextmanager
def _prepared(source: str | Path | onnx.ModelProto, opts) -> Iterator[str | bytes]:
    """What ``InferenceSession`` loads, the custom-op implementations registered on ``opts``
    (:func:`~onnxport.runtime.ops.prepare_session`). A model in memory is serialized, or written to a
    temporary folder first when one of its nodes runs through a Python implementation (which loads a file)."""
    if isinstance(source, (str, Path)):
        with ops.prepare_session(source, opts) as path:
            yield path
        return
    if not any(op in ops.python_ops() for op in ops.model_custom_ops(source)):
        for lib in ops.libraries():
            opts.register_custom_ops_library(str(lib))
        yield source.SerializeToString()
        return
    import onnx

    with tempfile.TemporaryDirectory(prefix="onnxport-session-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(source, str(path))
        with ops.prepare_session(path, opts) as load_path:
            yield load_path


_PRINTS = threading.Lock()


@contextlib.contextmanager
def _printed_to(buffer: io.StringIO, chain: Sequence) -> Iterator[None]:
    """Python's stdout into ``buffer`` while a session with a GPU provider is created (onnxruntime prints
    its provider fallback there); one session at a time, so that concurrent ones restore stdout in order."""
    if all(name == CPU for name in provider_names(chain)):
        yield
        return
    with _PRINTS, contextlib.redirect_stdout(buffer):
        yield


def _load_error(source: str | Path | onnx.ModelProto, e: Exception) -> UsageError:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    hint = "run 'onnxport check' on the file; the model may use an operator or opset this onnxruntime lacks"
    if "is not a registered function/op" in msg:
        hint = ("the model uses a custom operator: pass its compiled library with --custom-op-library, or "
                "register a Python implementation with onnxport.exporters.custom_ops.ort_python_op (docs/custom_ops.md)")
    name = Path(source).name if isinstance(source, (str, Path)) else f"the model '{source.graph.name}'"
    return UsageError(f"onnxruntime cannot load {name}: {msg}", hint)


# --------------------------------------------------------------------------- placement


def placement(path: str | Path, device: str = "cpu", *, gpu: GpuOptions | None = None,
              available: Sequence[str] | None = None, providers: list | None = None,
              probe: Probe | None = None) -> Placement:
    """Open a session on ``path`` with ``device``'s provider chain and report where the nodes went.

    ``providers`` overrides the chain (e.g. a simulated chain in tests); ``available`` and ``probe``
    simulate the provider list and the library probe."""
    chain = (providers if providers is not None
             else provider_chain(device, gpu=gpu, available=available, probe=probe))
    log: list[str] = []
    sess = session(path, providers=chain, log_sink=log, keep_verbose=True)
    graph = None
    if device != "cpu":
        try:
            import onnx

            graph = onnx.load(str(path), load_external_data=False).graph
        except Exception:  # noqa: BLE001 - the graph only refines the classification
            graph = None
    return placement_from(sess, device, chain, "".join(log), graph=graph, available=available, probe=probe,
                          gpu=gpu)


def placement_from(sess, device: str, chain: Sequence, log: str, *, graph=None,
                   available: Sequence[str] | None = None, probe: Probe | None = None,
                   gpu: GpuOptions | None = None) -> Placement:
    """:class:`Placement` from an open session and the verbose log of its creation; ``graph`` (the ONNX
    graph, when known) tells shape ops on shapes from the same ops on data (see
    :mod:`onnxport.runtime.placement`). Providers listed but unloadable are reported unless ``gpu`` turned
    TensorRT off."""
    counts, nodes = parse_placement(log)
    used = tuple(sess.get_providers())
    fallback: tuple[str, ...] = ()
    compute: tuple[str, ...] = ()
    shape: tuple[str, ...] = ()
    unloadable: tuple[str, ...] = ()
    if device != "cpu":
        fallback = tuple(nodes.get(CPU, ()))
        if not fallback and counts.get(CPU) and len(counts) == 1:
            fallback = compute = (f"all {counts[CPU]} nodes",)
        else:
            compute, shape = classify(fallback, log, graph)
        if (gpu or GpuOptions()).tensorrt:
            unloadable = tuple(unloadable_providers(available, probe, simulated=available).values())
    return Placement(device, tuple(provider_names(chain)), used, counts, fallback, compute, shape,
                     count_memcpy(nodes), unloadable)


# --------------------------------------------------------------------------- IO binding


class BoundRunner:
    """Runs a session through IO binding with inputs and outputs living on the session's device.

    Inputs are copied to the device once (:meth:`bind`); each :meth:`run` then executes without host-device
    copies; :meth:`outputs` copies the results back. On the CPU provider this runs for real (device "cpu")."""

    def __init__(self, sess, device: str = "cpu", device_id: int = 0) -> None:
        self.session = sess
        self.device = "cuda" if device == "cuda" else "cpu"
        self.device_id = device_id
        self.binding = sess.io_binding()
        self._inputs: dict = {}

    def bind(self, feeds: dict) -> None:
        import numpy as np
        import onnxruntime as ort

        self.binding.clear_binding_inputs()
        self.binding.clear_binding_outputs()
        for meta in self.session.get_inputs():
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(feeds[meta.name]), self.device,
                                                     self.device_id)
            self._inputs[meta.name] = value  # keep the device buffer alive
            self.binding.bind_ortvalue_input(meta.name, value)
        for meta in self.session.get_outputs():
            self.binding.bind_output(meta.name, self.device, self.device_id)

    def run(self) -> None:
        self.binding.synchronize_inputs()
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()

    def outputs(self) -> list:
        return self.binding.copy_outputs_to_cpu()


# --------------------------------------------------------------------------- PyTorch on the device


class OnDevice:
    """Wraps a module so that callers keep passing and receiving CPU tensors while it computes on ``device``."""

    def __init__(self, module, device: str) -> None:
        self.module = module.to(device)
        self.device = device

    def __call__(self, *args):
        import torch

        moved = [a.to(self.device) if isinstance(a, torch.Tensor) else a for a in args]
        outs = self.module(*moved)
        if isinstance(outs, torch.Tensor):
            return outs.cpu()
        return tuple(o.cpu() if isinstance(o, torch.Tensor) else o for o in outs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def loaded_on_device(loaded, device: str):
    """``loaded`` with its flat module running on ``device`` (unchanged on the CPU)."""
    import dataclasses

    if device == "cpu" or isinstance(loaded.flat, OnDevice):
        return loaded
    return dataclasses.replace(loaded, flat=OnDevice(loaded.flat, device))
