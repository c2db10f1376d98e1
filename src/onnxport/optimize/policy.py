"""The tolerance policy (docs/architecture.md, "Policies"), the task metrics, and the proof of one variant against PyTorch.

* fp32-graph variants (``slim``, ``ort``, ``fused``): elementwise with the fp32 tolerance;
* ``fp16``: elementwise with atol/rtol 1e-2 *and* the task metric;
* ``int8`` (and ``fused+int8``): the task metric only — cosine similarity of the outputs (of the mean-pooled
  sentence embedding for Hugging Face encoders with ``last_hidden_state`` and an ``attention_mask``), plus
  top-1 agreement for classifiers (a 2-D logits output with more than one class).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.records import FP16, Failure, ParityResult, Tolerance
from onnxport.optimize.context import Refs
from onnxport.optimize.graph import short_error
from onnxport.optimize.result import COSINE_MIN, TOP1_MIN, Metric, Proof
from onnxport.prove import localize
from onnxport.prove.parity import compare
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

# --------------------------------------------------------------------------- task metric


def task_kind(loaded: LoadedModel, ref: Sequence[np.ndarray]) -> str:
    """'sentence-embedding' (mean-pooled, masked), 'classifier' (2-D logits) or 'cosine' (outputs as rows)."""
    names = [s.name for s in loaded.inputs]
    if "last_hidden_state" in loaded.output_names and "attention_mask" in names:
        return "sentence-embedding"
    first = ref[0] if ref else None
    if first is not None and first.ndim == 2 and first.shape[1] > 1 and np.issubdtype(first.dtype, np.floating):
        return "classifier"
    return "cosine"


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of ``hidden`` [B,S,H] over the positions where ``mask`` [B,S] is set."""
    m = mask.astype(np.float64)[..., None]
    return (hidden.astype(np.float64) * m).sum(1) / np.maximum(m.sum(1), 1e-9)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows (1.0 where both rows are ~zero)."""
    a = a.reshape(a.shape[0], -1).astype(np.float64) if a.ndim else a.reshape(1, 1).astype(np.float64)
    b = b.reshape(b.shape[0], -1).astype(np.float64) if b.ndim else b.reshape(1, 1).astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = (a * b).sum(1) / np.maximum(na * nb, 1e-30)
    both_zero = (na < 1e-12) & (nb < 1e-12)
    cos[both_zero] = 1.0
    cos[~np.isfinite(cos)] = -1.0
    return cos


def _compared(loaded: LoadedModel, kind: str, tensors: Sequence, ref: Sequence[np.ndarray],
              got_by: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(reference, ONNX) arrays the metric compares for one case."""
    if kind == "sentence-embedding":
        i = loaded.output_names.index("last_hidden_state")
        mask = tensors[[s.name for s in loaded.inputs].index("attention_mask")].numpy()
        return mean_pool(ref[i], mask), mean_pool(np.asarray(got_by["last_hidden_state"]), mask)
    return ref[0], np.asarray(got_by[loaded.output_names[0]])


def task_metrics(loaded: LoadedModel, refs: Refs, sess, cosine_min: float = COSINE_MIN,
                 top1_min: float = TOP1_MIN) -> tuple[Metric, ...]:
    """Cosine (worst row over the matrix) and, for classifiers, top-1 agreement of ``sess`` against PyTorch."""
    feed = FeedMap.of(loaded.inputs, sess)
    onnx_out = [o.name for o in sess.get_outputs()]
    by_name = all(n in onnx_out for n in loaded.output_names)
    cosines: list[np.ndarray] = []
    agree: list[np.ndarray] = []
    kind = None
    failed = False
    for tensors, ref in zip(refs.inputs, refs.outputs):
        if ref is None:
            continue
        kind = kind or task_kind(loaded, ref)
        try:
            got = sess.run(None, feed(tensors))
        except Exception:  # noqa: BLE001 - counted as a failed metric
            failed = True
            continue
        got_by = dict(zip(onnx_out, got)) if by_name else dict(zip(loaded.output_names, got))
        r, g = _compared(loaded, kind, tensors, ref, got_by)
        if r.shape != g.shape:
            failed = True
            continue
        cosines.append(row_cosines(r, g))
        if kind == "classifier":
            agree.append(r.argmax(-1) == g.argmax(-1))
    name = "cosine (mean-pooled embedding)" if kind == "sentence-embedding" else "cosine"
    if failed or not cosines:
        out = [Metric(name, None, cosine_min, False)]
        if kind == "classifier":
            out.append(Metric("top1_agreement", None, top1_min, False))
        return tuple(out)
    cmin = float(np.concatenate(cosines).min())
    out = [Metric(name, cmin, cosine_min, cmin >= cosine_min)]
    if kind == "classifier":
        a = float(np.concatenate(agree).mean())
        out.append(Metric("top1_agreement", a, top1_min, a >= top1_min))
    return tuple(out)


