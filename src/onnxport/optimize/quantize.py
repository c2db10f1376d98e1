"""The ``int8`` variant: static QDQ int8 with calibration for CNNs, dynamic int8 (weights per channel,
activations at run time) for everything else, with the weight range (8- or 7-bit) chosen by the task metric.

The sensitivity search that keeps a few nodes in fp32 when plain dynamic int8 fails its metric is in
:mod:`onnxport.optimize.sensitivity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx

from onnxport.core.onnxfile import file_bytes, inline_limit
from onnxport.core.samples import make_inputs, validation_cases
from onnxport.optimize.context import BuildContext, BuildOutcome, Refs, Skip
from onnxport.optimize.graph import is_cnn, matmul_weights
from onnxport.optimize.policy import metric_margin, task_metrics
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

# what quantize_dynamic turns into integer ops (it leaves Gemm in fp32); Attention: ONNX Runtime's fused one,
# which becomes QAttention
QUANT_OPS = ("MatMul", "Attention")


def quant_candidates(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes dynamic int8 quantizes: MatMul and ONNX Runtime's Attention with a constant weight."""
    inits = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in QUANT_OPS and len(n.input) > 1 and n.input[1] in inits
            and n.name and (n.op_type != "Attention" or n.domain == "com.microsoft")]


def calibration(loaded: LoadedModel, src: Path, n: int = 8):
    """A CalibrationDataReader over ``n`` generated inputs at several sizes (export size, min, odd)."""
    from onnxruntime.quantization import CalibrationDataReader

    feed = FeedMap.of(loaded.inputs, session(src, opt_level="disable"))
    cases = validation_cases(loaded.dims)
    cheap = [c for c in cases if c.label in ("export", "odd", "min", "edge values")] or cases[:2]
    feeds = []
    for k in range(n):
        c = cheap[k % len(cheap)]
        feeds.append(feed(make_inputs(loaded.inputs, c.sizes, c.values, 1000 + k)))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    return Reader()


def quantize_dynamic(src: Path, dst: Path, exclude: Sequence[str] = (), reduce_range: bool = False) -> None:
    """Dynamic int8 of ``src``'s MatMul (and fused Attention) nodes into ``dst``, weights per channel,
    ``exclude``: node names kept in fp32; ``reduce_range``: 7-bit weights."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    op_types = {n.op_type for n in quant_candidates(onnx.load(str(src), load_external_data=False))}
    ort_quantize_dynamic(str(src), str(dst), per_channel=True, reduce_range=reduce_range,
                         weight_type=QuantType.QInt8,
                         op_types_to_quantize=[o for o in QUANT_OPS if o in op_types] or ["MatMul"],
                         nodes_to_exclude=list(exclude),
                         use_external_data_format=file_bytes(src) > inline_limit(),
                         extra_options={"MatMulConstBOnly": True,
                                        # fused contrib ops have no shape-inferred types; their tensors are float
                                        "DefaultTensorType": onnx.TensorProto.FLOAT})


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(float(x), 5)


def quantize_best(loaded: LoadedModel, src: Path, dst: Path, refs: Refs | None,
                  exclude: Sequence[str] = ()) -> tuple[bool, dict]:
    """Dynamic int8 with 8-bit and with 7-bit weights; ``dst`` keeps the one with the better task metric.

    8-bit weights can saturate the int16 pair sums of the int8 kernels on CPUs without VNNI (AVX2); 7-bit
    weights (reduce_range) cannot, and give the same result everywhere. Returns (reduce_range, margins).
    """
    scores: dict[bool, float] = {}
    for rr in (False, True):
        quantize_dynamic(src, dst, exclude=exclude, reduce_range=rr)
        if refs is None:
            return False, {}
        scores[rr] = metric_margin(task_metrics(loaded, refs, session(dst)))
    reduce_range = scores[True] > scores[False]
    if not reduce_range:
        quantize_dynamic(src, dst, exclude=exclude, reduce_range=False)
    return reduce_range, {"8-bit": _rounded(scores[False]), "7-bit": _rounded(scores[True])}


def build_int8(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``int8``: static QDQ for CNNs, else dynamic int8 with the better weight range (no sensitivity search)."""
    loaded = ctx.loaded
    model = onnx.load(str(src), load_external_data=False)
    if is_cnn(model):
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        quantize_static(str(src), str(dst), calibration(loaded, src), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        return BuildOutcome({"tool": "onnxruntime.quantization.quantize_static", "format": "QDQ",
                             "per_channel": True, "calibration": "8 generated inputs at the export, min and odd sizes"})
    if matmul_weights(model) == 0:
        raise Skip("no MatMul/Gemm with constant weights and no Conv: nothing to quantize")
    reduce_range, margins = quantize_best(loaded, src, dst, ctx.refs)
    return BuildOutcome({"tool": "onnxruntime.quantization.quantize_dynamic", "per_channel": True,
                         "weights": "int8 (7-bit range)" if reduce_range else "int8", "reduce_range": reduce_range,
                         "activations": "uint8, per tensor, at run time", "metric_margin": margins})
