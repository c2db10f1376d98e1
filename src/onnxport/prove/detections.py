"""Detections judged by their task (prove/compare.py applies it to outputs named and shaped like detections):
paired by label, IoU and score; at every pair, masks by the IoU of their binarized masks and keypoints by their
distance relative to the box; what is left unpaired must be borderline (the score threshold, the top-k cut, an NMS
tie, the small-box cut) for the case to pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxport.core.records import Tolerance, finite

SMALL_BOX = 1e-2  # torchvision's detection heads drop boxes narrower or lower than this (remove_small_boxes)


@dataclass(frozen=True)
class DetectionParams:
    """The post-processing thresholds a detection model was built with (None when unknown)."""

    score_thresh: float | None = None
    nms_thresh: float | None = None
    max_detections: int | None = None


def detection_params(model) -> DetectionParams:
    """Thresholds read from the model (torchvision's RCNN ``roi_heads``, RetinaNet, FCOS, SSD: the module that
    also caps the detections per image, not a region-proposal stage)."""
    mods = list(model.modules())
    mods.sort(key=lambda m: not hasattr(m, "detections_per_img"))
    for mod in mods:
        score = getattr(mod, "score_thresh", None)
        if isinstance(score, (int, float)):
            nms = getattr(mod, "nms_thresh", None)
            top = getattr(mod, "detections_per_img", None)
            return DetectionParams(float(score), float(nms) if isinstance(nms, (int, float)) else None,
                                   int(top) if isinstance(top, int) else None)
    return DetectionParams()


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` [N,4] with every box in ``b`` [M,4] (x1, y1, x2, y2); two zero-area boxes
    (a random-weight head's collapsed boxes) have IoU 1 when their corners agree, else 0."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    same = (np.abs(a[:, None, :] - b[None, :, :]) <= DEGENERATE_ATOL).all(-1)  # zero-area boxes: equal or not
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / union, same.astype(np.float64))
    return iou


DEGENERATE_ATOL = 1e-3  # pixels: two zero-area boxes this close are the same box (IoU 1)


@dataclass(frozen=True)
class DetectionMatch:
    """PyTorch's detections against ONNX Runtime's: pairs, and the ones left over on either side; at the pairs, the
    masks (lowest IoU of the binarized masks) and keypoints (largest distance relative to the box size)."""

    matched: int
    borderline: int  # unpaired, but near the score threshold, the top-k cut or an NMS tie
    unmatched: int  # unpaired and none of those: a real difference
    box_err: float
    score_err: float
    passed: bool
    mask_iou: float | None = None  # None: no masks output
    mask_failed: int = 0  # matched detections whose masks disagree
    keypoint_err: float | None = None  # None: no keypoints output
    keypoint_failed: int = 0  # matched detections with a keypoint moved (and not a heatmap tie)

    def to_dict(self) -> dict:
        out = {"compare": "detections", "matched": self.matched, "borderline": self.borderline,
               "unmatched": self.unmatched, "box_err": finite(self.box_err), "score_err": finite(self.score_err)}
        if self.mask_iou is not None:
            out.update(mask_iou=finite(self.mask_iou), mask_failed=self.mask_failed)
        if self.keypoint_err is not None:
            out.update(keypoint_err=finite(self.keypoint_err), keypoint_failed=self.keypoint_failed)
        return out

    def problem(self, part: str) -> str | None:
        """What the output ``part`` (boxes, masks, keypoints) of a failed match says."""
        if part == "boxes" and self.unmatched:
            return (f"{self.unmatched} detection(s) without a counterpart ({self.matched} matched by IoU, "
                    f"{self.borderline} borderline)")
        if part == "masks" and self.mask_failed:
            return f"the masks of {self.mask_failed} matched detection(s) differ (lowest IoU {self.mask_iou:.3f})"
        if part == "keypoints" and self.keypoint_failed:
            return (f"keypoints of {self.keypoint_failed} matched detection(s) moved (up to "
                    f"{self.keypoint_err:.3f} of the box size)")
        return None


MASK_IOU = (0.9, 0.75)  # the binarized masks of a matched pair: fp32, reduced precision
KEYPOINT_DIST = (0.05, 0.1)  # a keypoint's distance over the box size (sqrt of its area): fp32, reduced precision


def mask_ious(ref: np.ndarray, got: np.ndarray, tol: Tolerance, threshold: float = 0.5) -> np.ndarray:
    """IoU of each pair of masks (``[N, ...]`` probabilities, binarized at ``threshold`` like torchvision's
    paste), over the pixels whose reference is clear of the threshold (farther than 10× the tolerance): a pixel at
    the threshold may flip with rounding alone. A pair with no clear pixel set on either side has IoU 1."""
    r = ref.reshape(len(ref), -1).astype(np.float64)
    g = got.reshape(len(got), -1).astype(np.float64)
    clear = np.abs(r - threshold) > 10 * tol.bound(threshold)
    rb, gb = (r > threshold) & clear, (g > threshold) & clear
    inter = (rb & gb).sum(1)
    union = (rb | gb).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def keypoint_distances(ref: np.ndarray, got: np.ndarray, boxes: np.ndarray, tied: np.ndarray | None = None
                       ) -> np.ndarray:
    """Largest distance of a keypoint (``[N, K, 2+]``, x and y first) of each pair over its box size (sqrt of the
    reference box's area, at least 1). ``tied`` (``[N, K]``) marks keypoints whose heatmap peak has the same value
    on both sides (``keypoints_scores`` equal within the tolerance): two equal peaks, and rounding picked another
    one; they are left out."""
    d = np.linalg.norm(ref[..., :2].astype(np.float64) - got[..., :2].astype(np.float64), axis=-1)
    if tied is not None:
        d = np.where(tied, 0.0, d)
    wh = np.clip(boxes[:, 2:4] - boxes[:, 0:2], 0, None)
    size = np.maximum(np.sqrt(wh[:, 0] * wh[:, 1]), 1.0)
    return d.max(1, initial=0.0) / size if d.size else np.zeros(len(ref))


def _pairs(iou: np.ndarray, same: np.ndarray, scores_ok: np.ndarray, iou_min: float,
           corners_ok: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Pairs of the same label, score within bound and IoU ≥ ``iou_min`` — or corners within bound
    (``corners_ok``: a box a fraction of a pixel wide has a low IoU with its twin moved by rounding) —, best first."""
    close = iou >= iou_min if corners_ok is None else (iou >= iou_min) | corners_ok
    cand = np.where(same & scores_ok & close, np.maximum(iou, 0.0), -1.0)
    pairs: list[tuple[int, int]] = []
    used_r: set[int] = set()
    used_g: set[int] = set()
    for flat in np.argsort(-cand, axis=None):
        i, j = np.unravel_index(flat, cand.shape)
        if cand[i, j] < 0:
            break
        if i not in used_r and j not in used_g:
            pairs.append((int(i), int(j)))
            used_r.add(int(i))
            used_g.add(int(j))
    return pairs


def _borderline(k: int, own: tuple, other: tuple, margin: float, params: DetectionParams) -> bool:
    """Whether detection ``k`` of ``own`` (boxes, scores, labels) may come and go with rounding alone."""
    boxes, scores, labels = own
    o_boxes, o_scores, o_labels = other
    s = float(scores[k])
    if params.score_thresh is not None and abs(s - params.score_thresh) <= margin:
        return True
    if min(boxes[k][2] - boxes[k][0], boxes[k][3] - boxes[k][1]) <= 2 * SMALL_BOX:
        return True  # at the small-box cut: a box 0.01 px wide on one side is removed on the other
    full = params.max_detections is not None and max(len(scores), len(o_scores)) >= params.max_detections
    if full and len(o_scores) and s <= float(o_scores.min()) + margin:
        return True  # at the top-k cut: a tie decides which of the last ones are kept
    nms = params.nms_thresh if params.nms_thresh is not None else 0.5
    if len(o_boxes):
        near = (o_labels == labels[k]) & (np.abs(o_scores - s) <= margin)
        if near.any() and (box_iou(boxes[k:k + 1], o_boxes[near]) > nms - 0.01).any():
            return True  # an NMS tie: the other side kept an overlapping box of (nearly) the same score
    same = (labels == labels[k]) & (np.arange(len(labels)) != k) & (scores >= s - margin)
    if same.any():
        ious = box_iou(boxes[k:k + 1], boxes[same])
        if (np.abs(ious - nms) <= 0.02).any():
            return True  # survived NMS by a hair
    return False


def match_detections(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], tol: Tolerance,
                     params: DetectionParams, *, strict: bool = False) -> DetectionMatch:
    """Pair detections (same label, IoU ≥ 0.9 — 0.75 at reduced precision — or every corner within 10× the tolerance,
    score within 10× the tolerance); every
    unpaired one must be borderline (see :func:`_borderline`) for the case to pass. With ``masks`` and
    ``keypoints`` (and ``keypoints_scores``) in the dicts, every pair's masks and keypoints must agree too
    (:func:`mask_ious`, :func:`keypoint_distances`). ``strict``: paired element by element alone (every corner
    and the score within the tolerance; no IoU): where PyTorch's detections hardly vary between inputs, an IoU of
    0.9 would pair another input's boxes (prove/across.py)."""
    def parts(d: dict[str, np.ndarray]) -> tuple:
        boxes = np.asarray(d["boxes"], dtype=np.float64).reshape(-1, 4)
        scores = np.asarray(d["scores"], dtype=np.float64).reshape(-1)
        labels = np.asarray(d["labels"]).reshape(-1) if "labels" in d else np.zeros(len(scores), dtype=np.int64)
        return boxes, scores, labels

    r, g = parts(ref), parts(got)
    reduced = tol.rtol > 2e-3
    iou = box_iou(r[0], g[0])
    same = r[2][:, None] == g[2][None, :]
    times = 1 if strict else 10
    scores_ok = tol.allows(g[1][None, :], r[1][:, None], times=times)
    corners_ok = tol.allows(g[0][None, :, :], r[0][:, None, :], times=times).all(-1)
    pairs = _pairs(iou, same, scores_ok, np.inf if strict else 0.75 if reduced else 0.9, corners_ok)
    box_err = max((float(np.abs(r[0][i] - g[0][j]).max()) for i, j in pairs), default=0.0)
    score_err = max((abs(float(r[1][i] - g[1][j])) for i, j in pairs), default=0.0)
    margin = max(10 * score_err, 10 * float(tol.bound(params.score_thresh or 0.0)))
    left_r = [i for i in range(len(r[1])) if i not in {p[0] for p in pairs}]
    left_g = [j for j in range(len(g[1])) if j not in {p[1] for p in pairs}]
    border = sum(_borderline(i, r, g, margin, params) for i in left_r) + \
        sum(_borderline(j, g, r, margin, params) for j in left_g)
    unmatched = len(left_r) + len(left_g) - border
    extra = _paired_parts(ref, got, pairs, r[0], tol, reduced)
    passed = unmatched == 0 and not extra.get("mask_failed") and not extra.get("keypoint_failed")
    return DetectionMatch(len(pairs), border, unmatched, box_err, score_err, passed, **extra)


