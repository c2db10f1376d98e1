"""The decoder variants for a GPU: ``gqa`` (onnxruntime's GroupQueryAttention with rotary fused and a past/present
buffer shared at the maximum length: :mod:`onnxport.decoder.attention`), ``fp16`` (float16 inside, float32 inputs
and outputs, on top of ``gqa`` where it applies) and ``cuda-graph`` (the ``fp16`` file run with the CUDA
provider's CUDA graph: one-token steps on fixed shapes and addresses, replayed). Registered in the decoder kind
beside :mod:`onnxport.decoder.variants`' builders; each is re-proven by the kind's judge."""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxport.core.onnxfile import file_bytes, inline_limit, save_model
from onnxport.decoder.attention import to_group_query
from onnxport.decoder.generation import SHARED_BUFFER
from onnxport.decoder.kind import DECODER
from onnxport.optimize.context import BuildOutcome, Skip
from onnxport.optimize.registry import register
from onnxport.runtime.sessions import CUDA
from onnxport.runtime.variant_sessions import SessionOptions

GPU_ONLY = ("cuda-graph",)  # built on a CUDA target only
GPU_DEFAULT = ("fp16", "gqa", "cuda-graph")  # added to "all" / "auto" on a CUDA target
# fp16 keeps these in float32 (onnxruntime.transformers' defaults for decoders: normalisations and softmax-like ops)
FP16_KEEP = ("RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
             "LayerNormalization", "Softmax")
GRAPH_OPTIONS = SessionOptions(CUDA, use_tf32=False, enable_cuda_graph=True, io_binding=True)


def _save(model: onnx.ModelProto, dst: Path, src: Path) -> None:
    save_model(model, dst, file_bytes(src) > inline_limit())


def group_query(src: Path, ctx) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The proven file with GroupQueryAttention, marked as sharing its past/present buffer (Skip: not applied)."""
    model = onnx.load(str(src))
    notes = tuple(to_group_query(model, ctx.layout, ctx.rotary))
    key, value = SHARED_BUFFER
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, key: value})
    return model, notes


def build_gqa(src: Path, dst: Path, ctx) -> BuildOutcome:
    model, notes = group_query(src, ctx)
    _save(model, dst, src)
    return BuildOutcome(notes=notes)


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in float16, its cache inputs and outputs too (the cache stays float16 on the device between
    steps), its logits kept float32 (a Cast at the end)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=["logits"], op_block_list=list(FP16_KEEP),
                                    disable_shape_infer=True)


def fp16_model(src: Path, ctx) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """GroupQueryAttention where it applies (else the proven graph, noting why), then float16."""
    try:
        model, notes = group_query(src, ctx)
    except Skip as e:
        model, notes = onnx.load(str(src)), (f"without GroupQueryAttention: {e}",)
    return to_fp16(model), (*notes, "float16 with a float16 cache (float32 logits; "
                                    f"{', '.join(FP16_KEEP)} kept in float32)")


def build_fp16(src: Path, dst: Path, ctx) -> BuildOutcome:
    model, notes = fp16_model(src, ctx)
    _save(model, dst, src)
    return BuildOutcome(notes=notes)


def build_cuda_graph(src: Path, dst: Path, ctx) -> BuildOutcome:
    """The ``fp16`` file run with a CUDA graph (recorded session options); only with GroupQueryAttention (fixed
    shapes need the shared buffer) and on a CUDA target."""
    if not ctx.target.gpu:
        raise Skip("a CUDA graph runs on the CUDA provider only (--device cuda)")
    model, notes = fp16_model(src, ctx)
    if not any(n.op_type == "GroupQueryAttention" for n in model.graph.node):
        raise Skip("a CUDA graph needs fixed shapes: the cache in one buffer at the maximum length "
                   "(GroupQueryAttention), which does not apply here", notes)
    _save(model, dst, src)
    return BuildOutcome(session_options=GRAPH_OPTIONS, notes=(
        *notes, "CUDA graph: one-token steps on fixed shapes and addresses (IO binding), captured once and "
        "replayed (gpu_graph_id 1; the prompt runs without a graph)"))


register(DECODER, "gqa", build_gqa)
register(DECODER, "fp16", build_fp16)
register(DECODER, "cuda-graph", build_cuda_graph)
