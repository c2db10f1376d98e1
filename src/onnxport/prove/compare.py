"""How one output of the ONNX model is judged against PyTorch's: elementwise (``exact``), or by what the output
means when elementwise is the wrong question — ``detections`` matched by IoU (their number depends on the data; their
masks by the IoU of the binarized masks, their keypoints by distance relative to the box), ``topk`` agreement for
classifier scores, ``cosine`` for embeddings. Three refinements apply to every rule (see :func:`judge`): the index
outputs of topk/sort/argmax are judged tie-aware (:func:`index_agreement`), positions an attention mask leaves
undefined are not compared (:func:`undefined_positions`), and a case whose inputs were scaled up is judged with a
tolerance that scales with the output's magnitude (:func:`magnitudes`).

What a task metric compares (:func:`task_kind`: classifier logits, the mean-pooled embedding of an encoder) and the
row cosines live here too: the proof on the user's samples and the variants' policy both read them.

The rule of each output is resolved once after loading (:func:`resolve`: the user's ``--compare NAME=KIND``
over what the outputs look like) and kept in ``LoadedModel.compare``; parity applies it on every case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.records import Tolerance, finite
from onnxport.prove.detections import (  # noqa: F401 - the detection rule's names, kept reachable from here
    DetectionMatch,
    DetectionParams,
    box_iou,
    detection_params,
    keypoint_distances,
    mask_ious,
    match_detections,
)
from onnxport.sources.base import LoadedModel

KINDS = ("exact", "detections", "topk", "cosine")
DETECTION_PARTS = ("keypoints_scores", "keypoints", "masks", "boxes", "scores", "labels")  # longest suffix first


def parse_rules(texts: Iterable[str] | None) -> dict[str, str]:
    """``NAME=KIND`` entries of ``--compare`` (KIND one of :data:`KINDS`)."""
    rules: dict[str, str] = {}
    for text in texts or ():
        name, sep, kind = text.partition("=")
        name, kind = name.strip(), kind.strip().lower()
        if not sep or not name or kind not in KINDS:
            raise UsageError(f"malformed --compare '{text}'",
                             f"write OUTPUT=KIND with KIND one of {', '.join(KINDS)}, e.g. 'logits=topk'")
        if name in rules:
            raise UsageError(f"--compare {name} given twice", "declare each output once")
        rules[name] = kind
    return rules


def _group_prefix(name: str) -> str | None:
    for part in DETECTION_PARTS:
        if name.endswith(part):
            return name[: -len(part)]
    return None


def detection_groups(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Outputs that read as detections: ``PREFIXboxes`` with ``PREFIXscores`` (and ``PREFIXlabels``, ``PREFIXmasks``,
    ``PREFIXkeypoints``, ``PREFIXkeypoints_scores``)."""
    groups: dict[str, dict[str, str]] = {}
    for name in names:
        prefix = _group_prefix(name)
        if prefix is not None:
            groups.setdefault(prefix, {})[name[len(prefix):]] = name
    return {p: g for p, g in groups.items() if "boxes" in g and "scores" in g}


MAX_DETECTIONS = 4096  # more boxes than this are raw anchors or proposals: compared element by element


def detection_shaped(group: dict[str, str], ref: dict[str, np.ndarray]) -> bool:
    """Whether a group named like detections holds them: boxes ``[N, 4]`` (or ``[1, N, 4]``) and scores, labels
    ``[N]`` of the same N. Outputs merely named so (a YOLO head's raw per-anchor ``boxes`` ``[B, 64, A]`` and
    ``scores`` ``[B, 80, A]``) are compared element by element: matching them by IoU is meaningless (and would
    build an A×A matrix)."""
    boxes = np.asarray(ref[group["boxes"]])
    if boxes.ndim == 3 and boxes.shape[0] == 1:
        boxes = boxes[0]
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        return False
    n = boxes.shape[0]
    if n > MAX_DETECTIONS:  # raw anchors, not detections: an N×N IoU matrix would not fit
        return False
    for part in ("scores", "labels"):
        if part in group:
            v = np.asarray(ref[group[part]])
            if v.size != n or (v.ndim and v.shape[-1] != n):
                return False
    return True


