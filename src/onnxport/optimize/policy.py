"""The tolerance policy (docs/architecture.md, "Policies"), the task metrics, and the proof of one variant against PyTorch.

* fp32-graph variants (``slim``, ``ort``, ``fused``): elementwise with the fp32 tolerance;
* ``fp16`` (and ``tensorrt``, which lets TensorRT run layers in fp16): elementwise with atol/rtol 1e-2 *and*
  the task metric;
* ``tf32`` (fp32 MatMul/Conv on a 10-bit mantissa): elementwise with the TF32 tolerance (core/records.py) *and*
  the task metric;
* ``openvino`` (OpenVINO at f32): elementwise with the fp32 tolerance, like the export;
* ``openvino-bf16`` (bf16 keeps 8 bits of mantissa: elementwise errors of ~1e-2 relative are expected and say
  nothing about the task) and ``openvino-int8``: the task metric only, with int8's gates;
* ``int8`` (and ``fused+int8``): the task metric only — cosine similarity of the outputs (of the mean-pooled
  sentence embedding for Hugging Face encoders with ``last_hidden_state`` and an ``attention_mask``), plus
  top-1 agreement for classifiers (a 2-D logits output with more than one class).

With ``--samples`` every variant is judged by the same policy on the user's samples too, and a variant that fails
there is rejected with the reason. The task metric (fp16, int8) is then judged on the samples alone: they are the
data the model will serve, and generated inputs lie outside it (random noise is no image: static int8 calibrated
on real images misses the top-1 check on noise and passes it on images); the generated cases must still run, and
elementwise policies still hold on them. The generated cases' metric stays in the report beside the samples'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.records import FP16, FP32, TF32, Divergence, ParityResult, Tolerance, finite
from onnxport.optimize.gates import COSINE_MIN, TOP1_MIN
from onnxport.optimize.graph import short_error
from onnxport.optimize.registry import MODEL, register_judge
from onnxport.optimize.result import Metric, Proof, SampleJudgement
from onnxport.prove import localize
from onnxport.prove import samples as proving_samples
from onnxport.prove.compare import mean_pool, task_kind
from onnxport.prove.judging import (
    WITHIN,
    Accuracy,
    Policy,
    RunResults,
    compare_accuracy,
    metrics_of,
    run_cases,
    varying_record,
    verdict,
)
from onnxport.prove.parity import compare
from onnxport.prove.references import Refs, fingerprint
from onnxport.prove.samples import SampleRefs
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

# --------------------------------------------------------------------------- task metric


def _view(loaded: LoadedModel, kind: str, tensors: Sequence, outputs: dict[str, np.ndarray]) -> np.ndarray:
    """The array the task metric compares for one case, from one side's outputs by name."""
    if kind == "sentence-embedding":
        mask = tensors[[s.name for s in loaded.inputs].index("attention_mask")].numpy()
        return mean_pool(np.asarray(outputs["last_hidden_state"]), mask)
    return np.asarray(outputs[loaded.output_names[0]])


def task_runs(loaded: LoadedModel, refs: Refs, sess) -> tuple[RunResults, RunResults, str | None]:
    """(ONNX's arrays the task metric compares, PyTorch's, the task kind) on the matrix's realistic cases: the
    edge-values case (inputs scaled up, masks with a single valid token or left padding) stays with the
    elementwise policies, where it catches frozen paths."""
    feed = FeedMap.of(loaded.inputs, sess)
    onnx_out = [o.name for o in sess.get_outputs()]
    by_name = all(n in onnx_out for n in loaded.output_names)
    edge = [len(refs.cases) == len(refs.inputs) and c.values == "edge" for c in refs.cases] or [False] * len(refs.inputs)
    skip = edge if not all(edge) else [False] * len(edge)  # a matrix of edge cases alone is judged on them
    labels = [c.label for c in refs.cases] if len(refs.cases) == len(refs.inputs) else list(map(str, range(len(refs.inputs))))
    picked = [(label, tensors, ref) for label, skipped, tensors, ref in zip(labels, skip, refs.inputs, refs.outputs)
              if ref is not None and not skipped]
    kind = task_kind(loaded, picked[0][2]) if picked else None

    def run(case) -> tuple[np.ndarray]:
        _, tensors, _ = case
        got = sess.run(None, feed(tensors))
        got_by = dict(zip(onnx_out, got)) if by_name else dict(zip(loaded.output_names, got))
        return (_view(loaded, kind, tensors, got_by),)

    want = RunResults.of([c[0] for c in picked], [(_view(loaded, kind, t, dict(zip(loaded.output_names, r))),)
                                                  for _, t, r in picked])
    return run_cases(run, picked, [c[0] for c in picked]), want, kind


