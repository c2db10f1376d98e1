"""The output comparisons beyond elementwise: detections by IoU, top-k and cosine; rule resolution."""

import dataclasses

import numpy as np
import pytest
import torch

from onnxport.core.errors import UsageError
from onnxport.core.records import FP16, FP32
from onnxport.prove import compare as cmp

PARAMS = cmp.DetectionParams(score_thresh=0.05, nms_thresh=0.5, max_detections=100)


def dets(boxes, scores, labels):
    return {"boxes": np.asarray(boxes, np.float32), "scores": np.asarray(scores, np.float32),
            "labels": np.asarray(labels, np.int64)}


REF = dets([[0, 0, 10, 10], [20, 20, 40, 40], [50, 0, 60, 30]], [0.9, 0.6, 0.3], [1, 2, 1])


def test_same_detections_in_another_order_match():
    got = dets(REF["boxes"][::-1], REF["scores"][::-1], REF["labels"][::-1])
    m = cmp.match_detections(REF, got, FP32, PARAMS)
    assert (m.matched, m.borderline, m.unmatched, m.passed) == (3, 0, 0, True)


def test_a_moved_box_or_changed_label_is_a_real_difference():
    moved = dets([[0, 0, 10, 10], [30, 20, 50, 40], [50, 0, 60, 30]], REF["scores"], REF["labels"])
    m = cmp.match_detections(REF, moved, FP32, PARAMS)
    assert (m.matched, m.unmatched, m.passed) == (2, 2, False)
    relabelled = dets(REF["boxes"], REF["scores"], [1, 1, 1])
    assert not cmp.match_detections(REF, relabelled, FP32, PARAMS).passed


def test_a_box_at_the_score_threshold_may_come_and_go():
    ref = dets([*REF["boxes"], [70, 70, 90, 90]], [*REF["scores"], 0.0501], [1, 2, 1, 2])
    m = cmp.match_detections(ref, REF, FP32, PARAMS)
    assert (m.matched, m.borderline, m.unmatched, m.passed) == (3, 1, 0, True)
    clear = dets([*REF["boxes"], [70, 70, 90, 90]], [*REF["scores"], 0.4], [1, 2, 1, 2])
    assert not cmp.match_detections(clear, REF, FP32, PARAMS).passed  # a confident box missing is not


def test_an_nms_tie_is_borderline():
    # two overlapping boxes of the same label and score: each side kept a different one
    a = dets([[0, 0, 10, 10]], [0.7], [1])
    b = dets([[0, 0, 10, 12]], [0.7], [1])
    m = cmp.match_detections(a, b, FP32, PARAMS)
    assert (m.matched, m.borderline, m.passed) == (0, 2, True)


def test_the_top_k_cut_among_tied_scores_is_borderline():
    params = dataclasses.replace(PARAMS, max_detections=2)
    a = dets([[0, 0, 10, 10], [20, 20, 30, 30]], [0.8, 0.4], [1, 1])
    b = dets([[0, 0, 10, 10], [60, 60, 70, 70]], [0.8, 0.4], [1, 1])
    assert cmp.match_detections(a, b, FP32, params).passed
    assert not cmp.match_detections(a, b, FP32, dataclasses.replace(params, max_detections=None)).passed


def test_degenerate_and_empty_sets():
    from onnxport.core.samples import Case
    from onnxport.prove.telling import cannot_tell, summary

    empty = dets(np.zeros((0, 4)), [], [])
    # the two sets match (nothing is unmatched), but a case with no detection cannot tell a right file from a
    # wrong one: it is said, never counted as proof (prove/telling.py; tests/prove/test_telling.py)
    assert cmp.match_detections(empty, empty, FP32, PARAMS).passed
    seen = [{"boxes": summary("boxes", np.zeros((0, 4), np.float32), "detections")}] * 2
    assert cannot_tell([Case("a", {"h": 1}), Case("b", {"h": 2}, seed=1)], seen) == {"boxes": "no detection in every case"}
    assert not cmp.match_detections(REF, empty, FP32, PARAMS).passed
    # two zero-area boxes (a random-weight head's collapsed boxes) are the same box when their corners agree
    assert cmp.box_iou(np.array([[0, 5, 10, 5]]), np.array([[0, 5, 10, 5]])).tolist() == [[1.0]]
    assert cmp.box_iou(np.array([[0, 5, 10, 5]]), np.array([[0, 6, 10, 6]])).tolist() == [[0.0]]


def test_reduced_precision_pairs_looser_boxes():
    got = dets(REF["boxes"] + np.float32(0.6), REF["scores"] + np.float32(0.004), REF["labels"])
    assert not cmp.match_detections(REF, got, FP32, PARAMS).passed
    assert cmp.match_detections(REF, got, FP16, PARAMS).passed


def test_topk_allows_ties_only():
    ref = np.array([[5.0, 4.0, 3.0, 1.0, 0.5, 0.1, 0.0]])
    assert cmp.topk_agreement(ref, ref + 1e-6, FP32)["passed"]
    swapped = ref.copy()
    swapped[0, :2] = [4.0, 5.0]
    r = cmp.topk_agreement(ref, swapped, FP32)
    assert (r["passed"], r["top1_agree"]) == (False, 0.0)
    tied = np.array([[5.0, 5.00001, 3.0]])
    assert cmp.topk_agreement(tied, tied[:, [1, 0, 2]], FP32)["passed"]


