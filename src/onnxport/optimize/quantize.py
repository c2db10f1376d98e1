"""The ``int8`` variant: static QDQ int8 with calibration for CNNs, dynamic int8 (weights per channel,
activations at run time) for everything else, with the weight range (8- or 7-bit) chosen by the task metric.

Static int8 calibrates on the user's ``--samples`` when given: on 70% of them with each of ONNX Runtime's
calibration methods (MinMax, Entropy, Percentile), keeping the one whose task metric is best on the held-out 30%;
else on generated inputs.

The sensitivity search that keeps a few nodes in fp32 when plain dynamic int8 fails its metric is in
:mod:`onnxport.optimize.sensitivity`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from onnxport.core.onnxfile import file_bytes, inline_limit
from onnxport.core.samples import make_inputs, validation_cases
from onnxport.optimize.context import BuildContext, BuildOutcome, Refs, Skip, sample_refs
from onnxport.optimize.graph import is_cnn, matmul_weights, replace_model
from onnxport.optimize.policy import metric_margin, task_metrics
from onnxport.prove import samples as proving_samples
from onnxport.prove.samples import SampleRefs
from onnxport.runtime import environment
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel
from onnxport.sources.datasets import SampleSet

# what quantize_dynamic turns into integer ops (it leaves Gemm in fp32); Attention: ONNX Runtime's fused one,
# which becomes QAttention
QUANT_OPS = ("MatMul", "Attention")
STATIC_OPS = ("Conv", "MatMul", "Gemm")
CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile")  # onnxruntime.quantization.CalibrationMethod names
CALIBRATION_OPTIONS = {"MinMax": {}, "Entropy": {"num_bins": 512, "num_quantized_bins": 128},
                       "Percentile": {"num_bins": 2048, "percentile": 99.999}}
MIN_SPLIT = 5  # fewer samples than this: calibrate and judge on all of them


def quant_candidates(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes dynamic int8 quantizes: MatMul and ONNX Runtime's Attention with a constant weight."""
    inits = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in QUANT_OPS and len(n.input) > 1 and n.input[1] in inits
            and n.name and (n.op_type != "Attention" or n.domain == "com.microsoft")]


def calibration(loaded: LoadedModel, src: Path, n: int = 8, samples: SampleSet | None = None):
    """A CalibrationDataReader over the user's ``samples`` (one per run: onnxruntime's histogram calibrators stack
    the runs, so they must share a shape), or else over ``n`` generated inputs at several sizes (export, min, odd)."""
    from onnxruntime.quantization import CalibrationDataReader

    feed = FeedMap.of(loaded.inputs, session(src, opt_level="disable"))
    if samples is not None:
        feeds = [feed(proving_samples.stack(loaded, samples, idx)) for idx in proving_samples.groups(samples.count, 1)]
    else:
        cases = validation_cases(loaded.dims)
        cheap = [c for c in cases if c.label in ("export", "odd", "min", "edge values")] or cases[:2]
        feeds = [feed(make_inputs(loaded.inputs, cheap[k % len(cheap)].sizes, cheap[k % len(cheap)].values, 1000 + k))
                 for k in range(n)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    return Reader()


def activation_ranges(src: Path, reader, method: str, cache: Path) -> Path:
    """The activation ranges ``method`` finds on what ``reader`` feeds, written to ``cache`` (onnxruntime's
    calibration cache). onnxruntime's calibrators are run directly, with the histogram sizes of
    :data:`CALIBRATION_OPTIONS`: quantize_static does not pass them on, and at its default 128 bins Entropy
    can only return the MinMax range."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    with tempfile.TemporaryDirectory(prefix="onnxport-calib-") as tmp:
        calibrator = create_calibrator(src, STATIC_OPS, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=CalibrationMethod[method],
                                       use_external_data_format=file_bytes(src) > inline_limit(),
                                       extra_options=CALIBRATION_OPTIONS[method])
        calibrator.collect_data(reader)
        save_tensors_data(calibrator.compute_data(), cache)
    return cache


def quantize_static(src: Path, dst: Path, reader, method: str = "MinMax", cache: Path | None = None) -> None:
    """Static QDQ int8 of ``src``'s Conv/MatMul/Gemm into ``dst``: weights int8 per channel, activations uint8
    with the ranges ``method`` (a CalibrationMethod name) finds on what ``reader`` feeds (or that ``cache``
    holds, from :func:`activation_ranges`)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    kw = {"calibration_cache_path": str(cache)} if cache is not None else {}
    ort_quantize_static(str(src), str(dst), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=list(STATIC_OPS), calibrate_method=CalibrationMethod[method],
                        use_external_data_format=file_bytes(src) > inline_limit(),
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True}, **kw)


def _takes_ranges() -> bool:
    """Whether this onnxruntime's quantize_static reads activation ranges from a calibration cache."""
    import inspect

    from onnxruntime.quantization import quantize_static as ort_quantize_static

    return "calibration_cache_path" in inspect.signature(ort_quantize_static).parameters