def task_found(loaded: LoadedModel, refs: Refs, sess, tolerance: Tolerance = FP32) -> tuple[Accuracy, str | None]:
    """(what comparing ``sess`` with PyTorch on the task's arrays found, the task kind): :func:`task_runs`, then
    :func:`~onnxport.prove.judging.compare_accuracy` (raw and centred by PyTorch's mean over the inputs, the
    latter at ``tolerance``; a case that fails to run or changes shape leaves the metrics without a value)."""
    got, want, kind = task_runs(loaded, refs, sess)
    return compare_accuracy(got, want, None, rows=True, top1=kind == "classifier"), kind


def task_policy(kind: str | None, cosine_min: float = COSINE_MIN, top1_min: float = TOP1_MIN,
                fallback: bool = False) -> Policy:
    """The task metric's gates and names for a task ``kind``."""
    name = "cosine (mean-pooled embedding)" if kind == "sentence-embedding" else "cosine"
    return Policy(FP32, False, True, cosine_min, top1_min, cosine_name=name, top1=kind == "classifier",
                  fallback=fallback)


def task_metrics(loaded: LoadedModel, refs: Refs, sess, cosine_min: float = COSINE_MIN,
                 top1_min: float = TOP1_MIN, *, tolerance: Tolerance = FP32, fallback: bool = False
                 ) -> tuple[Metric, ...]:
    """Cosine (worst row over the matrix) and, for classifiers, top-1 agreement of ``sess`` against PyTorch, raw
    and on the rows centred by PyTorch's mean over the inputs where that can tell (:func:`task_found`); with
    ``fallback``, the share within ``tolerance`` at the output's scale where a centred metric cannot tell."""
    found, kind = task_found(loaded, refs, sess, tolerance)
    return metrics_of(found, task_policy(kind, cosine_min, top1_min, fallback))


def metric_margin(metrics: Sequence[Metric]) -> float:
    """How far the worst metric is above its threshold (negative: failing)."""
    return min((m.value - m.threshold) if m.value is not None else -1.0 for m in metrics)


# --------------------------------------------------------------------------- proving


def tolerance_policy(name: str, tolerance: Tolerance) -> tuple[Tolerance, bool, bool]:
    """(elementwise tolerance, elementwise decides, metric decides) for a variant name."""
    if "int8" in name or "bf16" in name:
        return tolerance, False, True
    if "fp16" in name or name == "tensorrt":
        return Tolerance(max(tolerance.atol, FP16.atol), max(tolerance.rtol, FP16.rtol)), True, True
    if name == "tf32":
        return Tolerance(max(tolerance.atol, TF32.atol), max(tolerance.rtol, TF32.rtol)), True, True
    return tolerance, True, False


def sample_metrics(agreement: dict, cosine_min: float = COSINE_MIN, top1_min: float = TOP1_MIN) -> tuple[Metric, ...]:
    """The task metrics of :func:`task_metrics`, from the samples' agreement (``prove.samples.agreement``): raw,
    centred by PyTorch's mean over the samples where that can tell, else the share within the tolerance at the
    output's scale."""
    out = []
    name = "cosine (mean-pooled embedding)" if agreement.get("task") == "sentence-embedding" else "cosine"
    if agreement.get("cosine_min") is not None:
        out.append(Metric(name, agreement["cosine_min"], cosine_min, bool(agreement["cosine_min"] >= cosine_min)))
    if agreement.get("top1_agreement") is not None:
        out.append(Metric("top1_agreement", agreement["top1_agreement"], top1_min,
                          bool(agreement["top1_agreement"] >= top1_min)))
    centred = agreement.get("cosine_min_centred")
    if centred is not None:
        out.append(Metric(f"{name} (centred)", centred, cosine_min, bool(centred >= cosine_min)))
    top1 = agreement.get("top1_agreement_centred")
    if top1 is not None:
        out.append(Metric("top1_agreement (centred)", top1, top1_min, bool(top1 >= top1_min)))
    untold = centred is None or (agreement.get("task") == "classifier" and top1 is None)
    if "cannot_tell" in agreement and untold and agreement.get("within_own_scale") is not None:
        out.append(Metric(WITHIN, agreement["within_own_scale"], 1.0, bool(agreement["within_own_scale"] >= 1.0)))
    return tuple(out)


