"""How a variant's file must be run, for the proof, the benchmark, the server and Triton: the session options
each variant records (report ``variants[].session_options`` and ``best.session_options``) as a
:class:`SessionOptions`, and the sessions they open.

:func:`providers_for` turns the options into the provider list of an ``InferenceSession``
(:func:`gpu_options_for` into :class:`~onnxport.runtime.GpuOptions`), :func:`open_for` opens the right session
(a :class:`GraphSessions` for a CUDA graph) and :class:`SessionBackend` times it. Every function takes the
record or its dict (a mapping read from report.json).

A CUDA graph: ONNX Runtime captures one graph per session at the first shapes it runs (the run after a regular
one) and replays it; a different shape needs another session: :class:`GraphSessions` keeps one session per
input shape. A server must do the same, or drop the option for dynamic shapes (:func:`without_cuda_graph`).
ONNX Runtime captures only where it copies nothing between CPU and GPU (:func:`memcpy_nodes`,
:func:`graph_blocker`).
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.runtime.openvino import OPENVINO, OpenVinoSession
from onnxport.runtime.placement import Placement
from onnxport.runtime.sessions import CPU, CUDA, TENSORRT, GpuOptions, session, write_optimized

TRT_WORKSPACE = 2 * 1024**3
MAX_GRAPH_SHAPES = 16  # CUDA-graph sessions kept per file (one per input shape)
_GRAPH_KEYS = ("enable_cuda_graph", "io_binding", "graph_per_shape")
_PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")
_FLAGS = ("trt_fp16_enable", "trt_engine_cache_enable", "trt_timing_cache_enable", "use_tf32", "prefer_nhwc",
          *_GRAPH_KEYS)


# --------------------------------------------------------------------------- recorded options


def _flag(value: Any) -> bool:
    return str(value).lower() in ("1", "true")


@dataclass(frozen=True)
class SessionOptions:
    """How a variant's file must be run: the provider and its options under ONNX Runtime's names. A field left
    None was not recorded: :meth:`to_dict` leaves its key out (the dict report.json carries, in this order)."""

    provider: str = CPU
    trt_fp16_enable: bool | None = None  # TensorRT may run layers in fp16
    trt_max_workspace_size: int | None = None
    trt_engine_cache_enable: bool | None = None
    trt_engine_cache_path: str | None = None  # relative: against OUT
    trt_timing_cache_enable: bool | None = None
    trt_timing_cache_path: str | None = None
    use_tf32: bool | None = None  # the CUDA provider's TF32
    enable_cuda_graph: bool | None = None  # one CUDA graph per input shape (GraphSessions)
    io_binding: bool | None = None
    graph_per_shape: bool | None = None
    trt_profile_min_shapes: str | None = None  # TensorRT's optimization profile ("x:1x8,...")
    trt_profile_opt_shapes: str | None = None
    trt_profile_max_shapes: str | None = None
    inference_precision: str | None = None  # provider "openvino": the precision it compiles at ("f32", "bf16")
    performance_hint: str | None = None  # provider "openvino": its PERFORMANCE_HINT ("LATENCY")
    prefer_nhwc: bool | None = None  # the CUDA provider runs Conv, pooling and normalization in NHWC
    sdpa_kernel: int | None = None  # the CUDA provider's attention kernels allowed (AttentionBackend bits)
    extra: tuple[tuple[str, Any], ...] = ()  # keys this version does not know, kept as they were read

    @classmethod
    def base(cls, device: str) -> SessionOptions:
        """A variant run with the device's defaults: the CPU provider, or CUDA with TF32 off."""
        return cls(CUDA, use_tf32=False) if device == "cuda" else cls(CPU)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and getattr(self, f.name) is not None}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping | SessionOptions | None) -> SessionOptions:
        """The record of a recorded dict (None, {}: the CPU provider); flags written "1"/"true" read as True."""
        if isinstance(data, SessionOptions):
            return data
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kw = {k: _flag(v) if k in _FLAGS and v is not None else v for k, v in data.items() if k in known}
        return cls(**kw, extra=tuple((k, v) for k, v in data.items() if k not in known))