def metric_margin(metrics: Sequence[Metric]) -> float:
    """How far the worst metric is above its threshold (negative: failing)."""
    return min((m.value - m.threshold) if m.value is not None else -1.0 for m in metrics)


def _headline(metrics: Sequence[Metric]) -> dict | None:
    """The entry's ``metric``: the failing one if any, else the first."""
    if not metrics:
        return None
    bad = [m for m in metrics if not m.passed]
    return (bad[0] if bad else metrics[0]).to_dict()


# --------------------------------------------------------------------------- proving


def tolerance_policy(name: str, tolerance: Tolerance) -> tuple[Tolerance, bool, bool]:
    """(elementwise tolerance, elementwise decides, metric decides) for a variant name."""
    if "int8" in name:
        return tolerance, False, True
    if "fp16" in name:
        return Tolerance(max(tolerance.atol, FP16.atol), max(tolerance.rtol, FP16.rtol)), True, True
    return tolerance, True, False


def _reasons(result: ParityResult, metrics: Sequence[Metric], tol: Tolerance, by_elements: bool,
             by_metric: bool) -> list[str]:
    """Why the variant fails under its policy (empty: it passes)."""
    reasons = []
    if by_elements and not result.passed:
        bad = [c for c in result.cases if not c.passed]
        first = bad[0] if bad else None
        reasons.append(f"{len(bad)} of {len(result.cases)} cases outside atol {tol.atol:g} / rtol {tol.rtol:g}"
                       + (f"; first '{first.label}': {first.error or 'outputs differ'}" if first else ""))
    if by_metric:
        for m in metrics:
            if not m.passed:
                val = "n/a" if m.value is None else f"{m.value:.4f}"
                reasons.append(f"{m.name} {val} below {m.threshold}")
    ort_failed = [c.error for c in result.cases if c.failure is Failure.ORT_RUN]
    if not by_elements and ort_failed:
        reasons.append(ort_failed[0])
    return reasons


def prove(loaded: LoadedModel, name: str, path: Path, refs: Refs, tolerance: Tolerance) -> Proof:
    """Parity of ``path`` against PyTorch with the policy for ``name``; a failure carries its divergence."""
    tol, by_elements, by_metric = tolerance_policy(name, tolerance)
    try:
        sess = session(path)
    except UsageError as e:
        return Proof(passed=False, reason=e.message, tolerance=tol.to_dict())
    result: ParityResult = compare(loaded, path, cases=list(refs.cases), tolerance=tol, sess=sess)
    metrics = task_metrics(loaded, refs, sess)
    reasons = _reasons(result, metrics, tol, by_elements, by_metric)
    passed = not reasons
    err = result.max_abs_err
    return Proof(passed=passed, reason="; ".join(reasons) or None, tolerance=tol.to_dict(),
                 max_abs_err=float(err) if np.isfinite(err) else None, metrics=metrics, metric=_headline(metrics),
                 divergence=None if passed else _localize(loaded, path, refs, result, tol))


def _localize(loaded: LoadedModel, path: Path, refs: Refs, result: ParityResult, tol: Tolerance) -> dict | None:
    failing = next((c for c, r in zip(refs.cases, result.cases) if not r.passed), refs.cases[0])
    try:
        d = localize.find(loaded, path, failing, tol)
    except Exception as e:  # noqa: BLE001 - localization is best effort; the failure itself is reported
        return {"error": short_error(e)}
    return d.to_dict() if d else None
