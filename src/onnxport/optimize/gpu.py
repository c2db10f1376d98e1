"""The GPU variants that run a file built before with other provider options; each records the session options
it must be run with (:class:`~onnxport.runtime.SessionOptions`, report ``variants[].session_options`` and
``best.session_options``; how they are run: :mod:`onnxport.runtime.variant_sessions`).

* ``tf32``: the fp32 export with the CUDA provider's ``use_tf32=1`` (onnxport proves fp32 with it off);
  proven with the TF32 tolerance (core/records.py) and the task metric.
* ``tensorrt``: the fp32 export under TensorRT with ``trt_fp16_enable``, its engine and timing caches in
  OUT/tensorrt/ and one optimization profile whose min/opt/max shapes come from the declared dims (opt: the
  timed sizes); only where TensorRT is listed by onnxruntime *and* its libraries load.
* ``fp16-nhwc``: a convolutional model in fp16 (:func:`~onnxport.optimize.precision.half_for_cuda`: fp32 inputs
  and outputs, no Cast pair around an op the CUDA provider runs in fp16) under the CUDA provider's
  ``prefer_nhwc`` (Conv, pooling and normalization in NHWC, on the tensor cores' layout); proven as fp16.
* ``fp16-sdpa``: the ``fp16`` file of an encoder with fused attention under the CUDA provider's ``sdpa_kernel``
  (:data:`SDPA_KERNELS`: cuDNN's flash attention allowed, which onnxruntime leaves off unless asked for,
  then flash and memory-efficient attention, the unfused kernel last); the timing decides against ``fp16``.
* ``cuda-graph``: the fastest passing file (fp16-nhwc, fp16-sdpa, fp16, fused, export), run with its own
  options plus the CUDA provider's ``enable_cuda_graph``, run through IO binding with fixed input and output buffers; only when every compute
  node of that file runs on CUDA (ONNX Runtime inserts no CPU↔GPU copy; shape subgraphs may stay on the
  CPU). Run with one session per input shape (:class:`~onnxport.runtime.GraphSessions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx

from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.optimize.fusion import fused_attention
from onnxport.optimize.graph import save
from onnxport.optimize.precision import half_for_cuda
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

__all__ = ["ATTENTION_KERNELS", "GRAPH_BASES", "NEEDS_CUDA", "NHWC_OPS", "SDPA_KERNELS", "TRT_CACHE", "SessionBackend",
           "build_cuda_graph", "build_fp16_nhwc", "build_fp16_sdpa", "build_tensorrt", "build_tf32", "profile_shapes",
           "sdpa_bits", "tensorrt_missing"]

TRT_CACHE = "tensorrt"  # OUT/tensorrt/: TensorRT's engine and timing caches
NEEDS_CUDA = "needs --device cuda (the CUDA execution provider)"
# the CUDA provider's sdpa_kernel bits (onnxruntime's AttentionBackend, contrib_ops/cpu/bert/attention_common.h)
ATTENTION_KERNELS = {"flash": 1, "efficient": 2, "trt-fused": 4, "cudnn-flash": 8, "math": 16}
SDPA_KERNELS = ("cudnn-flash", "flash", "efficient", "math")  # what fp16-sdpa allows (trt-fused: up to sm89 only)
NHWC_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization")


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


def sdpa_bits(kernels: tuple[str, ...] = SDPA_KERNELS) -> int:
    """The ``sdpa_kernel`` value allowing ``kernels`` (names of :data:`ATTENTION_KERNELS`)."""
    return sum(ATTENTION_KERNELS[k] for k in dict.fromkeys(kernels))


def build_fp16_nhwc(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``fp16-nhwc``: ``src`` in fp16 for the CUDA provider (fp32 inputs and outputs, no needless Cast pair),
    run with ``prefer_nhwc``; skipped for a model without convolutions."""
    _need_cuda(ctx)
    model = onnx.load(str(src))
    layout_ops = sum(1 for n in model.graph.node if n.op_type in NHWC_OPS)
    if not any(n.op_type in ("Conv", "ConvTranspose") for n in model.graph.node):
        raise Skip("no convolution: NHWC is a layout for Conv, pooling and normalization")
    half, casts = half_for_cuda(model)
    save(half, dst)
    return BuildOutcome({"tool": "onnxruntime.transformers.float16 (the CUDA provider's fp16 ops)",
                         "keep_io_types": True, "casts": casts, "layout": "NHWC (prefer_nhwc)",
                         "nhwc_ops": layout_ops},
                        session_options=SessionOptions(CUDA, use_tf32=False, prefer_nhwc=True), policy="fp16")


def build_fp16_sdpa(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``fp16-sdpa``: the proven ``fp16`` file with fused attention, run with the CUDA provider's ``sdpa_kernel``
    allowing :data:`SDPA_KERNELS` (``dst`` is not written)."""
    _need_cuda(ctx)
    fp16 = ctx.passed.get("fp16")
    if fp16 is None:
        raise Skip("needs the fp16 variant, proven (its file is run with other attention kernels)")
    if not fused_attention(onnx.load(str(fp16), load_external_data=False)):
        raise Skip("the fp16 file has no fused attention op (onnxruntime's Attention / MultiHeadAttention)")
    return BuildOutcome({"file": "the fp16 variant", "attention_kernels": list(SDPA_KERNELS)}, path=fp16,
                        session_options=SessionOptions(CUDA, use_tf32=False, sdpa_kernel=sdpa_bits()), policy="fp16")


# the files a CUDA graph may capture, when they passed: each is run with its own options plus the graph
GRAPH_BASES = ("fp16-nhwc", "fp16-sdpa", "fp16", "fused", "export")


def build_cuda_graph(src: Path, dst: Path, ctx: BuildContext, passed: Mapping[str, Path],
                     fastest: Callable[[dict[str, Path]], str] | None = None,
                     copies: Callable[[Path, list], list[str] | None] | None = None,
                     placed: Callable[[Path, list], Placement] | None = None) -> BuildOutcome:
    """``cuda-graph``: the fastest passing file of :data:`GRAPH_BASES` (``fastest`` times them at the benchmark
    sizes, each under its own options, ``ctx.options``; without it the first that passed, else the export), run
    with its options and captured as one CUDA graph per input shape (``dst`` is not written). Refused where ONNX Runtime copies between CPU and GPU (``copies``: :func:`memcpy_nodes`),
    or, where that cannot be read, where a node is placed off CUDA (``placed``: a verbose session on CUDA)."""
    _need_cuda(ctx)
    bases = {n: passed[n] for n in GRAPH_BASES if n in passed} or {"export": src}
    base = fastest(bases) if fastest is not None and len(bases) > 1 else next(iter(bases))
    path = bases[base]
    own = ctx.options.get(base) or SessionOptions.base("cuda")
    chain = providers_for(own)
    copied = (copies or memcpy_nodes)(path, chain)
    if copied is None:
        why = graph_blocker((placed or (lambda p, c: _sessions.placement(p, "cuda", providers=c)))(path, chain))
    else:
        more = f" and {len(copied) - 3} more" if len(copied) > 3 else ""
        why = (f"a CUDA graph needs every compute node on CUDA; ONNX Runtime copies between CPU and GPU at "
               f"{', '.join(copied[:3])}{more}") if copied else None
    if why:
        raise Skip(f"{why} (in the {base} file)")
    options = dataclasses.replace(own, provider=CUDA, use_tf32=False, enable_cuda_graph=True, io_binding=True,
                                  graph_per_shape=True)
    return BuildOutcome({"file": base, "graph": "one capture per input shape (a session per shape)"}, path=path,
                        session_options=options, policy=base)
