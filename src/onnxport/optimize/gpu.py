"""The GPU variants that run a file built before with other provider options; each records the session options
it must be run with (:class:`~onnxport.runtime.SessionOptions`, report ``variants[].session_options`` and
``best.session_options``; how they are run: :mod:`onnxport.runtime.variant_sessions`).

* ``tf32``: the fp32 export with the CUDA provider's ``use_tf32=1`` (onnxport proves fp32 with it off);
  proven with the TF32 tolerance (core/records.py) and the task metric.
* ``tensorrt``: the fp32 export under TensorRT with ``trt_fp16_enable``, its engine and timing caches in
  OUT/tensorrt/ and one optimization profile whose min/opt/max shapes come from the declared dims (opt: the
  timed sizes); only where TensorRT is listed by onnxruntime *and* its libraries load.
* ``cuda-graph``: the fastest passing fp16/fp32 file (fp16, fused, export) with the CUDA provider's
  ``enable_cuda_graph``, run through IO binding with fixed input and output buffers; only when every compute
  node of that file runs on CUDA (ONNX Runtime inserts no CPU↔GPU copy; shape subgraphs may stay on the
  CPU). Run with one session per input shape (:class:`~onnxport.runtime.GraphSessions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.runtime import sessions as _sessions
from onnxport.runtime.libraries import tensorrt_loadable
from onnxport.runtime.sessions import CUDA, TENSORRT, Placement, available_providers
from onnxport.runtime.variant_sessions import (  # SessionBackend: read as optimize.gpu.* by pipeline.py
    TRT_WORKSPACE,
    SessionBackend,
    SessionOptions,
    graph_blocker,
    memcpy_nodes,
    providers_for,
)
from onnxport.sources.base import LoadedModel

__all__ = ["GRAPH_BASES", "NEEDS_CUDA", "TRT_CACHE", "SessionBackend", "build_cuda_graph",
           "build_tensorrt", "build_tf32", "profile_shapes", "tensorrt_missing"]

TRT_CACHE = "tensorrt"  # OUT/tensorrt/: TensorRT's engine and timing caches
NEEDS_CUDA = "needs --device cuda (the CUDA execution provider)"


# --------------------------------------------------------------------------- gates


def tensorrt_missing(available: Sequence[str] | None = None, loadable: bool | None = None) -> str | None:
    """Why TensorRT cannot be used here (None: it can). ``available``/``loadable`` simulate the machine."""
    have = available_providers() if available is None else list(available)
    if TENSORRT not in have:
        return "this onnxruntime does not offer the TensorrtExecutionProvider"
    if not (tensorrt_loadable() if loadable is None else loadable):
        return "onnxruntime lists TensorRT but its libraries (libnvinfer) do not load"
    return None


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


# --------------------------------------------------------------------------- builders


def _need_cuda(ctx: BuildContext) -> None:
    if ctx.device != "cuda":
        raise Skip(NEEDS_CUDA)


def build_tf32(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``tf32``: the fp32 export with the CUDA provider's TF32 (``dst`` is not written)."""
    _need_cuda(ctx)
    return BuildOutcome({"file": "the fp32 export", "use_tf32": True}, path=src,
                        session_options=SessionOptions(CUDA, use_tf32=True))


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
    options = SessionOptions(TENSORRT, trt_fp16_enable=True, trt_max_workspace_size=TRT_WORKSPACE,
                             trt_engine_cache_enable=True, trt_engine_cache_path=TRT_CACHE,
                             trt_timing_cache_enable=True, trt_timing_cache_path=TRT_CACHE, use_tf32=False,
                             **profile_shapes(ctx.loaded, ctx.timed_at))
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
    chain = providers_for(SessionOptions.base("cuda"))
    copied = (copies or memcpy_nodes)(path, chain)
    if copied is None:
        why = graph_blocker((placed or (lambda p, c: _sessions.placement(p, "cuda", providers=c)))(path, chain))
    else:
        more = f" and {len(copied) - 3} more" if len(copied) > 3 else ""
        why = (f"a CUDA graph needs every compute node on CUDA; ONNX Runtime copies between CPU and GPU at "
               f"{', '.join(copied[:3])}{more}") if copied else None
    if why:
        raise Skip(f"{why} (in the {base} file)")
    options = SessionOptions(CUDA, use_tf32=False, enable_cuda_graph=True, io_binding=True, graph_per_shape=True)
    return BuildOutcome({"file": base, "graph": "one capture per input shape (a session per shape)"}, path=path,
                        session_options=options, policy=base)