def test_cosine():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4, 384))
    assert cmp.cosine_agreement(ref, ref * 3.0, FP32)["passed"]  # a scale does not change the direction
    noisy = ref + rng.normal(scale=0.02, size=ref.shape)
    r = cmp.cosine_agreement(ref, noisy, FP32)
    assert not r["passed"] and 0.999 < r["min_cosine"] < 0.99999
    assert cmp.cosine_agreement(ref, noisy, FP16)["passed"]


def test_rules_parse_and_resolve():
    assert cmp.parse_rules(["logits=topk", "emb = cosine"]) == {"logits": "topk", "emb": "cosine"}
    for bad in ["logits", "logits=fuzzy", "=topk"]:
        with pytest.raises(UsageError):
            cmp.parse_rules([bad])

    class Loaded:  # only what resolve reads
        output_names = ("out_0_boxes", "out_0_labels", "out_0_scores", "feat")

    def resolve(declared):
        return cmp.resolve(dataclasses.make_dataclass("L", [("output_names", tuple), ("compare", dict)])(
            Loaded.output_names, {}), declared).compare

    assert resolve({}) == {n: "detections" for n in Loaded.output_names[:3]}
    assert resolve({"feat": "cosine"})["feat"] == "cosine"
    assert resolve({"out_0_scores": "exact"}) == {"out_0_scores": "exact"}  # the group is no longer one
    with pytest.raises(UsageError, match="not an output"):
        resolve({"nope": "topk"})
    with pytest.raises(UsageError, match="PREFIXboxes"):
        resolve({"feat": "detections"})


def test_detection_params_come_from_the_detection_head():
    import torchvision

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3)
    p = cmp.detection_params(model)
    assert (p.score_thresh, p.nms_thresh, p.max_detections) == (0.05, 0.5, 100)
    assert cmp.detection_params(torch.nn.Linear(2, 2)) == cmp.DetectionParams()


def test_boxes_a_fraction_of_a_pixel_wide_pair_by_their_corners():
    """Seen on Mask R-CNN with random weights: a box 0.06 px wide moved 0.02 px by rounding has IoU 0.46 with its
    twin; its corners agree within the tolerance, so it pairs. A box moved by 2 px does not."""
    ref = dets([[55.05, 62.09, 55.11, 62.56], [10, 10, 50, 60]], [0.071, 0.2], [2, 1])
    got = dets([[55.07, 62.08, 55.13, 62.55], [10, 10, 50, 60]], [0.071, 0.2], [2, 1])
    m = cmp.match_detections(ref, got, FP32, PARAMS)
    assert (m.matched, m.unmatched, m.passed) == (2, 0, True)
    far = dets([[57.07, 62.08, 57.13, 62.55], [10, 10, 50, 60]], [0.071, 0.2], [2, 1])
    assert not cmp.match_detections(ref, far, FP32, PARAMS).passed


def test_a_box_at_the_small_box_cut_may_come_and_go():
    """torchvision drops boxes under 0.01 px wide: one at the cut on one side only is borderline, not a failure;
    a box of ordinary size missing still fails."""
    ref = dets([[224.99, 0.3, 225.0, 223.3], [10, 10, 50, 60]], [0.336, 0.2], [2, 1])
    got = dets([[10, 10, 50, 60]], [0.2], [1])
    m = cmp.match_detections(ref, got, FP32, PARAMS)
    assert (m.matched, m.borderline, m.unmatched, m.passed) == (1, 1, 0, True)
    wide = dets([[200.0, 0.3, 225.0, 223.3], [10, 10, 50, 60]], [0.336, 0.2], [2, 1])
    assert not cmp.match_detections(wide, got, FP32, PARAMS).passed


def test_outputs_only_named_like_detections_are_compared_element_by_element():
    """A YOLO head's raw outputs are called boxes [B, 64, A] and scores [B, 80, A]: not detections (IoU matching
    of them would build an A×A matrix); real detection shapes, [N, 4] with [N] scores, are."""
    raw = {"out_boxes": np.zeros((1, 64, 8400), np.float32), "out_scores": np.zeros((1, 80, 8400), np.float32)}
    group = {"boxes": "out_boxes", "scores": "out_scores"}
    assert not cmp.detection_shaped(group, raw)
    anchors = {"out_boxes": np.zeros((8400, 4), np.float32), "out_scores": np.zeros(8400, np.float32)}
    assert not cmp.detection_shaped(group, anchors)
    assert cmp.detection_shaped({**group, "labels": "out_labels"}, {"out_boxes": REF["boxes"],
                                                                    "out_scores": REF["scores"],
                                                                    "out_labels": REF["labels"]})


def test_a_large_output_compared_in_blocks_gives_the_same_answer(monkeypatch):
    """Blocks of rows along the first axis: the same worst errors and verdict as one pass, scale sliced with them."""
    from onnxport.core.records import Tolerance
    from onnxport.prove import compare

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((7, 3, 10, 10)).astype(np.float32)
    got = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-6
    got[5, 1, 2, 3] += 0.5  # one bad element in a late block
    tol = Tolerance(atol=1e-4, rtol=1e-3)
    scale = compare.magnitudes(ref)
    whole = compare.compare_arrays(ref, got, tol, scale)
    monkeypatch.setattr(compare, "COMPARE_BLOCK", 300)  # two rows per block
    assert compare.compare_arrays(ref, got, tol, scale) == whole and whole[2] is False
    got[5, 1, 2, 3] = ref[5, 1, 2, 3]
    assert compare.compare_arrays(ref, got, tol, scale)[2] and compare.compare_arrays(ref, got, tol)[2]
