"""The ``fp16`` variant: weights and activations in half precision, inputs and outputs kept in fp32."""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxport.core.onnxfile import inline_limit
from onnxport.optimize.context import BuildContext, BuildOutcome
from onnxport.optimize.graph import init_bytes, save


def build_fp16(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``fp16``: onnxruntime's float16 conversion with fp32 inputs and outputs (``keep_io_types``)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=init_bytes(model) > inline_limit())
    save(half, dst)
    return BuildOutcome({"tool": "onnxruntime.transformers.float16", "keep_io_types": True})