def calibrated_on_samples(loaded: LoadedModel, src: Path, dst: Path, samples: SampleRefs) -> dict:
    """Static int8 calibrated on the samples: each of :data:`CALIBRATION_METHODS` on 70% of them, judged by the task
    metric on the held-out 30% (all of them, both ways, under :data:`MIN_SPLIT` samples); ``dst`` keeps the best.
    Returns the report ``details["calibration"]``."""
    given = samples.samples
    fit, held = given.split(0.7) if given.count >= MIN_SPLIT else (given, given)
    judged = sample_refs(proving_samples.references(loaded, held) if held is not given else samples)
    scores: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="onnxport-calib-") as tmp:
        for method in CALIBRATION_METHODS:
            path = Path(tmp) / f"{method}.onnx"
            try:
                reader = calibration(loaded, src, samples=fit)
                if _takes_ranges():
                    ranges = activation_ranges(src, reader, method, Path(tmp) / f"{method}.ranges.json")
                    quantize_static(src, path, None, method, cache=ranges)
                else:  # an onnxruntime without calibration caches: its own bins (Entropy = MinMax there)
                    quantize_static(src, path, reader, method)
            except Exception as e:  # noqa: BLE001 - a method that fails here is left out, and says why
                scores[method] = {"error": " ".join(str(e).split())[:200]}
                continue
            metrics = task_metrics(loaded, judged, session(path))
            scores[method] = {"margin": _rounded(metric_margin(metrics)),
                              **{m.name: _rounded(m.value) for m in metrics}}
        ranked = [m for m in CALIBRATION_METHODS if "margin" in scores[m]]
        if not ranked:
            raise RuntimeError(f"every calibration method failed: {scores[CALIBRATION_METHODS[0]]['error']}")
        best = max(ranked, key=lambda m: scores[m]["margin"])  # ties: the first (MinMax, the cheapest)
        replace_model(Path(tmp) / f"{best}.onnx", dst)
    return {"samples": given.file, "method": best, "calibrated_on": fit.count,
            "held_out": held.count if held is not given else 0, "held_out_metrics": scores}


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


def weight_ranges(thorough: bool, cpu_flags: Sequence[str] | None = None) -> tuple[bool, ...]:
    """The ``reduce_range`` settings dynamic int8 tries: both when ``thorough``, else the one the CPU calls for
    (8-bit weights where it has int8 dot products, VNNI / AMX-INT8; 7-bit weights elsewhere: AVX2's int16 pair
    sums saturate with 8-bit ones). ``cpu_flags``: this CPU's features (default: read here)."""
    if thorough:
        return (False, True)
    return (environment.int8_dot(environment.cpu()["flags"] if cpu_flags is None else cpu_flags) is None,)


def quantize_best(loaded: LoadedModel, src: Path, dst: Path, refs: Refs | None,
                  exclude: Sequence[str] = (), ranges: Sequence[bool] = (False, True)) -> tuple[bool, dict]:
    """Dynamic int8 with each weight range of ``ranges`` (``reduce_range``: False 8-bit, True 7-bit weights);
    ``dst`` keeps the one with the better task metric.

    8-bit weights can saturate the int16 pair sums of the int8 kernels on CPUs without VNNI (AVX2); 7-bit
    weights (reduce_range) cannot, and give the same result everywhere. Returns (reduce_range, margins).
    """
    if len(ranges) == 1:
        quantize_dynamic(src, dst, exclude=exclude, reduce_range=ranges[0])
        return ranges[0], {}
    scores: dict[bool, float] = {}
    for rr in ranges:
        quantize_dynamic(src, dst, exclude=exclude, reduce_range=rr)
        if refs is None:
            return rr, {}
        scores[rr] = metric_margin(task_metrics(loaded, refs, session(dst)))
    reduce_range = max(ranges, key=lambda rr: (scores[rr], rr))  # ties: 7-bit, the same on every CPU
    if reduce_range != ranges[-1]:
        quantize_dynamic(src, dst, exclude=exclude, reduce_range=reduce_range)
    return reduce_range, {("7-bit" if rr else "8-bit"): _rounded(scores[rr]) for rr in ranges}


def build_int8(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``int8``: static QDQ for CNNs, else dynamic int8 with the better weight range (no sensitivity search)."""
    loaded = ctx.loaded
    model = onnx.load(str(src), load_external_data=False)
    if is_cnn(model):
        static = {"tool": "onnxruntime.quantization.quantize_static", "format": "QDQ", "per_channel": True}
        if ctx.samples is not None:
            return BuildOutcome({**static, "calibration": calibrated_on_samples(loaded, src, dst, ctx.samples)})
        quantize_static(src, dst, calibration(loaded, src))
        return BuildOutcome({**static, "calibration": "8 generated inputs at the export, min and odd sizes (MinMax)"})
    if matmul_weights(model) == 0:
        raise Skip("no MatMul/Gemm with constant weights and no Conv: nothing to quantize")
    reduce_range, margins = quantize_best(loaded, src, dst, ctx.judged, ranges=weight_ranges(ctx.thorough))
    return BuildOutcome({"tool": "onnxruntime.quantization.quantize_dynamic", "per_channel": True,
                         "weights": "int8 (7-bit range)" if reduce_range else "int8", "reduce_range": reduce_range,
                         "activations": "uint8, per tensor, at run time", "metric_margin": margins})