def _record(options: Mapping | SessionOptions | None) -> SessionOptions:
    return SessionOptions.from_dict(options)


def is_openvino(options: Mapping | SessionOptions | None) -> bool:
    """Whether the options run the file on OpenVINO rather than ONNX Runtime (:mod:`onnxport.runtime.openvino`)."""
    return bool(options) and _record(options).provider == OPENVINO


def needs_fixed_shapes(options: Mapping | SessionOptions | None) -> bool:
    """Whether the options capture a CUDA graph: one session per input shape (:class:`GraphSessions`)."""
    return bool(options) and bool(_record(options).enable_cuda_graph)


def without_cuda_graph(options: Mapping | SessionOptions) -> Any:
    """The options with the CUDA graph dropped (for a server whose shapes change from request to request): a
    record for a record, a dict for a mapping."""
    if isinstance(options, SessionOptions):
        return dataclasses.replace(options, **dict.fromkeys(_GRAPH_KEYS))
    return {k: v for k, v in options.items() if k not in _GRAPH_KEYS}


def gpu_options_for(options: Mapping | SessionOptions, out_dir: str | Path | None = None,
                    device_id: int = 0) -> GpuOptions:
    """:class:`GpuOptions` for recorded options (TF32, TensorRT fp16 and caches; the CUDA graph and the
    TensorRT profile shapes are only in :func:`providers_for`)."""
    rec = _record(options)
    trt = rec.provider == TENSORRT
    cache = rec.trt_engine_cache_path
    if cache and out_dir is not None and not Path(cache).is_absolute():
        cache = str(Path(out_dir) / cache)
    workspace = TRT_WORKSPACE if rec.trt_max_workspace_size is None else rec.trt_max_workspace_size
    return GpuOptions(device_id=device_id, fp16=trt and bool(rec.trt_fp16_enable),
                      trt_workspace_bytes=int(workspace), trt_engine_cache=cache if trt else None, tensorrt=trt,
                      tf32=bool(rec.use_tf32))


def providers_for(options: Mapping | SessionOptions | None, out_dir: str | Path | None = None,
                  device_id: int = 0) -> list:
    """The ``providers=`` list of an InferenceSession that runs a variant as it was proven: CPU alone, CUDA
    (TF32, CUDA graph) → CPU, or TensorRT (fp16, caches, profile shapes) → CUDA → CPU. ``out_dir``: OUT,
    against which the relative TensorRT cache folder is resolved."""
    rec = _record(options)
    if rec.provider == CPU:
        return [CPU]
    gpu = gpu_options_for(rec, out_dir, device_id)
    cuda = gpu.cuda_options()
    if rec.enable_cuda_graph and rec.provider == CUDA:
        cuda["enable_cuda_graph"] = "1"
    if rec.prefer_nhwc:
        cuda["prefer_nhwc"] = "1"
    if rec.sdpa_kernel is not None:
        cuda["sdpa_kernel"] = str(int(rec.sdpa_kernel))
    chain: list = []
    if rec.provider == TENSORRT:
        trt = gpu.tensorrt_options()
        trt.update({k: getattr(rec, k) for k in _PROFILE_KEYS if getattr(rec, k)})
        chain.append((TENSORRT, trt))
    return chain + [(CUDA, cuda), CPU]


# --------------------------------------------------------------------------- can a CUDA graph capture a file