def judge_samples(loaded: LoadedModel, name: str, sess, samples: SampleRefs,
                  tolerance: Tolerance) -> tuple[SampleJudgement, list[str]]:
    """Variant ``name`` on the user's samples under its policy: (report ``variants[].samples``, why it fails there).

    Elementwise variants must keep every sample within their tolerance; fp16 and int8 must keep the task metric
    (worst-sample cosine, top-1 agreement) above its threshold on the samples as on the generated cases."""
    tol, by_elements, by_metric = tolerance_policy(name, tolerance)
    proof = proving_samples.check(loaded, "", samples, tol, sess=sess)
    metrics = sample_metrics(proof.metrics)
    reasons = []
    if by_elements and not proof.passed:
        reasons.append(f"{len(proof.failures)} of {proof.samples.count} samples outside atol {tol.atol:g} / rtol "
                       f"{tol.rtol:g}; first {proof.first_failure()}")
    elif not by_elements and any(why.startswith("onnxruntime fails") for _, why in proof.failures):
        reasons.append(proof.first_failure())
    if by_metric:
        reasons += [f"{m.name} {'n/a' if m.value is None else f'{m.value:.4f}'} below {m.threshold}"
                    for m in metrics if not m.passed]
    reasons = [f"on the samples of {proof.samples.file}: {r}" for r in reasons]
    record = SampleJudgement(proof.samples.file, proof.samples.count, not reasons, finite(proof.max_abs_err),
                             len(proof.failures), proof.first_failure(), metrics, by_metric, dict(proof.metrics))
    return record, reasons


class Remembered:
    """A session that runs each distinct feed once: the elementwise check and the task metric of one proof read
    the same outputs (a large case costs seconds per run). Every other attribute is the session's."""

    def __init__(self, sess: Any) -> None:
        self._sess = sess
        self._seen: dict[tuple, list] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)

    def run(self, output_names, feed: dict[str, np.ndarray], *args, **kw) -> list:
        if output_names is not None or args or kw:
            return self._sess.run(output_names, feed, *args, **kw)
        try:
            key = tuple((k, fingerprint(np.asarray(v))) for k, v in sorted(feed.items()))
        except TypeError:  # an object array: run it every time
            return self._sess.run(None, feed)
        if key not in self._seen:
            self._seen[key] = self._sess.run(None, feed)
        return self._seen[key]


def prove(loaded: LoadedModel, name: str, path: Path, refs: Refs, tolerance: Tolerance,
          samples: SampleRefs | None = None, opener: Callable[[Path], Any] | None = None) -> Proof:
    """Parity of ``path`` against PyTorch with the policy for ``name`` on the generated cases and, when given, on
    the user's ``samples`` (where the task metric is then judged: see the module docstring); a failure on the
    generated cases carries its divergence. ``opener``: how the session is opened (a variant's provider options,
    optimize/gpu.py), default: the configured device's."""
    tol, by_elements, by_metric = tolerance_policy(name, tolerance)
    try:
        sess = Remembered(opener(path) if opener is not None else session(path))
    except UsageError as e:
        return Proof(passed=False, reason=e.message, tolerance=tol)
    result: ParityResult = compare(loaded, path, cases=list(refs.cases), tolerance=tol, sess=sess, refs=refs)
    found, kind = task_found(loaded, refs, sess, tolerance)
    metrics = metrics_of(found, task_policy(kind, fallback=by_metric))
    judged = verdict(replace(Accuracy.of_parity(result), varying=found.varying),
                     Policy(tol, by_elements, by_metric and samples is None, COSINE_MIN, TOP1_MIN,
                            fallback=by_metric), metrics=metrics)
    reasons = list(judged.reasons)
    on_samples, more = judge_samples(loaded, name, sess, samples, tolerance) if samples else (None, [])
    err = result.max_abs_err
    found_at, why = _localize(loaded, path, refs, result, tol) if reasons else (None, None)
    return Proof(passed=not reasons and not more, reason="; ".join(reasons + more) or None, tolerance=tol,
                 max_abs_err=float(err) if np.isfinite(err) else None, metrics=metrics, metric=judged.headline,
                 divergence=found_at, divergence_error=why, samples=on_samples,
                 varying=varying_record(found.varying))


def _localize(loaded: LoadedModel, path: Path, refs: Refs, result: ParityResult,
              tol: Tolerance) -> tuple[Divergence | None, str | None]:
    """(where the failing case parts from PyTorch, why localizing it failed)."""
    failing = next((c for c, r in zip(refs.cases, result.cases) if not r.passed), refs.cases[0])
    try:
        return localize.find(loaded, path, failing, tol), None
    except Exception as e:  # noqa: BLE001 - localization is best effort; the failure itself is reported
        return None, short_error(e)


register_judge(MODEL, prove)  # the plain path's judge: parity with PyTorch under the variant's policy