def resolve(loaded: LoadedModel, declared: dict[str, str] | None = None) -> LoadedModel:
    """``loaded`` with its comparison rules: detection-shaped outputs auto, then the user's ``declared`` rules
    (an unknown output name is a UsageError listing the real ones)."""
    names = loaded.output_names
    rules: dict[str, str] = {}
    for group in detection_groups(names).values():
        rules.update({n: "detections" for n in group.values()})
    for name, kind in (declared or {}).items():
        if name not in names:
            raise UsageError(f"--compare names '{name}', which is not an output of the model",
                             f"the outputs are: {', '.join(names)}")
        if kind == "detections":
            prefix = _group_prefix(name)
            group = detection_groups(names).get(prefix or "\0")
            if group is None:
                raise UsageError(f"--compare {name}=detections needs outputs named PREFIXboxes and PREFIXscores "
                                 "(and PREFIXlabels)", f"the outputs are: {', '.join(names)}")
            rules.update({n: "detections" for n in group.values()})
        else:
            if rules.get(name) == "detections":  # taken out of its group: the rest is no longer one either
                for other in detection_groups(names).get(_group_prefix(name) or "\0", {}).values():
                    if other not in (declared or {}):
                        rules.pop(other, None)
            rules[name] = kind
    return dataclasses.replace(loaded, compare=rules)


# --------------------------------------------------------------------------- elementwise


COMPARE_BLOCK = 1 << 22  # elements compared at once: float64 copies of a 16 x 21 x 512 x 512 output take gigabytes


