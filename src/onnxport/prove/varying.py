"""Task metrics judged on what varies between the inputs (issue 51).

The logits of a random-weight network are one input-independent vector plus a small part that depends on the
input: PyTorch predicts one class for every input, and a cosine over raw logits is ~1 for any file that keeps the
constant vector. Neither can tell a right variant from a wrong one. Here every row is centred by the reference's
(PyTorch's) mean over the inputs before the cosine and the top-1 / top-k agreement:

* ``cosine``: the lowest cosine of the centred rows, over the rows that differ from the mean by more than the
  tolerance at the output's own scale (a near-constant row says nothing);
* ``top1`` / ``topk``: agreement of the centred rows' rankings, over the rows whose centred top-1 is decided
  (not tied within the tolerance);
* ``within``: the share of elements within the tolerance at the output's own scale
  (:func:`~onnxport.prove.compare.own_tolerance`): the check a gate falls back to when a centred metric cannot tell.

A metric whose reference does not vary enough (fewer than two rows, every row within the tolerance of the mean,
one centred class) is named in ``cannot_tell`` with why, and has no value. ``raw_top1`` says whether the raw
top-1 can tell at all (PyTorch predicts more than one class).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxport.core.records import FP32, Tolerance
from onnxport.prove.compare import own_tolerance, row_cosines, topk_agreement

COSINE, TOP1, TOPK, RAW_TOP1 = "cosine", "top1", "topk", "raw_top1"


@dataclass(frozen=True)
class Varying:
    """The centred figures of one comparison (see the module docstring); None: not computed or cannot tell."""

    rows: int
    cosine: float | None = None
    top1: float | None = None
    topk: float | None = None
    k: int = 0
    within: float | None = None
    classes: int = 0  # the distinct raw top-1 classes PyTorch predicts over the rows
    told_rows: int = 0  # rows that differ from the mean by more than the tolerance
    cannot_tell: dict[str, str] = field(default_factory=dict)

    def tells(self, metric: str) -> bool:
        return metric not in self.cannot_tell

    @property
    def nothing_tells(self) -> bool:
        """No centred metric can tell, and the elementwise fallback cannot either (the reference never varies)."""
        return COSINE in self.cannot_tell and self.within is None

    def to_dict(self) -> dict:
        def r(x: float | None) -> float | None:
            return None if x is None else round(float(x), 6)

        return {"rows": self.rows, "cosine_centred": r(self.cosine), "top1_centred": r(self.top1),
                "topk_centred": r(self.topk), "k": self.k, "within_own_scale": r(self.within),
                "reference_classes": self.classes, "varying_rows": self.told_rows,
                "cannot_tell": dict(self.cannot_tell)}


def _rows(a: np.ndarray, flat: bool) -> np.ndarray:
    """``a`` as 2-D rows: one per batch element (``flat``) or one per position of the last axis."""
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.ndim == 1:
        return a.reshape(1, -1)
    return a.reshape(a.shape[0], -1) if flat else a.reshape(-1, a.shape[-1])


def centred(refs: Sequence[np.ndarray], gots: Sequence[np.ndarray], tol: Tolerance = FP32, *, flat: bool = True,
            top: bool = False, k: int = 5) -> Varying:
    """The centred figures of ``gots`` against ``refs`` (one array per case, matching shapes; rows grouped by
    width and centred by the reference's mean over the group's rows). ``top``: rank the rows (classifier logits,
    a decoder's next-token logits) too."""
    groups: dict[int, tuple[list, list]] = {}
    for r, g in zip(refs, gots):
        rr, gg = _rows(r, flat), _rows(g, flat)
        if rr.shape != gg.shape or rr.size == 0:
            continue
        groups.setdefault(rr.shape[1], ([], []))[0].append(rr)
        groups[rr.shape[1]][1].append(gg)
    cos: list[np.ndarray] = []
    hits: list[np.ndarray] = []
    topks: list[tuple[float, int]] = []
    within_n = within_of = 0
    classes: set[int] = set()
    told = decided_classes = 0
    centred_classes: set[int] = set()
    rows = 0
    kk = 0
    for ref_list, got_list in groups.values():
        ref, got = np.concatenate(ref_list), np.concatenate(got_list)
        rows += len(ref)
        own = own_tolerance(ref, tol)
        if not (np.all(np.isfinite(ref))):
            continue
        ok = own.allows(got, ref)
        within_n, within_of = within_n + int(ok.sum()), within_of + ok.size
        if top and ref.shape[1] > 1:
            classes |= set(np.argmax(ref, 1).tolist())
        if len(ref) < 2:
            continue
        mu = ref.mean(0)
        rc, gc = ref - mu, got - mu
        varies = ~np.all(own.within(np.abs(rc), ref), axis=1)
        told += int(varies.sum())
        if not varies.any():
            continue
        cos.append(row_cosines(rc[varies], gc[varies]))
        if top and ref.shape[1] > 1:
            order = np.argsort(-rc[varies], axis=1, kind="stable")
            first = np.take_along_axis(rc[varies], order[:, :1], 1)[:, 0]
            second = np.take_along_axis(rc[varies], order[:, 1:2], 1)[:, 0]
            top_ref = np.take_along_axis(ref[varies], order[:, :1], 1)[:, 0]
            decided = ~own.within(first - second, top_ref)
            if decided.any():
                r_d, g_d = rc[varies][decided], gc[varies][decided]
                best = np.argmax(g_d, 1)
                gap = r_d[np.arange(len(r_d)), order[decided, 0]] - r_d[np.arange(len(r_d)), best]
                hits.append((best == order[decided, 0]) | own.within(gap, top_ref[decided]))
                centred_classes |= set(order[decided, 0].tolist())
                decided_classes += int(decided.sum())
                t = topk_agreement(r_d, g_d, own, k)
                kk = t["k"]
                topks.append((t["topk_agree"], len(r_d)))
    why: dict[str, str] = {}
    low = f"PyTorch's rows differ from their mean over the {rows} input rows by no more than the tolerance"
    if not cos:
        why[COSINE] = "fewer than two input rows to centre" if rows < 2 else low
    if top:
        if not hits or len(centred_classes) < 2 or decided_classes < 2:
            why[TOP1] = why[TOPK] = why.get(COSINE) or "the centred reference ranks one class first, or ties"
        if len(classes) < 2:
            why[RAW_TOP1] = f"PyTorch predicts one class for all {rows} rows"
    top1 = None if TOP1 in why or not hits else float(np.concatenate(hits).mean())
    topk = None if TOPK in why or not topks else sum(a * n for a, n in topks) / sum(n for _, n in topks)
    return Varying(rows, None if COSINE in why else float(np.concatenate(cos).min()), top1, topk, kk if top else 0,
                   within_n / within_of if within_of else None, len(classes), told, why)