def memcpy_nodes(path: Path, providers: list) -> list[str] | None:
    """The copies between CPU and GPU ONNX Runtime inserts in ``path`` under ``providers`` ("Op (name)" of its
    MemcpyToHost/MemcpyFromHost nodes, read from the optimized graph it writes); None when that cannot be read.

    ONNX Runtime captures a CUDA graph when every node is on CUDA or the CPU with no such copy: the shape
    subgraphs it keeps on the CPU on purpose need none."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="onnxport-graph-") as tmp:
        try:  # the graph alone is read: its weights stay inline (over 2 GB, writing fails)
            optimized = write_optimized(path, Path(tmp) / "optimized.onnx", opt_level="all", providers=providers,
                                        external=False)
            model = onnx.load(str(optimized), load_external_data=False)
        except Exception:  # noqa: BLE001 - >2 GB graphs, an op onnxruntime lacks: the placement decides instead
            return None
    return [f"{n.op_type} ({n.name})" for n in model.graph.node if n.op_type in ("MemcpyToHost", "MemcpyFromHost")]


def graph_blocker(where: Placement) -> str | None:
    """Why a CUDA graph cannot capture a file placed like ``where`` (None: every node runs on CUDA); the
    stricter rule, used where :func:`memcpy_nodes` cannot tell."""
    on_cpu = list(where.cpu_fallback_nodes)
    if not on_cpu and (set(where.nodes_per_provider) - {CUDA} or CUDA not in where.providers_used):
        on_cpu = [f"{n} node(s) on {p}" for p, n in where.nodes_per_provider.items() if p != CUDA]
    if not on_cpu:
        return None
    more = f" and {len(on_cpu) - 3} more" if len(on_cpu) > 3 else ""
    return f"a CUDA graph needs every node on CUDA; on the CPU: {', '.join(on_cpu[:3])}{more}"


# --------------------------------------------------------------------------- CUDA graph sessions


class _Captured:
    """One session run through IO binding with fixed input and output buffers, bound before its first run:
    the addresses a CUDA graph captures (whether ONNX Runtime captures at the first run or after a regular one,
    the graph writes where the outputs are read)."""

    def __init__(self, sess, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], device: str,
                 device_id: int) -> None:
        import onnxruntime as ort

        self.session = sess
        self.binding = sess.io_binding()
        self.inputs = {m.name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(feeds[m.name]), device,
                                                                device_id) for m in sess.get_inputs()}
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        self.names = [o.name for o in sess.get_outputs()]
        self.outputs = [ort.OrtValue.ortvalue_from_shape_and_type(list(o.shape), o.dtype, device, device_id)
                        for o in outputs]
        for name, value in zip(self.names, self.outputs):
            self.binding.bind_ortvalue_output(name, value)
        self._fed: tuple = tuple(feeds[n] for n in self.inputs)  # held, so "is" below cannot see a recycled id

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Copy new inputs into the bound buffers (the same arrays are not copied again), run, read outputs."""
        fed = tuple(feeds[n] for n in self.inputs)
        if any(a is not b for a, b in zip(fed, self._fed)):
            for name, value in self.inputs.items():
                value.update_inplace(np.ascontiguousarray(feeds[name]))
            self._fed = fed
        self.session.run_with_iobinding(self.binding)  # regular or capturing at first, replays after
        return [v.numpy() for v in self.outputs]


