"""NNCF's post-training int8 of an ONNX file (the ``openvino-int8`` variant, optimize/openvino.py): QDQ nodes
OpenVINO turns into int8 kernels (VNNI, AMX), accuracy-aware like ONNX Runtime's int8 (optimize/sensitivity.py).

* Calibration: the user's ``--samples`` when given, else :data:`GENERATED` generated inputs over the whole range
  of every dynamic dim (the export, min and odd sizes and each dim's maximum: activations at 512 tokens are not
  those at 16, and a range calibrated on short inputs clips the long ones); activation ranges are the min/max
  over all of them (NNCF's default averages each input's range, which clips the widest ones).
* SmoothQuant (NNCF's transformer preset) on and off: the one whose task metric is better is kept (on random
  weights SmoothQuant's scales can hurt more than they help).
* When the task metric still fails, the nodes whose quantized activations cost it most are found by the greedy
  search of :func:`~onnxport.optimize.sensitivity.int8_search` on the QDQ file
  (:func:`~onnxport.optimize.sensitivity.qdq_switch_model`) and left out of int8 (``nncf.IgnoredScope``); the
  real file is then re-checked on OpenVINO and a case it still fails joins the next round, as for ``int8``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import onnx

from onnxport.core.logs import captured_output
from onnxport.core.onnxfile import file_bytes, inline_limit
from onnxport.core.samples import Case, make_inputs, validation_cases
from onnxport.optimize.context import BuildContext, Refs, Skip
from onnxport.optimize.graph import matmul_weights
from onnxport.optimize.policy import metric_margin, prove, task_metrics
from onnxport.optimize.quantize import calibration
from onnxport.optimize.result import Proof
from onnxport.optimize.sensitivity import (
    MAX_ROUNDS,
    SearchOptions,
    failing_cases,
    int8_search,
    qdq_switch_model,
    worst_rows,
)
from onnxport.runtime import environment
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

GENERATED = 16  # generated calibration inputs when no --samples are given (--variants all / named variants)
DEFAULT_GENERATED = 8  # the default plan's: each size of calibration_cases at least once
SEARCH_S = 60.0  # at most this long per search round (less where --budget ends sooner)
METHOD = ("greedy on the QDQ file: the node whose fp32 activations restore the task metric most is left out of "
          "int8, one at a time (one run per question); then NNCF quantizes again with those nodes ignored and "
          "the file is re-checked on OpenVINO")


def calibration_cases(loaded: LoadedModel) -> list[Case]:
    """The sizes generated calibration covers: the matrix's random-valued cases (export, min, odd, each dim's
    maximum); the all-max case is left out where each dim's maximum has a case of its own (at the others' min)."""
    cases = [c for c in validation_cases(loaded.dims) if c.values == "random"]
    own_max = len(loaded.dims) > 1 and any(c.label.startswith("max ") for c in cases)
    return [c for c in cases if not (own_max and c.label == "max")] or cases


def calibration_feeds(ctx: BuildContext, src: Path) -> list[dict]:
    """The feeds NNCF calibrates on: one per sample (``ctx.samples``), else :data:`GENERATED` generated ones
    cycling over :func:`calibration_cases`."""
    if ctx.samples is not None:
        reader = calibration(ctx.loaded, src, samples=ctx.samples.samples)
        feeds = []
        while (feed := reader.get_next()) is not None:
            feeds.append(feed)
        return feeds
    feed = FeedMap.of(ctx.loaded.inputs, session(src, opt_level="disable"))
    cases = calibration_cases(ctx.loaded)
    count = GENERATED if ctx.thorough else DEFAULT_GENERATED
    return [feed(make_inputs(ctx.loaded.inputs, cases[k % len(cases)].sizes, "random", 1000 + k))
            for k in range(max(count, len(cases)))]


def overflow_fix(cpu_flags: Sequence[str] | None = None) -> str:
    """NNCF's overflow fix for this CPU (``cpu_flags``, default: read here): "disable" where it has int8 dot
    products (VNNI, AMX-INT8: int32 sums, nothing saturates), else "enable": every MatMul/Conv weight in 7 bits,
    as AVX2's int16 pair sums saturate with 8-bit ones (the same reason ``int8`` uses 7-bit weights there)."""
    flags = environment.cpu()["flags"] if cpu_flags is None else cpu_flags
    return "disable" if environment.int8_dot(flags) else "enable"


def quantize(src: Path, dst: Path, feeds: Sequence[dict], *, transformer: bool, smooth_quant: bool = True,
             ignored: Sequence[str] = (), overflow: str | None = None) -> None:
    """NNCF int8 of ``src`` into ``dst`` (QDQ ONNX) calibrated on ``feeds``: the transformer preset for
    attention models (SmoothQuant unless ``smooth_quant`` is False), min/max activation ranges over all the
    feeds, the nodes named in ``ignored`` left in float, NNCF's overflow fix as this CPU needs it
    (``overflow``: "enable" | "disable", default :func:`overflow_fix`)."""
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
        OverflowFix,
    )
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    adv = AdvancedQuantizationParameters(activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
                                         overflow_fix=OverflowFix(overflow or overflow_fix()))
    if not smooth_quant:
        adv.smooth_quant_alphas = AdvancedSmoothQuantParameters(matmul=-1)
    kw: dict = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    if ignored:
        kw["ignored_scope"] = nncf.IgnoredScope(names=list(ignored), validate=False)
    model = onnx.load(str(src))
    with captured_output():  # NNCF's progress bars: stdout belongs to --json
        quantized = nncf.quantize(model, nncf.Dataset(list(feeds)), subset_size=len(feeds), advanced_parameters=adv,
                                  **kw)
    onnx.save(quantized, str(dst), save_as_external_data=file_bytes(src) > inline_limit())


