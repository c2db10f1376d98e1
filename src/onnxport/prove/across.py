"""The ``--compare`` rules judged across the cases, on what varies between the inputs (issue 51).

A rule judged case by case can pass a wrong file when PyTorch's output hardly depends on the input: the logits of a
random-weight classifier are one input-independent vector plus a small varying part, so a ``topk`` or ``cosine``
rule passes any file that keeps the vector; a random-weight detector returns nearly the same boxes for every image,
so matching by IoU pairs any file's boxes. Over every case the parity check ran:

* ``topk``: the rows centred by PyTorch's mean over the inputs must rank the same first class, and the same top-k
  (ties within the tolerance at the output's scale are no disagreement), where the centred ranking can tell;
* ``cosine``: the lowest cosine of the centred rows must reach ``1 - max(rtol, 1e-4)`` where they can tell;
* ``detections``: the match by IoU can tell only when PyTorch's detections of one input do not match another
  input's; where they do, every part of the group is compared element by element at its own scale.

A centred metric that cannot tell falls back to every element within the tolerance at the output's own scale
(:func:`~onnxport.prove.compare.own_tolerance`), and says so (``cannot_tell``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxport.core.records import Tolerance
from onnxport.prove.compare import detection_groups, detection_shaped, own_tolerance
from onnxport.prove.detections import DetectionParams, match_detections
from onnxport.prove.varying import COSINE, TOP1, centred

Pairs = Mapping[str, tuple[np.ndarray, np.ndarray]]  # one case: output name -> (PyTorch's, the file's)
MATCHES_ANOTHER = "PyTorch's detections of one input match those of another (the match by IoU cannot tell)"


@dataclass(frozen=True)
class Across:
    """One output's rule judged over the cases: its centred figures (or the fallback's), whether it passed."""

    rule: str
    passed: bool
    figures: dict = field(default_factory=dict)
    cannot_tell: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    fallback: bool = False  # judged element by element at the output's own scale: the rule's metric cannot tell

    def to_dict(self) -> dict:
        return {"compare": self.rule, "passed": self.passed, **self.figures, "cannot_tell": dict(self.cannot_tell),
                "judged_by": "elementwise at its own scale" if self.fallback else "what varies", "problem": self.problem}


def centred_cosine_min(tol: Tolerance) -> float:
    """The gate of a centred cosine at tolerance ``tol``."""
    return 1.0 - max(tol.rtol, 1e-4)


def judge_across(rules: Mapping[str, str], cases: Sequence[Pairs], tol: Tolerance,
                 params: DetectionParams | None = None) -> dict[str, Across]:
    """Per output whose rule is ``topk``, ``cosine`` or ``detections`` (``rules``), its judgement over ``cases``
    (the cases both sides ran, PyTorch's output first; see the module docstring)."""
    out: dict[str, Across] = {}
    for name, rule in rules.items():
        pairs = [c[name] for c in cases if name in c and np.issubdtype(np.asarray(c[name][0]).dtype, np.floating)]
        if rule in ("topk", "cosine") and pairs:
            out[name] = _ranked(rule, pairs, tol)
    names = [n for n, r in rules.items() if r == "detections"]
    for group in detection_groups(names).values():
        runs = [{part: c[n] for part, n in group.items()} for c in cases if all(n in c for n in group.values())
                and detection_shaped(group, {n: c[n][0] for n in group.values()})]
        if len(runs) >= 2:
            found = _detections(runs, tol, params or DetectionParams())
            out.update({n: found for n in group.values()})
    return out


def _ranked(rule: str, pairs: list[tuple[np.ndarray, np.ndarray]], tol: Tolerance) -> Across:
    """A ``topk`` or ``cosine`` output over the cases, centred by PyTorch's mean (rows: the last axis)."""
    same = [(r, g) for r, g in pairs if np.shape(r) == np.shape(g)]
    v = centred([r for r, _ in same], [g for _, g in same], tol, flat=False, top=rule == "topk")
    figures = {k: x for k, x in v.to_dict().items() if k != "cannot_tell"}
    metric = TOP1 if rule == "topk" else COSINE
    if v.tells(metric):
        if rule == "topk":
            passed = v.top1 is not None and v.top1 >= 1.0 and (v.topk is None or v.topk >= 1.0)
            problem = None if passed else (f"centred top-1 agrees on {v.top1:.1%} of the varying rows, top-{v.k} "
                                           f"on {v.topk or 0:.1%}")
        else:
            gate = centred_cosine_min(tol)
            passed = v.cosine is not None and v.cosine >= gate
            problem = None if passed else f"centred cosine {v.cosine:.4f} below {gate:.4f}"
    elif v.within is None:
        passed, problem = False, "judged by nothing that can tell: " + v.cannot_tell.get(metric, "no finite output")
    else:
        passed = v.within >= 1.0
        problem = None if passed else (f"the centred {metric} cannot tell ({v.cannot_tell[metric]}), and "
                                       f"{1 - v.within:.1%} of the elements are outside the tolerance at the "
                                       "output's own scale")
    return Across(rule, passed, figures, dict(v.cannot_tell), problem, fallback=not v.tells(metric))


def _detections(runs: list[dict[str, tuple[np.ndarray, np.ndarray]]], tol: Tolerance,
                params: DetectionParams) -> Across:
    """A detection group over the cases: whether the match by IoU can tell (PyTorch's detections of each input
    differ from another input's); where it cannot, the detections are paired element by element at the boxes'
    own scale (every corner and score within the tolerance, unpaired ones borderline: ``strict``)."""
    refs = [{part: np.asarray(r) for part, (r, _) in run.items()} for run in runs]
    if not all(match_detections(refs[i], refs[i - 1 if i else 1], tol, params).passed for i in range(len(refs))):
        return Across("detections", True)
    bad: list[str] = []
    for i, run in enumerate(runs):
        ref, got = {p: np.asarray(r) for p, (r, _) in run.items()}, {p: np.asarray(g) for p, (_, g) in run.items()}
        m = match_detections(ref, got, own_tolerance(ref["boxes"], tol), params, strict=True)
        if not m.passed:
            bad.append(f"case {i}: " + "; ".join(filter(None, (m.problem(p) for p in ("boxes", "masks", "keypoints"))))
                       if m.unmatched or m.mask_failed or m.keypoint_failed else f"case {i}")
    within = 1.0 - len(bad) / len(runs)
    problem = None if not bad else (f"{MATCHES_ANOTHER}; paired element by element at the boxes' scale, "
                                    f"{len(bad)} of {len(runs)} cases differ (first: {bad[0]})")
    return Across("detections", not bad, {"cases_within_own_scale": round(within, 6)},
                  {"detections": MATCHES_ANOTHER}, problem, fallback=True)