def compare_arrays(ref: np.ndarray, got: np.ndarray, tol: Tolerance, scale: np.ndarray | float | None = None,
                   floor: np.ndarray | float | None = None) -> tuple[float, float, bool]:
    """(max abs error, max relative error, passed) of ``got`` against the reference ``ref``.

    With ``scale`` (the output's magnitude, broadcastable to ``ref``: :func:`magnitudes`), the relative part of the
    bound is taken of ``max(|ref|, scale)`` instead of ``|ref|``: an element near zero in an output of magnitude 5
    is allowed the rounding error of the magnitude-5 arithmetic that made it. ``floor`` (broadcastable to ``ref``)
    is added to the bound: the error a float32 computation of an exact ``ref`` is allowed
    (prove/conditioning.py). A large output is compared in blocks of rows along its first axis (the same result,
    a bounded number of float64 copies)."""
    if ref.shape != got.shape:
        return float("inf"), float("inf"), False
    rows = ref.shape[0] if ref.ndim else 1
    if ref.size <= COMPARE_BLOCK or rows < 2:
        return _compare_block(ref, got, tol, scale, floor)
    step = max(1, COMPARE_BLOCK // max(1, ref.size // rows))
    sc = None if scale is None else np.asarray(scale)
    fl = None if floor is None else np.asarray(floor)
    worst, worst_rel, ok = 0.0, 0.0, True
    for i in range(0, rows, step):
        part = None if sc is None else (sc[i:i + step] if sc.ndim and sc.shape[0] == rows else sc)
        low = None if fl is None else (fl[i:i + step] if fl.ndim and fl.shape[0] == rows else fl)
        a, r, passed = _compare_block(ref[i:i + step], got[i:i + step], tol, part, low)
        worst, worst_rel, ok = max(worst, a), max(worst_rel, r), ok and passed
    return worst, worst_rel, ok


def _compare_block(ref: np.ndarray, got: np.ndarray, tol: Tolerance, scale: np.ndarray | float | None,
                   floor: np.ndarray | float | None = None) -> tuple[float, float, bool]:
    if ref.dtype == np.bool_ or np.issubdtype(ref.dtype, np.integer):
        diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
        worst = float(diff.max()) if diff.size else 0.0
        return worst, worst, worst == 0.0
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    both_nan = np.isnan(r) & np.isnan(g)
    same_inf = np.isinf(r) & (r == g)
    with np.errstate(invalid="ignore"):
        diff = np.abs(r - g)
    diff[both_nan | same_inf] = 0.0
    diff[np.isnan(diff)] = np.inf
    if not diff.size:
        return 0.0, 0.0, True
    del g, both_nan, same_inf
    finite_r = np.nan_to_num(r, posinf=0.0, neginf=0.0, copy=False)
    bound = tol.bound(finite_r)
    if scale is not None:
        bound = np.maximum(bound, tol.bound(np.asarray(scale, dtype=np.float64)))
    if floor is not None:
        bound = bound + np.asarray(floor, dtype=np.float64)
    passed = bool((diff <= bound).all())
    del bound
    rel = diff / np.maximum(np.abs(finite_r), tol.atol)
    return float(diff.max()), float(rel.max()), passed


UNIT_SCALE = 1.0  # the output magnitude atol is stated for: a smaller output gets atol times its magnitude


def output_scale(ref: np.ndarray) -> float | None:
    """An output's own magnitude: its largest finite |value| (None for integer and bool outputs)."""
    if not np.issubdtype(ref.dtype, np.floating) or ref.size == 0:
        return None
    r = np.abs(ref)  # in its own dtype: its largest value is the same in float64
    r = r[np.isfinite(r)]
    return float(r.max()) if r.size else None


def own_tolerance(ref: np.ndarray, tol: Tolerance) -> Tolerance:
    """``tol`` at the output's own scale: atol is the absolute error allowed on an output of magnitude
    :data:`UNIT_SCALE`; an output of magnitude m below it is allowed ``atol * m`` (logits of 1e-5 from random
    weights would otherwise pass any file off by less than atol, more than the logits themselves). rtol is
    relative already and stays. An all-zero output keeps atol (whether it can tell anything is judged apart)."""
    scale = output_scale(ref)
    if scale is None or scale <= 0.0 or scale >= UNIT_SCALE:
        return tol
    return dataclasses.replace(tol, atol=tol.atol * scale / UNIT_SCALE)


def judge(loaded: LoadedModel, pairs: Sequence[tuple[str, np.ndarray, np.ndarray]], tol: Tolerance, *,
          index_sources: dict[str, IndexSource] | None = None, undefined: dict[str, np.ndarray] | None = None,
          scaled: bool = False, floors: dict[str, np.ndarray] | None = None
          ) -> tuple[dict[str, dict], float, float, bool, list[str]]:
    """Every output of one case judged by its rule: (per-output record, worst abs, worst rel, passed, problems).

    ``index_sources``: the integer outputs that are the indices of a topk/sort/argmax in PyTorch, judged by the
    values they pick (:func:`index_agreement`). ``undefined``: per output, the positions the inputs leave undefined
    (:func:`undefined_positions`), taken from the reference so that they are not compared. ``scaled``: the case's
    inputs were scaled up (edge values), so float outputs are judged against their magnitude (:func:`magnitudes`).
    ``floors``: per output, an error allowed on top of the tolerance (its rows judged against float64:
    prove/conditioning.py).
    """
    per_out: dict[str, dict] = {}
    worst_abs = worst_rel = 0.0
    ok = True
    problems: list[str] = []
    got_by = {n: defined(r, np.asarray(g), (undefined or {}).get(n)) for n, r, g in pairs}
    ref_by = {n: r for n, r, _ in pairs}
    groups = {p: g for p, g in detection_groups([n for n, _, _ in pairs]).items()
              if all(loaded.compare.get(n) == "detections" for n in g.values()) and detection_shaped(g, ref_by)}
    grouped = {n: p for p, g in groups.items() for n in g.values()}
    matches = {p: match_group(g, ref_by, got_by, tol, loaded) for p, g in groups.items()}
    for name, r, _ in pairs:
        g = got_by[name]
        kind = "detections" if name in grouped else loaded.compare.get(name, "exact")
        scale = magnitudes(r) if scaled and kind == "exact" and r.shape == g.shape else None
        own = own_tolerance(r, tol)
        a, rel, passed = compare_arrays(r, g, own, scale, (floors or {}).get(name)) if r.shape == g.shape \
            else (float("inf"), float("inf"), False)
        rec = {"shape": list(r.shape), "onnx_shape": list(g.shape), "max_abs_err": finite(a),
               "max_rel_err": finite(rel), "passed": passed}
        if own != tol:
            rec["atol"] = own.atol  # judged at the output's own scale (own_tolerance)
            rec["magnitude"] = output_scale(r)
        if scale is not None and np.issubdtype(r.dtype, np.floating):
            rec["tolerance_scale"] = finite(float(np.max(scale, initial=0.0)))
        if name in (undefined or {}):
            rec["undefined_skipped"] = int(np.count_nonzero(np.broadcast_to(undefined[name], r.shape)))
        if name in grouped:
            m = matches[grouped[name]]
            rec.update(m.to_dict(), passed=m.passed)
            part = name[len(grouped[name]):]
            if m.passed:
                a = rel = {"scores": m.score_err, "boxes": m.box_err}.get(part, 0.0)
            elif problem := m.problem(part):
                problems.append(f"{name}: {problem}")
        elif kind == "exact" and name in (index_sources or {}) and r.shape == g.shape:
            rec.update(index_agreement(r, g, index_sources[name], tol))
            a = rel = rec["value_err"] if rec["passed"] else a
            if not rec["passed"]:
                problems.append(f"{name}: {rec['op']} indices pick other values at {rec['differ'] - rec['ties']} "
                                f"position(s) (max abs error {rec['value_err']:.3g})")
        elif kind in ("topk", "cosine"):
            rec.update(topk_agreement(r, g, tol) if kind == "topk" else cosine_agreement(r, g, tol))
            if not rec["passed"]:
                problems.append(f"{name}: " + (f"top-1 agrees on {rec['top1_agree']:.0%} of rows, top-{rec['k']} "
                                               f"on {rec['topk_agree']:.0%}" if kind == "topk"
                                               else f"cosine {rec['min_cosine']}"))
        elif r.shape != g.shape:
            problems.append(f"{name}: shape {list(g.shape)} instead of {list(r.shape)}")
        elif not passed:
            problems.append(f"{name}: max abs error {a:.3g}")
        per_out[name] = rec
        ok &= rec["passed"]
        if rec["passed"] or kind == "exact":
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, rel)
    return per_out, worst_abs, worst_rel, ok, problems


