"""ONNX Runtime session factory: providers, session options, custom-op libraries and IO binding in one place.

``--device cuda`` asks for the provider chain TensorRT → CUDA → CPU: ONNX Runtime gives each node to the first
provider in the list that can run it, so every node TensorRT cannot take goes to CUDA and every node neither
can take falls back to the CPU. :func:`placement` reports which providers a session really uses and which
nodes ended up on the CPU (from ONNX Runtime's verbose "Node placements" log written while the session is
created).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxport.core.errors import EnvironmentProblem, UsageError
from onnxport.core.logs import captured_fds
from onnxport.runtime import ops

OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "all": "ORT_ENABLE_ALL"}
DEVICES = ("cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_INSTALL_HINT = ("install onnxruntime-gpu (pip uninstall onnxruntime && pip install onnxruntime-gpu) and a CUDA "
                    "build of torch (https://pytorch.org/get-started/locally/) on a machine with an NVIDIA GPU and "
                    "driver, or use --device cpu")


# --------------------------------------------------------------------------- providers


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


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build offers."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def provider_chain(device: str = "cpu", *, gpu: GpuOptions | None = None,
                   available: Sequence[str] | None = None) -> list:
    """The providers to ask ONNX Runtime for on ``device``: CPU alone, or TensorRT → CUDA → CPU with their
    options, keeping only those this onnxruntime offers (``available``: a simulated list in tests).

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
    if gpu.tensorrt and TENSORRT in have:
        chain.append((TENSORRT, gpu.tensorrt_options()))
    chain.append((CUDA, gpu.cuda_options()))
    chain.append(CPU)
    return chain


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


@dataclass(frozen=True)
class RuntimeConfig:
    """The device every session onnxport opens runs on, unless a caller passes its own providers."""

    device: str = "cpu"
    gpu: GpuOptions = field(default_factory=GpuOptions)


_CONFIG = RuntimeConfig()


def configure(device: str = "cpu", gpu: GpuOptions | None = None) -> RuntimeConfig:
    """Set the process-wide device (checked first: exit 4 when it cannot be used here); ``gpu`` None keeps
    the GPU options set before."""
    global _CONFIG
    check_device(device)
    _CONFIG = RuntimeConfig(device, gpu or _CONFIG.gpu)
    return _CONFIG


def config() -> RuntimeConfig:
    return _CONFIG


def default_providers() -> list:
    """The provider chain of the configured device."""
    return provider_chain(_CONFIG.device, gpu=_CONFIG.gpu)


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


def session(path: str | Path, *, providers: list | None = None, threads: int | None = None,
            opt_level: str = "all", log_severity: int = 3, inter_op_threads: int | None = None,
            execution_mode: str | None = None, enable_mem_pattern: bool | None = None,
            enable_cpu_mem_arena: bool | None = None, log_sink: list[str] | None = None):
    """An InferenceSession on ``path`` (the configured device's providers and ORT_ENABLE_ALL unless told otherwise).

    ``inter_op_threads``, ``execution_mode`` ("sequential"/"parallel"), ``enable_mem_pattern`` and
    ``enable_cpu_mem_arena`` keep ONNX Runtime's defaults when None. Registered custom-op libraries and
    Python implementations (custom_ops) are loaded into every session. With ``log_sink`` the session is
    created with verbose logging and the log text is appended to it (see :func:`placement`).
    """
    import onnxruntime as ort

    verbose = log_sink is not None
    ort.set_default_logger_severity(0 if verbose else log_severity)  # kernel errors are reported by the caller
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    opts.log_severity_level = 0 if verbose else log_severity
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
    # Worker threads stop spinning when a run ends: a spinning pool left behind by one session (or by a
    # benchmark of another variant) otherwise takes the cores from the next one; a run's own parallel
    # sections still spin. Measured: three MiniLM sessions timed in turn ran 1.7-2.8x slower without it.
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    try:
        with ops.prepare_session(path, opts) as load_path, captured_fds(log_sink, (2,)):
            return ort.InferenceSession(load_path, opts, providers=providers or default_providers())
    except EnvironmentProblem:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        hint = ("run 'onnxport check' on the file; the model may use an operator or opset this onnxruntime lacks")
        if "is not a registered function/op" in msg:
            hint = ("the model uses a custom operator: pass its compiled library with --custom-op-library, or "
                    "register a Python implementation with onnxport.custom_ops.ort_python_op (docs/custom_ops.md)")
        raise UsageError(f"onnxruntime cannot load {Path(path).name}: {msg}", hint) from None
    finally:
        if verbose:
            ort.set_default_logger_severity(log_severity)


