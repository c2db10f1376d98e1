"""The GPU variants that run a file built before with other provider options, and the session options every
variant records (report ``variants[].session_options`` and ``best.session_options``).

* ``tf32``: the fp32 export with the CUDA provider's ``use_tf32=1`` (onnxport proves fp32 with it off);
  proven with the TF32 tolerance (core/records.py) and the task metric.
* ``tensorrt``: the fp32 export under TensorRT with ``trt_fp16_enable``, its engine and timing caches in
  OUT/tensorrt/ and one optimization profile whose min/opt/max shapes come from the declared dims (opt: the
  timed sizes); only where TensorRT is listed by onnxruntime *and* its libraries load.
* ``cuda-graph``: the fastest passing fp16/fp32 file (fp16, fused, export) with the CUDA provider's
  ``enable_cuda_graph``, run through IO binding with fixed input and output buffers; only when every compute
  node of that file runs on CUDA (ONNX Runtime inserts no CPU↔GPU copy; shape subgraphs may stay on the
  CPU). ONNX Runtime captures one graph per session at the first shapes it runs (the run after a regular
  one) and replays it; a different shape needs another session: :class:`GraphSessions` keeps one session
  per input shape. A server must do the same, or drop the option for dynamic shapes
  (:func:`without_cuda_graph`).

Serving the recorded options: :func:`providers_for` turns them into the provider list of an
``InferenceSession`` (:func:`gpu_options_for` into :class:`~onnxport.runtime.GpuOptions`), :func:`open_for`
opens the right session (a :class:`GraphSessions` for a CUDA graph).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.runtime import sessions as _sessions
from onnxport.runtime.libraries import tensorrt_loadable
from onnxport.runtime.sessions import CPU, CUDA, TENSORRT, GpuOptions, Placement, available_providers, session
from onnxport.sources.base import LoadedModel

TRT_CACHE = "tensorrt"  # OUT/tensorrt/: TensorRT's engine and timing caches
TRT_WORKSPACE = 2 * 1024**3
MAX_GRAPH_SHAPES = 16  # CUDA-graph sessions kept per file (one per input shape)
NEEDS_CUDA = "needs --device cuda (the CUDA execution provider)"


# --------------------------------------------------------------------------- recorded options


def base_options(device: str) -> dict:
    """The options of a variant run with the device's defaults: the CPU provider, or CUDA with TF32 off."""
    return {"provider": CUDA, "use_tf32": False} if device == "cuda" else {"provider": CPU}


def needs_fixed_shapes(options: Mapping | None) -> bool:
    """Whether the options capture a CUDA graph: one session per input shape (:class:`GraphSessions`)."""
    return bool(options and options.get("enable_cuda_graph"))


def without_cuda_graph(options: Mapping) -> dict:
    """The options with the CUDA graph dropped (for a server whose shapes change from request to request)."""
    return {k: v for k, v in options.items() if k not in ("enable_cuda_graph", "io_binding", "graph_per_shape")}


def _flag(value: Any) -> bool:
    return str(value).lower() in ("1", "true")


def gpu_options_for(options: Mapping, out_dir: str | Path | None = None, device_id: int = 0) -> GpuOptions:
    """:class:`GpuOptions` for recorded options (TF32, TensorRT fp16 and caches; the CUDA graph and the
    TensorRT profile shapes are only in :func:`providers_for`)."""
    trt = options.get("provider") == TENSORRT
    cache = options.get("trt_engine_cache_path")
    if cache and out_dir is not None and not Path(cache).is_absolute():
        cache = str(Path(out_dir) / cache)
    return GpuOptions(device_id=device_id, fp16=trt and _flag(options.get("trt_fp16_enable")),
                      trt_workspace_bytes=int(options.get("trt_max_workspace_size", TRT_WORKSPACE)),
                      trt_engine_cache=cache if trt else None, tensorrt=trt, tf32=_flag(options.get("use_tf32")))


