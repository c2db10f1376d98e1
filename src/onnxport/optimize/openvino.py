"""The CPU variants that run on OpenVINO instead of ONNX Runtime (the optional ``openvino`` extra); each records
the session options it must be run with (provider ``openvino`` and its ``inference_precision``; how they are
run: :mod:`onnxport.runtime.openvino`, opened by :func:`onnxport.runtime.open_for`).

* ``openvino``: the fp32 export compiled by OpenVINO at f32 inference precision; proven with the fp32
  tolerance like the export (OpenVINO's own default on a bf16 CPU is bf16: the precision is always set);
* ``openvino-bf16``: the same file compiled at bf16 inference precision (MatMul/Conv in bf16 with fp32
  accumulation), only where the CPU has native bf16 (AVX-512 BF16 or AMX-BF16); bf16 keeps 8 bits of
  mantissa, so it is judged by the task metric (cosine, top-1), like int8;
* ``openvino-int8``: the export quantized by NNCF (post-training, calibrated on ``--samples`` when given, on
  generated inputs over the dims' ranges otherwise) into a QDQ ONNX file that OpenVINO runs in int8 (VNNI/AMX),
  the rest at bf16 where the CPU has it; accuracy-aware: the nodes that cost the task metric most are left out
  of int8 until it passes int8's gates (optimize/nncf_int8.py). Needs the optional ``nncf`` package.

Each is skipped with :attr:`~onnxport.optimize.result.SkipReason.NOT_BUILT` where OpenVINO (or NNCF, or bf16)
is missing here, and is not applicable on ``--device cuda``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from onnxport.core.diagnostics import Diagnostic, info
from onnxport.core.errors import one_line
from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.optimize.result import SkipReason, Variant
from onnxport.runtime import environment
from onnxport.runtime.openvino import LATENCY, OPENVINO, bf16_missing, openvino_missing, openvino_version
from onnxport.runtime.sessions import session
from onnxport.runtime.variant_sessions import SessionOptions, is_openvino, open_for

__all__ = ["OPENVINO_VARIANTS", "PRECISION_OF", "build_openvino", "build_openvino_bf16", "build_openvino_int8",
           "int8_precision", "nncf_missing", "openvino_options", "why_not_here"]

OPENVINO_VARIANTS = ("openvino", "openvino-bf16", "openvino-int8")
PRECISION_OF = {"openvino": "f32", "openvino-bf16": "bf16", "openvino-int8": "bf16"}  # int8: f32 without bf16 (int8_precision)
ON_THE_CPU = "runs on the CPU (OpenVINO's CPU plugin); not built with --device cuda"


def nncf_missing() -> str | None:
    """Why NNCF cannot quantize here (None: it can)."""
    if importlib.util.find_spec("nncf") is None:
        return "the optional package 'nncf' is not installed (pip install onnxport[openvino])"
    return None


def why_not_here(name: str, cpu_flags: Sequence[str] | None = None, device: str = "cpu") -> tuple[str, SkipReason] | None:
    """(why, reason) variant ``name`` cannot be built on this machine, None when it can (``cpu_flags``: this
    CPU's features, default read from /proc/cpuinfo)."""
    if device != "cpu":
        return ON_THE_CPU, SkipReason.NOT_APPLICABLE
    why = openvino_missing()
    if why is None and name == "openvino-bf16":
        why = bf16_missing(environment.cpu()["flags"] if cpu_flags is None else cpu_flags)
    if why is None and name == "openvino-int8":
        why = nncf_missing()
    return (why, SkipReason.NOT_BUILT) if why else None


def openvino_options(precision: str) -> SessionOptions:
    """The session options of a file run by OpenVINO at ``precision`` (report ``session_options``)."""
    return SessionOptions(OPENVINO, inference_precision=precision, performance_hint=LATENCY)


def _check(name: str, ctx: BuildContext) -> None:
    found = why_not_here(name, device=ctx.device)
    if found:
        raise Skip(found[0], reason=found[1])


def _details(precision: str, file: str) -> dict:
    return {"backend": OPENVINO, "openvino": openvino_version(), "file": file, "inference_precision": precision,
            "performance_hint": LATENCY}


def build_openvino(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``openvino``: the fp32 export compiled by OpenVINO at f32 (``dst`` is not written)."""
    _check("openvino", ctx)
    return BuildOutcome(_details("f32", "the fp32 export"), path=src, session_options=openvino_options("f32"),
                        policy="openvino")


def build_openvino_bf16(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``openvino-bf16``: the fp32 export compiled by OpenVINO at bf16 (``dst`` is not written)."""
    _check("openvino-bf16", ctx)
    return BuildOutcome(_details("bf16", "the fp32 export"), path=src, session_options=openvino_options("bf16"),
                        policy="openvino-bf16")


def int8_precision(cpu_flags: Sequence[str] | None = None) -> str:
    """The inference precision ``openvino-int8`` is compiled at: what stays out of int8 (attention, the nodes
    the search kept, LayerNorm) runs in bf16 where the CPU has native bf16, else in f32."""
    return "bf16" if bf16_missing(environment.cpu()["flags"] if cpu_flags is None else cpu_flags) is None else "f32"


def build_openvino_int8(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``openvino-int8``: the export quantized by NNCF into ``dst`` (QDQ ONNX), run by OpenVINO; accuracy-aware
    (:func:`onnxport.optimize.nncf_int8.quantize_searched`): the outcome carries its proof."""
    _check("openvino-int8", ctx)
    from onnxport.optimize.nncf_int8 import quantize_searched

    precision = int8_precision()
    options = openvino_options(precision)
    details, proof, spent = quantize_searched(src, dst, ctx, open_for(options, ctx.out))
    details["onnxruntime"] = onnxruntime_opens(dst)
    return BuildOutcome({**_details(precision, "the NNCF int8 (QDQ) file"), **details}, proof, spent,
                        session_options=options, policy="openvino-int8")


def onnxruntime_opens(path: Path) -> str:
    """How onnxruntime opens a file built for OpenVINO: "opens" (at its defaults), "opens only at graph
    optimization level basic: …" or "does not open: …" (NNCF's signed int8 activations trip onnxruntime's own
    QDQ rewrites above the basic level)."""
    try:
        session(path)
        return "opens"
    except Exception as e:  # noqa: BLE001 - what onnxruntime says is the record
        why = one_line(e)
    try:
        session(path, opt_level="basic")
        return f"opens only at graph optimization level basic (at its defaults: {why})"
    except Exception as e:  # noqa: BLE001
        return f"does not open: {one_line(e)}"


def best_notes(best: Variant) -> list[Diagnostic]:
    """An info line when the best variant is run by OpenVINO (``best-needs-openvino``): bench, serve and triton
    follow it; a user taking best.onnx elsewhere needs OpenVINO, and is told how onnxruntime opens it."""
    options = best.session_options
    if options is None or not is_openvino(options):
        return []
    ort_says = (best.details or {}).get("onnxruntime", "opens")
    precision = options.inference_precision or "f32"
    return [info("best-needs-openvino",
                 f"best.onnx is {best.name}, proven and timed on OpenVINO at {precision} inference precision "
                 f"(bench, serve and triton run it there); onnxruntime: {ort_says}",
                 hint="run best.onnx with OpenVINO (report.json best.session_options), or take model.onnx for "
                      "onnxruntime")]