# --------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class Placement:
    """Which providers a session uses and where its nodes went."""

    device: str
    providers_requested: tuple[str, ...]
    providers_used: tuple[str, ...]  # session.get_providers(): the requested ones the session kept
    nodes_per_provider: dict[str, int] = field(default_factory=dict)
    cpu_fallback_nodes: tuple[str, ...] = ()  # "OpType (name)" of nodes on the CPU although a GPU was asked for

    def to_dict(self) -> dict:
        return {"device": self.device, "providers_requested": list(self.providers_requested),
                "providers_used": list(self.providers_used), "nodes_per_provider": dict(self.nodes_per_provider),
                "cpu_fallback_nodes": list(self.cpu_fallback_nodes)}


_ALL_ON = re.compile(r"All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)")
_SOME_ON = re.compile(r"Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_NODE = re.compile(r"\]\s{2,}(\S.*?)\s*$")


def parse_placement(log: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """ONNX Runtime's verbose "Node placements" lines -> ({provider: node count}, {provider: ["Op (name)"]}).

    ONNX Runtime writes ``All nodes placed on [EP]. Number of nodes: N`` when one provider takes everything,
    else one ``Node(s) placed on [EP]. Number of nodes: N`` line per provider followed by one line per node."""
    counts: dict[str, int] = {}
    nodes: dict[str, list[str]] = {}
    current: str | None = None
    for line in log.splitlines():
        if "VerifyEachNodeIsAssignedToAnEp" not in line and current is None:
            continue
        m = _ALL_ON.search(line)
        if m:
            counts[m.group(1)] = int(m.group(2))
            current = None
            continue
        m = _SOME_ON.search(line)
        if m:
            current = m.group(1)
            counts[current] = int(m.group(2))
            nodes[current] = []
            continue
        if current is not None and "VerifyEachNodeIsAssignedToAnEp" in line:
            n = _NODE.search(line)
            if n and "Node placements" not in line:
                nodes[current].append(n.group(1))
            continue
        current = None
    return counts, nodes


def placement(path: str | Path, device: str = "cpu", *, gpu: GpuOptions | None = None,
              available: Sequence[str] | None = None, providers: list | None = None) -> Placement:
    """Open a session on ``path`` with ``device``'s provider chain and report where the nodes went.

    ``providers`` overrides the chain (e.g. a simulated chain in tests)."""
    chain = providers if providers is not None else provider_chain(device, gpu=gpu, available=available)
    log: list[str] = []
    sess = session(path, providers=chain, log_sink=log)
    return placement_from(sess, device, chain, "".join(log))


def placement_from(sess, device: str, chain: Sequence, log: str) -> Placement:
    """:class:`Placement` from an open session and the verbose log of its creation."""
    counts, nodes = parse_placement(log)
    used = tuple(sess.get_providers())
    fallback: tuple[str, ...] = ()
    if device != "cpu":
        fallback = tuple(nodes.get(CPU, ()))
        if not fallback and counts.get(CPU) and len(counts) == 1:
            fallback = (f"all {counts[CPU]} nodes",)
    return Placement(device, tuple(provider_names(chain)), used, counts, fallback)


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
