"""The ``fp16`` variant: weights and activations in half precision, inputs and outputs kept in fp32.

On ``--device cuda`` a Hugging Face transformer first goes through onnxruntime's transformer optimizer for the
GPU (``use_gpu=True``): attention fused into the com.microsoft ``Attention`` op with packed QKV, whose CUDA
kernel runs flash / memory-efficient attention in fp16 (onnxruntime's ``MultiHeadAttention`` is the op for
unpacked or cross attention, and its own help says it may be slower than ``Attention`` when QKV are not
packed), SkipLayerNormalization, BiasGelu; then the float16 conversion with the usual op block list
(ops without fp16 kernels stay fp32). Elsewhere (a CPU, a model without Hugging Face attention) it is the
float16 conversion of the file as exported.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from onnxport.core.onnxfile import inline_limit
from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.optimize.fusion import build_fused, fused_attention, ort_optimizer
from onnxport.optimize.graph import init_bytes, save, short_error


def _half(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=True,
                                    disable_shape_infer=init_bytes(model) > inline_limit())


# ops of onnxruntime's default fp16 block list that the CUDA provider runs in fp16: kept fp32 they cost a Cast pair
CUDA_FP16_OPS = ("TopK", "Min", "Max", "Upsample", "CumSum")


def half_for_cuda(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(the float16 conversion of ``model`` for the CUDA provider, the Casts it has): fp32 inputs and outputs kept
    (``keep_io_types``: a Cast after each float input and before each float output, the model's contract
    unchanged), and only the ops the CUDA provider has no fp16 kernel for left in fp32 (each costs a Cast pair)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    blocked = [op for op in DEFAULT_OP_BLOCK_LIST if op not in CUDA_FP16_OPS]
    half = convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked,
                                    disable_shape_infer=init_bytes(model) > inline_limit())
    return half, sum(1 for n in half.graph.node if n.op_type == "Cast")


def build_fp16(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``fp16``: onnxruntime's float16 conversion with fp32 inputs and outputs (``keep_io_types``); on the GPU
    a Hugging Face transformer is fused for the GPU first (:func:`build_fp16_gpu`)."""
    if ctx.device == "cuda" and (ctx.transformer or {}).get("found_in") == "config":
        return build_fp16_gpu(src, dst, ctx)
    save(_half(onnx.load(str(src))), dst)
    return BuildOutcome({"tool": "onnxruntime.transformers.float16", "keep_io_types": True})


def _half_fused(opt) -> onnx.ModelProto:
    """fp16 of onnxruntime's optimized model (its own conversion knows the com.microsoft ops' types)."""
    try:
        opt.convert_float_to_float16(keep_io_types=True, use_symbolic_shape_infer=True)
    except Exception:  # noqa: BLE001 - symbolic shape inference gives up on some graphs: convert without it
        opt.convert_float_to_float16(keep_io_types=True, use_symbolic_shape_infer=False)
    have = {o.domain for o in opt.model.opset_import}
    for domain in sorted({n.domain for n in opt.model.graph.node} - have - {"", "ai.onnx"}):
        opt.model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    return opt.model


def build_fp16_gpu(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """fp16 of a Hugging Face transformer for the CUDA provider: onnxruntime's transformer optimizer with
    ``use_gpu=True`` on the export; when no attention fuses there, the ``fused`` variant's routes (re-exports
    the fusion patterns know); when none fuses, the plain float16 conversion."""
    params = ctx.transformer or {}
    details: dict = {"tool": "onnxruntime.transformers.optimizer (use_gpu=True) + float16", "keep_io_types": True,
                     "op_block_list": "onnxruntime.transformers.float16 default"}
    tried: list[str] = []
    try:
        opt, counts = ort_optimizer(src, params, use_gpu=True)
        if fused_attention(opt.model):
            save(_half_fused(opt), dst)
            return BuildOutcome({**details, "fusions": counts, "graph": "given export"})
        tried.append("given export: no attention fused")
    except Exception as e:  # noqa: BLE001 - the re-export routes below may still fuse
        tried.append(f"given export: {short_error(e)}")
    with tempfile.TemporaryDirectory(prefix="onnxport-fp16-", dir=dst.parent) as tmp:
        fused = Path(tmp) / "fused.onnx"
        try:
            how = build_fused(src, fused, ctx).details
            save(_half(onnx.load(str(fused))), dst)
            return BuildOutcome({**details, "tool": f"{how.get('tool')} + float16", "fusions": how.get("fusions"),
                                 "graph": how.get("graph"), "tried": tried + list(how.get("tried", []))})
        except Skip as e:
            tried.append(str(e))
    save(_half(onnx.load(str(src))), dst)
    return BuildOutcome({"tool": "onnxruntime.transformers.float16", "keep_io_types": True,
                         "fusions": {}, "tried": tried})