def providers_for(options: Mapping | None, out_dir: str | Path | None = None, device_id: int = 0) -> list:
    """The ``providers=`` list of an InferenceSession that runs a variant as it was proven: CPU alone, CUDA
    (TF32, CUDA graph) → CPU, or TensorRT (fp16, caches, profile shapes) → CUDA → CPU. ``out_dir``: OUT,
    against which the relative TensorRT cache folder is resolved."""
    options = options or {}
    if options.get("provider", CPU) == CPU:
        return [CPU]
    gpu = gpu_options_for(options, out_dir, device_id)
    cuda = gpu.cuda_options()
    if needs_fixed_shapes(options) and options.get("provider") == CUDA:
        cuda["enable_cuda_graph"] = "1"
    chain: list = []
    if options.get("provider") == TENSORRT:
        trt = gpu.tensorrt_options()
        trt.update({k: options[k] for k in ("trt_profile_min_shapes", "trt_profile_opt_shapes",
                                            "trt_profile_max_shapes") if options.get(k)})
        chain.append((TENSORRT, trt))
    return chain + [(CUDA, cuda), CPU]


# --------------------------------------------------------------------------- gates


def tensorrt_missing(available: Sequence[str] | None = None, loadable: bool | None = None) -> str | None:
    """Why TensorRT cannot be used here (None: it can). ``available``/``loadable`` simulate the machine."""
    have = available_providers() if available is None else list(available)
    if TENSORRT not in have:
        return "this onnxruntime does not offer the TensorrtExecutionProvider"
    if not (tensorrt_loadable() if loadable is None else loadable):
        return "onnxruntime lists TensorRT but its libraries (libnvinfer) do not load"
    return None


def memcpy_nodes(path: Path, providers: list) -> list[str] | None:
    """The copies between CPU and GPU ONNX Runtime inserts in ``path`` under ``providers`` ("Op (name)" of its
    MemcpyToHost/MemcpyFromHost nodes, read from the optimized graph it writes); None when that cannot be read.

    ONNX Runtime captures a CUDA graph when every node is on CUDA or the CPU with no such copy: the shape
    subgraphs it keeps on the CPU on purpose need none."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="onnxport-graph-") as tmp:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        try:
            ort.InferenceSession(str(path), opts, providers=providers)
            model = onnx.load(opts.optimized_model_filepath, load_external_data=False)
        except Exception:  # noqa: BLE001 - custom ops, >2 GB graphs: the placement decides instead
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


def profile_shapes(loaded: LoadedModel, timed_at: Mapping[str, int] | None = None) -> dict[str, str]:
    """TensorRT's optimization profile (trt_profile_min/opt/max_shapes) from the declared dims: each dynamic
    dim from its min to its max, optimized for the timed sizes (default: the export sizes)."""
    out: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for spec in loaded.inputs:
        for which in out:
            dims = []
            for d in spec.shape:
                dim = loaded.dims.get(d) if isinstance(d, str) else None
                if dim is None:
                    dims.append(str(d if isinstance(d, int) else 1))
                    continue
                opt = (timed_at or {}).get(dim.symbol, dim.example or dim.min)
                dims.append(str({"min": dim.min, "max": dim.max, "opt": min(max(opt, dim.min), dim.max)}[which]))
            out[which].append(f"{spec.name}:{'x'.join(dims)}")
    return {f"trt_profile_{k}_shapes": ",".join(v) for k, v in out.items()}


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

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None) -> list:
        """The outputs of ``feeds`` (``run_options`` is not used: a captured graph takes none)."""
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
        outs = runner.run(arrays)
        return outs if not output_names else [outs[runner.names.index(n)] for n in output_names]


def _no_graph(providers: list) -> list:
    """``providers`` with the CUDA graph option dropped."""
    return [(p[0], {k: v for k, v in p[1].items() if k != "enable_cuda_graph"}) if isinstance(p, tuple) else p
            for p in providers]


def open_for(options: Mapping | None, out_dir: str | Path | None = None, device_id: int = 0,
             threads: int | None = None) -> Callable[[Path], Any]:
    """How to open a session on a variant's file as it was proven: the providers of :func:`providers_for`, a
    :class:`GraphSessions` under a CUDA graph; TensorRT that does not load is an error, not a CUDA fallback."""
    chain = providers_for(options, out_dir, device_id)

    def opener(path: Path):
        if needs_fixed_shapes(options):
            device = "cuda" if (options or {}).get("provider") in (CUDA, TENSORRT) else "cpu"
            return GraphSessions(path, chain, device=device, device_id=device_id,
                                 opener=functools.partial(session, path, providers=chain, threads=threads),
                                 plain=functools.partial(session, path, providers=_no_graph(chain), threads=threads))
        sess = session(path, providers=chain, threads=threads)
        if (options or {}).get("provider") == TENSORRT and TENSORRT not in sess.get_providers():
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


# --------------------------------------------------------------------------- builders


def _need_cuda(ctx: BuildContext) -> None:
    if ctx.device != "cuda":
        raise Skip(NEEDS_CUDA)


def build_tf32(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``tf32``: the fp32 export with the CUDA provider's TF32 (``dst`` is not written)."""
    _need_cuda(ctx)
    return BuildOutcome({"file": "the fp32 export", "use_tf32": True}, path=src,
                        session_options={"provider": CUDA, "use_tf32": True})


