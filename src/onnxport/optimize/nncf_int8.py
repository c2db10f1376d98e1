"""NNCF's post-training int8 of an ONNX file (the ``openvino-int8`` variant, optimize/openvino.py): QDQ nodes
OpenVINO turns into int8 kernels (VNNI, AMX), calibrated on the user's ``--samples`` when given, else on
generated inputs at the export, min and odd sizes (:func:`onnxport.optimize.quantize.calibration`)."""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxport.core.logs import captured_output
from onnxport.core.onnxfile import file_bytes, inline_limit
from onnxport.optimize.context import BuildContext, Skip
from onnxport.optimize.graph import matmul_weights
from onnxport.optimize.quantize import calibration

GENERATED = 16  # generated calibration inputs when no --samples are given


def calibration_feeds(ctx: BuildContext, src: Path) -> list[dict]:
    """The feeds NNCF calibrates on: one per sample (``ctx.samples``), else :data:`GENERATED` generated ones."""
    given = ctx.samples.samples if ctx.samples is not None else None
    reader = calibration(ctx.loaded, src, n=GENERATED, samples=given)
    feeds = []
    while (feed := reader.get_next()) is not None:
        feeds.append(feed)
    return feeds


def quantize(src: Path, dst: Path, ctx: BuildContext) -> dict:
    """NNCF int8 of ``src`` into ``dst`` (transformer preset for attention models); returns the report details."""
    import nncf

    model = onnx.load(str(src))
    if matmul_weights(model) == 0:
        raise Skip("no MatMul/Gemm with constant weights and no Conv: nothing to quantize")
    feeds = calibration_feeds(ctx, src)
    transformer = ctx.transformer is not None
    kw = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    with captured_output():  # NNCF's progress bars: stdout belongs to --json
        quantized = nncf.quantize(model, nncf.Dataset(feeds), subset_size=len(feeds), **kw)
    onnx.save(quantized, str(dst), save_as_external_data=file_bytes(src) > inline_limit())
    return {"tool": f"nncf.quantize {nncf.__version__}", "format": "QDQ", "preset": "transformer" if transformer
            else "performance", "calibration": (f"{len(feeds)} of the --samples" if ctx.samples is not None
                                                else f"{len(feeds)} generated inputs (export, min, odd sizes)")}