def magnitudes(ref: np.ndarray) -> np.ndarray:
    """The magnitude of each sample of an output (the largest finite |value| along all axes but the first; of the
    whole output when it has fewer than two axes), shaped to broadcast against it.

    A case whose inputs were scaled up (``edge``: floats times 3) drives deep stacks (SiLU, GroupNorm, convs) to
    outputs of larger magnitude, whose fp32 rounding error is relative to that magnitude, not to each element: an
    element near zero carries the error of the arithmetic around it. A frozen branch or a wrong export moves
    outputs by a fraction of their magnitude, far beyond ``rtol`` times it, so the case still catches them."""
    if not np.issubdtype(ref.dtype, np.floating) or ref.size == 0:
        return np.zeros((1,) * ref.ndim)
    r = np.abs(np.nan_to_num(ref, nan=0.0, posinf=0.0, neginf=0.0))  # its own dtype; the maxima widened after
    if r.ndim < 2:
        return np.full((1,) * r.ndim, float(r.max()))
    return r.reshape(r.shape[0], -1).max(1).astype(np.float64).reshape((r.shape[0],) + (1,) * (r.ndim - 1))


def undefined_positions(mask: np.ndarray, out_shape: Sequence[int]) -> np.ndarray | None:
    """The positions of an output that an attention mask (``[batch, seq]``, 1: attend, 0: padding; middle axes of
    size 1 allowed) leaves undefined, as a boolean array broadcastable to ``out_shape``; None when it leaves none.

    An output laid out ``[batch, seq, ...]`` is defined at the valid tokens only: at a padding position a query
    may attend to nothing (left padding in a causal LM: the softmax of a fully masked row, where PyTorch and
    onnxruntime legitimately differ), and every consumer ignores it. An output ``[batch, ...]`` is undefined on a
    row with no valid token at all. Everything else is compared."""
    m = np.asarray(mask)
    if m.ndim > 2 and all(d == 1 for d in m.shape[1:-1]):
        m = m.reshape(m.shape[0], m.shape[-1])
    if m.ndim != 2 or len(out_shape) < 1 or out_shape[0] != m.shape[0] or m.size == 0:
        return None
    valid = m.astype(bool)
    where = ~valid if len(out_shape) >= 2 and out_shape[1] == m.shape[1] else ~valid.any(1)
    if not where.any():
        return None
    return where.reshape(where.shape + (1,) * (len(out_shape) - where.ndim))


def defined(ref: np.ndarray, got: np.ndarray, where: np.ndarray | None) -> np.ndarray:
    """``got`` with the reference's values where ``where`` says the output is undefined."""
    if where is None or ref.shape != got.shape:
        return got
    return np.where(np.broadcast_to(where, ref.shape), ref, got).astype(got.dtype, copy=False)


# --------------------------------------------------------------------------- indices of topk, sort, argmax


@dataclass(frozen=True)
class IndexSource:
    """Where an integer output comes from in PyTorch: the indices a topk, sort, argsort, argmax/argmin, max/min
    along a dim or kthvalue picked from ``values`` (the op's input) along ``dim`` (None: the flattened input)."""

    op: str
    values: np.ndarray
    dim: int | None
    keepdim: bool = True
    distinct: bool = False  # topk, sort, argsort: the indices along dim are distinct