def build_tensorrt(src: Path, dst: Path, ctx: BuildContext, available: Sequence[str] | None = None,
                   loadable: bool | None = None) -> BuildOutcome:
    """``tensorrt``: the fp32 export under TensorRT with fp16 layers, caches in OUT/tensorrt/ and a profile
    from the declared dims (``dst`` is not written)."""
    _need_cuda(ctx)
    why = tensorrt_missing(available, loadable)
    if why:
        raise Skip(why)
    cache = Path(ctx.out or dst.parent.parent) / TRT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    options = {"provider": TENSORRT, "trt_fp16_enable": True, "trt_max_workspace_size": TRT_WORKSPACE,
               "trt_engine_cache_enable": True, "trt_engine_cache_path": TRT_CACHE,
               "trt_timing_cache_enable": True, "trt_timing_cache_path": TRT_CACHE, "use_tf32": False,
               **profile_shapes(ctx.loaded, ctx.timed_at)}
    return BuildOutcome({"file": "the fp32 export", "engine_cache": f"{TRT_CACHE}/"}, path=src,
                        session_options=options, policy="tensorrt")


GRAPH_BASES = ("fp16", "fused", "export")  # the files a CUDA graph may capture, when they passed


def build_cuda_graph(src: Path, dst: Path, ctx: BuildContext, passed: Mapping[str, Path],
                     fastest: Callable[[dict[str, Path]], str] | None = None,
                     copies: Callable[[Path, list], list[str] | None] | None = None,
                     placed: Callable[[Path, list], Placement] | None = None) -> BuildOutcome:
    """``cuda-graph``: the fastest passing fp16/fp32 file (``fastest`` times them at the benchmark sizes;
    without it fp16 when it passed, else the export), captured as one CUDA graph per input shape (``dst`` is
    not written). Refused where ONNX Runtime copies between CPU and GPU (``copies``: :func:`memcpy_nodes`),
    or, where that cannot be read, where a node is placed off CUDA (``placed``: a verbose session on CUDA)."""
    _need_cuda(ctx)
    bases = {n: passed[n] for n in GRAPH_BASES if n in passed} or {"export": src}
    base = fastest(bases) if fastest is not None and len(bases) > 1 else next(iter(bases))
    path = bases[base]
    chain = providers_for({"provider": CUDA, "use_tf32": False})
    copied = (copies or memcpy_nodes)(path, chain)
    if copied is None:
        why = graph_blocker((placed or (lambda p, c: _sessions.placement(p, "cuda", providers=c)))(path, chain))
    else:
        more = f" and {len(copied) - 3} more" if len(copied) > 3 else ""
        why = (f"a CUDA graph needs every compute node on CUDA; ONNX Runtime copies between CPU and GPU at "
               f"{', '.join(copied[:3])}{more}") if copied else None
    if why:
        raise Skip(f"{why} (in the {base} file)")
    options = {"provider": CUDA, "use_tf32": False, "enable_cuda_graph": True, "io_binding": True,
               "graph_per_shape": True}
    return BuildOutcome({"file": base, "graph": "one capture per input shape (a session per shape)"}, path=path,
                        session_options=options, policy=base)