class GraphSessions:
    """A file under CUDA-graph options, used like an InferenceSession (``run``, ``get_inputs``,
    ``get_outputs``): one session per input shape, each captured once and replayed. The output shapes of a new
    input shape come from one run of a plain session (``plain``: the same providers without the graph)."""

    def __init__(self, path: str | Path, providers: list, *, device: str = "cuda", device_id: int = 0,
                 max_shapes: int = MAX_GRAPH_SHAPES, opener: Callable[[], Any] | None = None,
                 plain: Callable[[], Any] | None = None) -> None:
        self._open = opener or functools.partial(session, path, providers=providers)
        self._plain_open = plain or functools.partial(session, path, providers=_no_graph(providers))
        self._meta = self._open()
        self._plain: Any = None
        self.device, self.device_id, self.max_shapes = device, device_id, max_shapes
        self.by_shape: dict[tuple, _Captured] = {}

    def get_inputs(self):
        return self._meta.get_inputs()

    def get_outputs(self):
        return self._meta.get_outputs()

    def get_providers(self):
        return self._meta.get_providers()

    def captured(self, feeds: Mapping[str, Any]) -> _Captured:
        """The session of the input shape of ``feeds`` with its bound buffers (opened and bound at a new shape;
        its graph is captured at its first runs). A timing replays ``runner.session.run_with_iobinding(
        runner.binding)`` alone (onnxport.bench.resident)."""
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        key = tuple(sorted((k, a.shape, a.dtype.str) for k, a in arrays.items()))
        runner = self.by_shape.get(key)
        if runner is None:
            if len(self.by_shape) >= self.max_shapes:
                raise UsageError(f"a CUDA graph is captured per input shape and {self.max_shapes} are open",
                                 "serve fixed shapes, or drop enable_cuda_graph for dynamic shapes")
            self._plain = self._plain or self._plain_open()
            shapes = self._plain.run(None, {i.name: arrays[i.name] for i in self._plain.get_inputs()})
            sess = self._meta if not self.by_shape else self._open()
            runner = _Captured(sess, arrays, shapes, self.device, self.device_id)
            self.by_shape[key] = runner
        return runner

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None) -> list:
        """The outputs of ``feeds`` (``run_options`` is not used: a captured graph takes none)."""
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        runner = self.captured(arrays)
        outs = runner.run(arrays)
        return outs if not output_names else [outs[runner.names.index(n)] for n in output_names]


def _no_graph(providers: list) -> list:
    """``providers`` with the CUDA graph option dropped."""
    return [(p[0], {k: v for k, v in p[1].items() if k != "enable_cuda_graph"}) if isinstance(p, tuple) else p
            for p in providers]


def open_for(options: Mapping | SessionOptions | None, out_dir: str | Path | None = None, device_id: int = 0,
             threads: int | None = None) -> Callable[[Path], Any]:
    """How to open a session on a variant's file as it was proven: the providers of :func:`providers_for`, a
    :class:`GraphSessions` under a CUDA graph, an :class:`~onnxport.runtime.openvino.OpenVinoSession` at its
    inference precision on OpenVINO; TensorRT that does not load is an error, not a CUDA fallback."""
    rec = _record(options)
    chain = providers_for(rec, out_dir, device_id)

    def opener(path: Path):
        if rec.provider == OPENVINO:
            return OpenVinoSession(path, rec.inference_precision or "f32", threads, rec.performance_hint or "LATENCY")
        if rec.enable_cuda_graph:
            device = "cuda" if rec.provider in (CUDA, TENSORRT) else "cpu"
            return GraphSessions(path, chain, device=device, device_id=device_id,
                                 opener=functools.partial(session, path, providers=chain, threads=threads),
                                 plain=functools.partial(session, path, providers=_no_graph(chain), threads=threads))
        sess = session(path, providers=chain, threads=threads)
        if rec.provider == TENSORRT and TENSORRT not in sess.get_providers():
            raise UsageError("TensorRT did not load: onnxruntime fell back to CUDA",
                             "install TensorRT's libraries (libnvinfer) for this onnxruntime")
        return sess

    return opener


class SessionBackend:
    """A timing backend (``open``/``run``/``close``/``inputs``, like runtime.backends.OrtBackend) on a session
    opened by :func:`open_for`; bench.run takes it in ``extra_backends``."""

    def __init__(self, path: Path, opener: Callable[[Path], Any], name: str) -> None:
        self.path, self.opener, self.name = path, opener, name
        self.session: Any = None

    @property
    def inputs(self) -> list:
        return list((self.session or self.opener(self.path)).get_inputs())

    def open(self) -> None:
        self.session = self.opener(self.path)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Feeds by the graph's input names, or in order when they are keyed otherwise (spec names)."""
        names = [i.name for i in self.session.get_inputs()]
        by_name = all(n in feeds for n in names)
        return self.session.run(None, {n: feeds[n] for n in names} if by_name else dict(zip(names, feeds.values())))

    def close(self) -> None:
        self.session = None