def index_agreement(ref: np.ndarray, got: np.ndarray, src: IndexSource, tol: Tolerance) -> dict:
    """Indices judged by the values they pick: where onnxruntime's index differs from PyTorch's, the value of
    PyTorch's own input at onnxruntime's index must equal the value at PyTorch's index within the tolerance (a
    tie: both are right); the indices must be in range, and distinct along the dim for topk/sort/argsort.

    Judging by gathering from PyTorch's input (rather than trusting onnxruntime's own values output) keeps a
    wrong export caught: a frozen branch or a wrong op picks positions whose values differ. ``differ`` counts the
    positions where the indices differ, ``ties`` those of them that are ties."""
    values = np.asarray(src.values)
    out = {"compare": "indices", "op": src.op, "differ": int(np.count_nonzero(ref != got)), "ties": 0,
           "value_err": 0.0, "passed": False}
    if src.dim is None:
        values, dim, r, g = values.reshape(-1), 0, ref.reshape(-1), got.reshape(-1)
    else:
        dim = src.dim % max(values.ndim, 1)
        r, g = (ref, got) if src.keepdim else (np.expand_dims(ref, dim), np.expand_dims(got, dim))
    size = values.shape[dim] if values.ndim else 1
    if r.ndim != values.ndim or g.size and (g.min() < 0 or g.max() >= size):
        return out
    try:
        at_ref = np.take_along_axis(values, r.astype(np.int64), dim).astype(np.float64)
        at_got = np.take_along_axis(values, g.astype(np.int64), dim).astype(np.float64)
    except (ValueError, IndexError):
        return out
    with np.errstate(invalid="ignore"):
        diff = np.abs(at_got - at_ref)
    diff[np.isnan(at_ref) & np.isnan(at_got)] = 0.0
    diff[np.isnan(diff)] = np.inf
    tie = tol.within(diff, np.nan_to_num(at_ref))
    distinct = True
    if src.distinct and g.size:
        ordered = np.sort(np.moveaxis(g, dim, -1), axis=-1)
        distinct = not bool((ordered[..., 1:] == ordered[..., :-1]).any())
    out.update(ties=int(np.count_nonzero(tie & np.broadcast_to(r != g, tie.shape))),
               value_err=finite(float(diff.max(initial=0.0))), passed=bool(tie.all()) and distinct)
    return out


def match_group(group: dict[str, str], ref: dict, got: dict, tol: Tolerance, loaded: LoadedModel) -> DetectionMatch:
    params = detection_params(loaded.model)
    return match_detections({part: ref[n] for part, n in group.items()},
                            {part: got[n] for part, n in group.items()}, tol, params)


# --------------------------------------------------------------------------- topk and cosine


def task_kind(loaded: LoadedModel, ref: Sequence[np.ndarray]) -> str:
    """What a task metric compares: 'sentence-embedding' (mean-pooled, masked), 'classifier' (2-D logits) or 'cosine' (outputs as rows)."""
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




def topk_agreement(ref: np.ndarray, got: np.ndarray, tol: Tolerance, k: int = 5) -> dict:
    """Top-1 and top-k agreement over the last axis; a disagreement between scores tied within the tolerance
    does not count."""
    if ref.shape != got.shape or ref.ndim == 0 or ref.shape[-1] < 2:
        return {"compare": "topk", "passed": False, "top1_agree": 0.0, "topk_agree": 0.0, "k": k}
    r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    g = got.reshape(-1, got.shape[-1]).astype(np.float64)
    k = min(k, r.shape[1])
    top1 = topk = 0
    for rr, gg in zip(r, g):
        order = np.argsort(-rr, kind="stable")
        g1 = int(np.argmax(gg))
        top1 += g1 == order[0] or tol.within(rr[order[0]] - rr[g1], rr[order[0]])
        kth = rr[order[k - 1]]
        want = set(order[:k].tolist())
        have = set(np.argsort(-gg, kind="stable")[:k].tolist())
        topk += all(tol.allows(rr[i], kth) for i in want ^ have)
    n = len(r)
    return {"compare": "topk", "k": k, "top1_agree": top1 / n, "topk_agree": topk / n,
            "passed": top1 == n and topk == n}


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


def cosine_agreement(ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> dict:
    """Per-row cosine similarity over the last axis; passes when the lowest is ≥ 1 − 10·rtol²."""
    if ref.shape != got.shape or ref.size == 0:
        return {"compare": "cosine", "passed": False, "min_cosine": None}
    r = ref.reshape(-1, ref.shape[-1] if ref.ndim else 1).astype(np.float64)
    g = got.reshape(r.shape).astype(np.float64)
    nr, ng = np.linalg.norm(r, axis=1), np.linalg.norm(g, axis=1)
    both_zero = (nr == 0) & (ng == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(both_zero, 1.0, (r * g).sum(1) / (nr * ng))
    worst = float(np.nan_to_num(cos, nan=-1.0).min())
    return {"compare": "cosine", "min_cosine": worst, "passed": worst >= 1.0 - max(10 * tol.rtol ** 2, 1e-6)}