def _margin(loaded: LoadedModel, refs: Refs, sess) -> float:
    return round(metric_margin(task_metrics(loaded, refs, sess)), 5)


def quantize_searched(src: Path, dst: Path, ctx: BuildContext, opener) -> tuple[dict, Proof | None, float]:
    """``openvino-int8`` into ``dst``: NNCF int8 with SmoothQuant on and off (the better task metric kept), then,
    while the metric fails on OpenVINO (``opener``: how the variant's session is opened), the search for the
    nodes to leave out of int8. Returns (report details, the proof of ``dst``, the seconds proving took)."""
    import nncf

    loaded = ctx.loaded
    if matmul_weights(onnx.load(str(src), load_external_data=False)) == 0:
        raise Skip("no MatMul/Gemm with constant weights and no Conv: nothing to quantize")
    feeds = calibration_feeds(ctx, src)
    transformer = ctx.transformer is not None
    judged = ctx.judged
    details: dict = {
        "tool": f"nncf.quantize {nncf.__version__}", "format": "QDQ",
        "preset": "transformer" if transformer else "performance", "activation_ranges": "min/max over all inputs",
        "overflow_fix": overflow_fix(),
        "calibration": (f"{len(feeds)} of the --samples" if ctx.samples is not None
                        else f"{len(feeds)} generated inputs (" + ", ".join(c.label for c in calibration_cases(loaded))
                        + " sizes)")}
    external = file_bytes(src) > inline_limit()
    with tempfile.TemporaryDirectory(prefix="onnxport-nncf-") as tmp:
        margins: dict[str, float] = {}
        for sq in (True, False) if transformer else (False,):
            if margins and ctx.spent():
                details["smooth_quant_off"] = "not tried: the --budget was spent"
                break
            ctx.progress(f"variant openvino-int8: NNCF calibration on {len(feeds)} inputs"
                         + (f" (SmoothQuant {'on' if sq else 'off'})" if transformer else ""))
            quantize(src, Path(tmp) / f"sq-{sq}.onnx", feeds, transformer=transformer, smooth_quant=sq)
            if judged is None:
                break
            margins["on" if sq else "off"] = _margin(loaded, judged, opener(Path(tmp) / f"sq-{sq}.onnx"))
            if margins["on" if sq else "off"] >= 0:  # passes: the other setting is not tried
                break
        smooth_quant = transformer and (not margins or max(margins, key=margins.__getitem__) == "on")
        plain = Path(tmp) / f"sq-{smooth_quant}.onnx"  # every node in int8: the search switches its activations
        details["smooth_quant"] = {"used": smooth_quant, "metric_margin": margins} if transformer else False
        onnx.save(onnx.load(str(plain)), str(dst), save_as_external_data=external)
        if ctx.refs is None:
            return details, None, 0.0
        t0 = time.perf_counter()
        proof = prove(loaded, "openvino-int8", dst, ctx.refs, ctx.tolerance, ctx.samples, opener)
        spent = time.perf_counter() - t0
        if proof.passed:
            return details, proof, spent
        t_search = time.perf_counter()
        kept: tuple[str, ...] = ()
        failing = failing_cases(loaded, judged, opener(dst))
        rounds = evaluations = of = 0
        if failing and ctx.spent():
            details["search"] = "not run: the --budget was spent"
        while failing and rounds < MAX_ROUNDS and not ctx.spent():  # --budget
            rounds += 1
            ctx.progress(f"variant openvino-int8: searching which nodes to leave out of int8 (round {rounds}, "
                         f"{len(failing)} case(s))")
            found = int8_search(loaded, plain, worst_rows(loaded, judged, failing, opener(dst)),
                                SearchOptions(start=kept, min_steps=int(rounds > 1),
                                              budget_s=ctx.seconds_left(SEARCH_S), rewrite=qdq_switch_model,
                                              opt_level="basic"))
            evaluations += found.evaluations
            of = found.candidates
            if found.kept == kept:
                break
            kept = found.kept
            quantize(src, dst, feeds, transformer=transformer, smooth_quant=smooth_quant, ignored=kept)
            failing = failing_cases(loaded, judged, opener(dst))
        searched = time.perf_counter() - t_search
    t0 = time.perf_counter()
    after = prove(loaded, "openvino-int8", dst, ctx.refs, ctx.tolerance, ctx.samples, opener)
    spent += time.perf_counter() - t0
    details["sensitivity"] = {
        "kept_fp32": list(kept), "kept": len(kept), "of": of,
        "plain_int8_metric": None if proof.metric is None else proof.metric.to_dict(), "method": METHOD,
        "rounds": rounds, "evaluations": evaluations, "search_seconds": round(searched, 3)}
    return details, after, spent