def _paired_parts(ref: dict, got: dict, pairs: list[tuple[int, int]], boxes: np.ndarray, tol: Tolerance,
                  reduced: bool) -> dict:
    """The masks and keypoints of the paired detections (DetectionMatch's fields for them)."""
    out: dict = {}
    i = np.array([p[0] for p in pairs], dtype=np.int64)
    j = np.array([p[1] for p in pairs], dtype=np.int64)
    if "masks" in ref and "masks" in got:
        rm, gm = np.asarray(ref["masks"]), np.asarray(got["masks"])
        if rm.shape[1:] != gm.shape[1:]:
            return {"mask_iou": 0.0, "mask_failed": max(len(pairs), 1)}
        ious = mask_ious(rm[i], gm[j], tol) if len(pairs) else np.ones(0)
        out.update(mask_iou=float(ious.min(initial=1.0)), mask_failed=int((ious < MASK_IOU[reduced]).sum()))
    if "keypoints" in ref and "keypoints" in got:
        rk, gk = np.asarray(ref["keypoints"]), np.asarray(got["keypoints"])
        if rk.shape[1:] != gk.shape[1:]:
            return {**out, "keypoint_err": float("inf"), "keypoint_failed": max(len(pairs), 1)}
        tied = None
        if "keypoints_scores" in ref and "keypoints_scores" in got and len(pairs):
            rs = np.asarray(ref["keypoints_scores"], dtype=np.float64)[i]
            gs = np.asarray(got["keypoints_scores"], dtype=np.float64)[j]
            tied = tol.allows(gs, rs)  # the same peak value: a heatmap tie
        dist = keypoint_distances(rk[i], gk[j], boxes[i], tied) if len(pairs) else np.zeros(0)
        out.update(keypoint_err=float(dist.max(initial=0.0)),
                   keypoint_failed=int((dist > KEYPOINT_DIST[reduced]).sum()))
    return out
