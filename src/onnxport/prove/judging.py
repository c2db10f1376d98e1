"""Run, then judge: one comparison and one verdict for every model family's variants.

Each family first runs its backend over its cases (:func:`run_cases` → :class:`RunResults`, as Polygraphy's
``RunResults``), then compares that run with PyTorch's by one function, :func:`compare_accuracy`:

* elementwise within a tolerance (:class:`Accuracy` ``outside``),
* the lowest cosine (flattened per case, or per row),
* top-1 agreement of the last axis' argmax.

Greedy tokens are compared by :func:`token_agreement`. :func:`verdict` applies a variant's :class:`Policy` to
what was found (elementwise, by the task metrics at the gates, by greedy tokens) with the same words for every
family. The plain model's elementwise check keeps its per-output rules (detections, top-k, masks:
:mod:`onnxport.prove.parity`) and hands its result over as an :class:`Accuracy` (:meth:`Accuracy.of_parity`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from onnxport.core.records import FP16, FP32, TF32, Failure, Metric, ParityResult, Tolerance
from onnxport.prove.compare import row_cosines
from onnxport.prove.varying import COSINE, RAW_TOP1, TOP1, Varying, centred

__all__ = ["Accuracy", "Policy", "RunResults", "Tokens", "Verdict", "compare_accuracy", "cosine", "run_cases",
           "token_agreement", "tokens_untold", "varying_record", "verdict"]

Outputs = tuple[np.ndarray, ...]


@dataclass(frozen=True)
class RunResults:
    """One backend's outputs over the cases, in order: ``outputs[i]`` the arrays of case ``labels[i]`` (None: it
    failed there, ``errors[i]`` says why)."""

    labels: tuple[str, ...]
    outputs: tuple[Outputs | None, ...]
    errors: tuple[str | None, ...] = ()

    def error(self, i: int) -> str | None:
        return self.errors[i] if i < len(self.errors) else None

    @classmethod
    def of(cls, labels: Sequence[Any], outputs: Sequence[Sequence[np.ndarray] | None]) -> RunResults:
        """Outputs already computed (PyTorch's references); labels of any kind are written as text."""
        return cls(tuple(_label(x) for x in labels),
                   tuple(None if o is None else tuple(np.asarray(a) for a in o) for o in outputs))


def _label(x: Any) -> str:
    if isinstance(x, str):
        return x
    label = getattr(x, "label", None)
    if isinstance(label, str):
        return label
    return ", ".join(map(str, x)) if isinstance(x, tuple) else str(x)


def run_cases(run: Callable[[Any], Sequence[np.ndarray]], feeds: Sequence[Any], labels: Sequence[Any]) -> RunResults:
    """``run(feed)`` on every case in order; a case it fails on is recorded with why (``Type: message``)."""
    outputs: list[Outputs | None] = []
    errors: list[str | None] = []
    for feed in feeds:
        try:
            outputs.append(tuple(np.asarray(a) for a in run(feed)))
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - a case the backend fails on is judged as failed
            outputs.append(None)
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    return RunResults(tuple(_label(x) for x in labels), tuple(outputs), tuple(errors))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two arrays, flattened (two zero arrays: 1 when equal; a non-finite one: -1, as
    :func:`~onnxport.prove.compare.row_cosines` gives, so NaN or inf outputs never pass a cosine gate)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return -1.0
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    found = float(a @ b / norm) if norm else float(np.array_equal(a, b))
    return found if np.isfinite(found) else -1.0


@dataclass(frozen=True)
class Accuracy:
    """What comparing a run with PyTorch's found. ``outside``: (case, why) of each case beyond the tolerance or
    not run; ``failed``: those the backend could not run at all; ``cosine`` the lowest, ``top1`` the share of
    equal argmaxes (None: not compared, or nothing could be)."""

    cases: int
    outside: tuple[tuple[str, str], ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    max_abs_err: float = 0.0
    cosine: float | None = None
    top1: float | None = None
    max_rel_err: float = 0.0  # the largest |got - want| / |want| (|want| at least 1e-12) of the cases compared
    untold: str | None = None  # every case within, yet the comparison proves nothing (why: outputs that cannot tell)
    varying: Varying | None = None  # the metrics on what varies between the inputs (prove.varying), None: not computed

    @property
    def within(self) -> bool:
        return not self.outside and self.untold is None

    @classmethod
    def of_parity(cls, result: ParityResult) -> Accuracy:
        """The elementwise finding of :func:`onnxport.prove.parity.compare` (its per-output rules applied)."""
        bad = tuple((c.label, c.error or "outputs differ") for c in result.cases if not c.passed)
        failed = tuple((c.label, c.error or "onnxruntime fails") for c in result.cases if c.failure is Failure.ORT_RUN)
        err = result.max_abs_err
        untold = None
        if not result.passed and not bad:
            untold = ("; ".join(f"{name}: {why}" for name, why in result.cannot_tell.items())
                      or ("no case compared" if not result.cases else "the parity check did not pass"))
        return cls(len(result.cases), bad, failed, float(err) if np.isfinite(err) else float("inf"), untold=untold)


def compare_accuracy(got: RunResults, want: RunResults, tolerance: Tolerance | None, *,
                     cosine_of: int | None = 0, rows: bool = False, top1: bool = False) -> Accuracy:
    """``got`` against ``want`` case by case: every output within ``tolerance`` (None: not judged elementwise),
    the lowest cosine of output ``cosine_of`` (per case flattened, or per row with ``rows``; None: none) and,
    with ``top1``, the share of rows whose last-axis argmax is PyTorch's. A case either side lacks, or whose
    shapes differ, is outside (and spoils the metrics: they become None). ``varying``: the same metrics on the
    rows centred by PyTorch's mean over the inputs (per batch row with ``rows``, else per position of the last
    axis, ranked when ``top1`` or not ``rows``), each saying whether it can tell (:mod:`onnxport.prove.varying`),
    at ``tolerance`` (None: fp32)."""
    outside: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    worst = rel = 0.0
    cosines: list[float] = []
    hits: list[np.ndarray] = []
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    spoilt = False
    for i, label in enumerate(want.labels):
        ref = want.outputs[i]
        if ref is None:
            continue  # PyTorch failed there: nothing to judge against
        out = got.outputs[i] if i < len(got.outputs) else None
        if out is None:
            why = got.error(i) or "not run"
            outside.append((label, why))
            failed.append((label, why))
            spoilt = True
            continue
        shapes = [(g.shape, w.shape) for g, w in zip(out, ref) if g.shape != w.shape]
        if len(out) != len(ref) or shapes:
            g, w = shapes[0] if shapes else (len(out), len(ref))
            outside.append((label, f"shape {list(g)} where PyTorch gives {list(w)}" if shapes
                            else f"{g} outputs where PyTorch gives {w}"))
            spoilt = True
            continue
        case_worst, within = 0.0, True
        for g, w in zip(out, ref):
            w64 = np.asarray(w, np.float64)
            diff = np.abs(np.asarray(g, np.float64) - w64)
            case_worst = max(case_worst, float(diff.max(initial=0.0)) if np.all(np.isfinite(diff)) else float("inf"))
            rel = max(rel, float((diff / np.maximum(np.abs(w64), 1e-12)).max(initial=0.0)))
            if tolerance is not None:
                within = within and bool(np.all(tolerance.within(diff, w64)))
        worst = max(worst, case_worst)
        if not within:
            outside.append((label, f"max abs err {case_worst:.3g}"))
        if cosine_of is not None:
            g, w = out[cosine_of], ref[cosine_of]
            cosines.append(float(row_cosines(w, g).min()) if rows else cosine(g, w))
            pairs.append((np.asarray(w), np.asarray(g)))
        if top1:
            g, w = out[cosine_of or 0], ref[cosine_of or 0]
            hits.append(np.asarray(w).argmax(-1) == np.asarray(g).argmax(-1))
    lowest = None if spoilt or not cosines else min(cosines)
    share = None if spoilt or not hits else float(np.concatenate([np.ravel(h) for h in hits]).mean())
    varying = None
    if pairs and not spoilt and all(np.issubdtype(w.dtype, np.floating) for w, _ in pairs):
        varying = centred([w for w, _ in pairs], [g for _, g in pairs], tolerance or FP32, flat=rows,
                          top=top1 or not rows)
    return Accuracy(len(want.labels), tuple(outside), tuple(failed), worst, lowest, share, rel, varying=varying)


@dataclass(frozen=True)
class Tokens:
    """Greedy tokens against PyTorch's: the share equal, and how many steps (every row) agree before the first
    that differs, of ``total``."""

    share: float
    steps: int
    total: int
    untold: str | None = None  # why PyTorch's tokens cannot tell a right file from a wrong one (tokens_untold)

    @property
    def equal(self) -> bool:
        return self.steps == self.total


def token_agreement(got: np.ndarray, want: np.ndarray) -> Tokens:
    """``got`` against ``want`` ([rows, steps] token ids; a shorter ``got`` differs where it stops)."""
    got, want = np.asarray(got), np.asarray(want)
    n = min(got.shape[-1], want.shape[-1])
    same = np.all(got[..., :n] == want[..., :n], axis=0) if got.ndim > 1 else got[:n] == want[:n]
    steps = int(same.argmin()) if not same.all() else int(n)
    equal = float(np.sum(got[..., :n] == want[..., :n])) / max(want.size, 1)
    return Tokens(equal, steps, int(want.shape[-1]), tokens_untold(want))


def tokens_untold(want: np.ndarray) -> str | None:
    """Why PyTorch's greedy tokens ``want`` ([prompts, steps]) cannot tell a right file from a wrong one: one token
    at every step for every prompt, or the same tokens for every prompt (they do not depend on it); None: they can."""
    want = np.asarray(want)
    if want.size == 0:
        return "PyTorch generates no token"
    first = want.reshape(-1)[0]
    if bool((want == first).all()):
        return f"PyTorch generates token {first} at every step for every prompt"
    if want.ndim > 1 and want.shape[0] > 1 and bool((want == want[:1]).all()):
        return f"PyTorch generates the same {want.shape[-1]} tokens for every one of the {want.shape[0]} prompts"
    return None


@dataclass(frozen=True)
class Policy:
    """How a variant is judged: every case within ``tolerance`` (``elementwise``), the task metrics at the
    gates (``metric``: cosine and, where compared, top-1) and greedy tokens equal on every step (``tokens``).
    ``cosine_name`` / ``top1_name``: what the family calls its metrics in the report."""

    tolerance: Tolerance
    elementwise: bool
    metric: bool
    cosine_min: float
    top1_min: float
    tokens: bool = False
    cosine_name: str = "cosine"
    top1_name: str = "top1_agreement"
    top1: bool = False  # the family compares top-1 (classifiers, decoders): a missing value then fails
    fallback: bool = False  # a centred metric that cannot tell falls back to elementwise at the output's scale

    def tolerance_name(self) -> str:
        """The tolerance in words: "fp32", "fp16", "tf32" or "the given"."""
        named = {FP32: "fp32", FP16: "fp16", TF32: "tf32"}
        return named.get(self.tolerance, "given")


@dataclass(frozen=True)
class Verdict:
    """Whether a variant passes under its policy, why not, and its task metrics (report ``metrics``)."""

    passed: bool
    reasons: tuple[str, ...]
    metrics: tuple[Metric, ...]

    @property
    def reason(self) -> str | None:
        return "; ".join(self.reasons) or None

    @property
    def headline(self) -> Metric | None:
        """The failing metric if any, else the first."""
        return next((m for m in self.metrics if not m.passed), self.metrics[0] if self.metrics else None)


WITHIN = "share within the tolerance at the output's scale"  # the fallback of a centred metric that cannot tell


def metrics_of(found: Accuracy, policy: Policy) -> tuple[Metric, ...]:
    """The task metrics ``found`` shows against the policy's gates (a value None fails): the raw ones, then those
    of the rows centred by PyTorch's mean over the inputs where they can tell (``NAME (centred)``) and, with
    ``policy.fallback``, the share of elements within the tolerance at the output's own scale where one cannot."""
    out = [Metric(policy.cosine_name, found.cosine, policy.cosine_min,
                  found.cosine is not None and found.cosine >= policy.cosine_min)]
    if policy.top1 or found.top1 is not None:
        out.append(Metric(policy.top1_name, found.top1, policy.top1_min,
                          found.top1 is not None and found.top1 >= policy.top1_min))
    return tuple(out) + centred_metrics(found.varying, policy)


def centred_metrics(v: Varying | None, policy: Policy) -> tuple[Metric, ...]:
    """The centred cosine and top-1 of ``v`` that can tell, at the policy's gates; with ``policy.fallback``, the
    share within the tolerance at the output's scale (gate: every element) when one of them cannot."""
    if v is None:
        return ()
    out = []
    if v.cosine is not None:
        out.append(Metric(f"{policy.cosine_name} (centred)", v.cosine, policy.cosine_min, v.cosine >= policy.cosine_min))
    if v.top1 is not None and (policy.top1 or v.k):
        out.append(Metric(f"{policy.top1_name} (centred)", v.top1, policy.top1_min, v.top1 >= policy.top1_min))
    untold = COSINE in v.cannot_tell or (TOP1 in v.cannot_tell and policy.top1)
    if policy.fallback and untold and v.within is not None:
        out.append(Metric(WITHIN, v.within, 1.0, v.within >= 1.0))
    return tuple(out)


def cannot_tell(v: Varying | None) -> dict[str, str]:
    """What cannot tell in ``v``, by the report's metric words (raw top-1 included: it stays in the report)."""
    if v is None:
        return {}
    words = {COSINE: "cosine (centred)", TOP1: "top-1 (centred)", RAW_TOP1: "top-1 (raw)"}
    return {words[k]: why for k, why in v.cannot_tell.items() if k in words}


def varying_record(v: Varying | None, tokens: Tokens | None = None) -> dict | None:
    """report.json ``variants[].varying``: the centred figures and what cannot tell (:mod:`onnxport.prove.varying`),
    PyTorch's greedy tokens included (``greedy tokens``: why they cannot tell)."""
    untold = None if tokens is None else tokens.untold
    if v is None and untold is None:
        return None
    out = {**(v.to_dict() if v is not None else {}), "cannot_tell": cannot_tell(v)}
    if untold is not None:
        out["cannot_tell"]["greedy tokens"] = untold
    return out


def verdict(found: Accuracy, policy: Policy, tokens: Tokens | None = None,
            metrics: Sequence[Metric] | None = None) -> Verdict:
    """Apply ``policy`` to ``found`` (and the greedy ``tokens``, where the family compares them): the same
    reasons, in the same words, for every family. ``metrics``: the task metrics when computed elsewhere (default:
    :func:`metrics_of`)."""
    metrics = tuple(metrics) if metrics is not None else metrics_of(found, policy)
    reasons: list[str] = []
    tol = policy.tolerance
    if policy.elementwise and found.outside:
        label, why = found.outside[0]
        reasons.append(f"outside the {policy.tolerance_name()} tolerance (atol {tol.atol:g} / rtol {tol.rtol:g}) on "
                       f"{len(found.outside)} of {found.cases} cases; first '{label}': {why}")
    if policy.elementwise and found.untold is not None:
        reasons.append(f"the comparison cannot tell a right file from a wrong one ({found.untold})")
    if policy.metric:
        reasons += [f"{m.name} {'n/a' if m.value is None else f'{m.value:.4f}'} below {m.threshold}"
                    + (" (a centred metric cannot tell: " + "; ".join(f"{k}: {w}" for k, w in cannot_tell(
                        found.varying).items()) + ")" if m.name == WITHIN else "")
                    for m in metrics if not m.passed]
        if policy.fallback and found.varying is not None and found.varying.nothing_tells:
            reasons.append("judged by nothing that can tell: " + "; ".join(
                f"{k}: {w}" for k, w in cannot_tell(found.varying).items()))
            tokens = None if tokens is None else replace(tokens, untold=None)  # said: no second reason
    if not policy.elementwise and found.failed:
        reasons.append(found.failed[0][1])
    if policy.tokens and tokens is not None and not tokens.equal:
        reasons.append(f"greedy tokens differ from PyTorch's at step {tokens.steps} of {tokens.total}")
    if tokens is not None and tokens.untold is not None and (policy.tokens or policy.top1):
        metrics, more = _tokens_fallback(found, policy, tokens.untold, metrics)
        reasons += more
    return Verdict(not reasons, tuple(reasons), metrics)


def _tokens_fallback(found: Accuracy, policy: Policy, untold: str, metrics: tuple[Metric, ...]
                     ) -> tuple[tuple[Metric, ...], list[str]]:
    """Where PyTorch's greedy tokens cannot tell (``untold``), the check that can: the logits' centred cosine
    (already a gate of a metric policy where it can tell), else every logit within the tolerance at its own
    scale; (the metrics with that one, the reasons it fails or that nothing can tell)."""
    v = found.varying
    if v is None or v.within is None:
        rest = "".join(f"; {k}: {w}" for k, w in cannot_tell(v).items())
        return metrics, [f"judged by nothing that can tell: greedy tokens: {untold}{rest}"]
    if (policy.metric and v.cosine is not None) or any(m.name == WITHIN for m in metrics):
        return metrics, []
    within = Metric(WITHIN, v.within, 1.0, v.within >= 1.0)
    why = [] if within.passed else [f"{WITHIN} {v.within:.4f} below 1.0 (greedy tokens cannot tell: {untold})"]
    return (*metrics, within), why
