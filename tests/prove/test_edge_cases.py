"""The proof's own edge cases: correct models pass them, and the same cases still catch a frozen branch or a wrong
export. Ties of topk/sort/argmax indices, attention masks (padding positions, rows that attend to nothing), the
magnitude-scaled tolerance of the edge values, and the masks and keypoints of detections."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxport.core.records import FP16, FP32
from onnxport.core.samples import Case
from onnxport.core.spec import Dim, parse_input
from onnxport.exporters.chain import export
from onnxport.prove import compare as cmp
from onnxport.prove.parity import compare
from onnxport.sources.finish import finish
from tests.fixtures import edge_models as em

PARAMS = cmp.DetectionParams(score_thresh=0.05, nms_thresh=0.5, max_detections=100)


def _loaded(model, inputs: list[str], dims: list[Dim]):
    return finish("edge", type(model).__name__, "python", model, [parse_input(i) for i in inputs], dims)


def _proof(model, inputs, dims, exporter, tmp_path: Path, cases=None):
    loaded = _loaded(model, inputs, dims)
    res = export(loaded, tmp_path / "model.onnx", exporter=exporter)
    return loaded, res.path, compare(loaded, res.path, cases=cases)


def _by_label(result) -> dict:
    return {c.label: c for c in result.cases}


# --------------------------------------------------------------------------- indices: unit


def _src(values, dim=-1, op="topk", keepdim=True, distinct=True):
    return cmp.IndexSource(op, np.asarray(values, np.float32), dim, keepdim, distinct)


def test_indices_of_tied_values_are_both_right():
    x = [[3.0, 1.0, 3.0, 0.0, 3.0]]
    src = _src(x)
    ref = np.array([[0, 2]])
    r = cmp.index_agreement(ref, np.array([[2, 4]]), src, FP32)
    assert (r["passed"], r["differ"], r["ties"], r["value_err"]) == (True, 2, 2, 0.0)
    wrong = cmp.index_agreement(ref, np.array([[0, 1]]), src, FP32)  # picks 1.0 where 3.0 was
    assert (wrong["passed"], wrong["ties"], wrong["value_err"]) == (False, 0, 2.0)


def test_indices_must_be_distinct_and_in_range():
    src = _src([[3.0, 3.0, 3.0]])
    assert not cmp.index_agreement(np.array([[0, 1]]), np.array([[0, 0]]), src, FP32)["passed"]
    assert not cmp.index_agreement(np.array([[0, 1]]), np.array([[0, 3]]), src, FP32)["passed"]
    assert not cmp.index_agreement(np.array([[0, 1]]), np.array([[0, -1]]), src, FP32)["passed"]


def test_argmax_indices_without_keepdim_or_dim():
    x = np.array([[1.0, 5.0, 5.0], [2.0, 0.0, 7.0]], np.float32)
    along = _src(x, dim=1, op="argmax", keepdim=False, distinct=False)
    assert cmp.index_agreement(np.array([1, 2]), np.array([2, 2]), along, FP32)["passed"]
    assert not cmp.index_agreement(np.array([1, 2]), np.array([0, 2]), along, FP32)["passed"]
    flat = _src(x, dim=None, op="argmax", keepdim=False, distinct=False)
    assert cmp.index_agreement(np.array(5), np.array(5), flat, FP32)["passed"]
    assert not cmp.index_agreement(np.array(5), np.array(1), flat, FP32)["passed"]


def test_near_ties_within_the_tolerance_are_ties():
    src = _src([[1.0, 1.00005, 0.0]], op="sort")
    assert cmp.index_agreement(np.array([[1, 0, 2]]), np.array([[0, 1, 2]]), src, FP32)["passed"]
    far = _src([[1.0, 1.01, 0.0]], op="sort")
    assert not cmp.index_agreement(np.array([[1, 0, 2]]), np.array([[0, 1, 2]]), far, FP32)["passed"]


# --------------------------------------------------------------------------- indices: the proof


TOPK_IN = (["x:float32[batch,8]"], [Dim("batch", 1, 8, 2)])


@pytest.mark.parametrize("model", [em.TopkOfRounded(), em.TopkIndicesOnly(), em.SortAndArgmax()],
                         ids=["topk", "indices-only", "sort-argmax"])
def test_tied_indices_pass(model, tmp_path):
    loaded, _, result = _proof(model, *TOPK_IN, "dynamo", tmp_path)
    assert result.passed, [c.error for c in result.cases]
    index_outputs = [o for c in result.cases for o in c.outputs.values() if o.get("compare") == "indices"]
    assert index_outputs and all(o["passed"] for o in index_outputs)
    if isinstance(model, em.TopkOfRounded):  # the tie the issue saw: other, equal-valued indices
        assert sum(o["ties"] for o in index_outputs) > 0


def test_tied_indices_elementwise_fail_without_the_index_judgement(tmp_path):
    loaded, path, _ = _proof(em.TopkOfRounded(), *TOPK_IN, "dynamo", tmp_path)
    import onnxruntime as ort

    from onnxport.core.samples import make_inputs
    from onnxport.prove.references import torch_outputs

    sess = ort.InferenceSession(str(path))
    ins = make_inputs(loaded.inputs, {"batch": 2}, "edge", 5)
    ref = torch_outputs(loaded, ins)
    got = sess.run(None, {"x": ins[0].numpy()})
    pairs = list(zip(loaded.output_names, ref, got))
    *_, plain_ok, _ = cmp.judge(loaded, pairs, FP32)
    from onnxport.prove.parity import index_sources

    *_, ok, _ = cmp.judge(loaded, pairs, FP32, index_sources=index_sources(loaded, ins, ref))
    assert ok and not plain_ok


def test_a_frozen_branch_before_topk_still_fails(tmp_path):
    _, _, result = _proof(em.FrozenTopk(), *TOPK_IN, "torchscript", tmp_path)
    assert not result.passed
    failed = [c for c in result.cases if not c.passed]
    assert any(not o.get("passed", True) and o.get("compare") == "indices"
               for c in failed for o in c.outputs.values())


# --------------------------------------------------------------------------- attention masks


def test_undefined_positions_of_a_mask():
    mask = np.array([[1, 1, 1], [0, 0, 1]])
    where = cmp.undefined_positions(mask, (2, 3, 7))
    assert where.shape == (2, 3, 1) and where[..., 0].tolist() == [[False] * 3, [True, True, False]]
    assert cmp.undefined_positions(mask, (2, 5)) is None  # [batch, other]: every row has a valid token
    assert cmp.undefined_positions(np.array([[1, 1], [0, 0]]), (2, 5))[:, 0].tolist() == [False, True]
    assert cmp.undefined_positions(np.ones((2, 3)), (2, 3, 4)) is None
    assert cmp.undefined_positions(mask, (3, 3)) is None  # not laid out by batch
    assert cmp.undefined_positions(mask.reshape(2, 1, 1, 3), (2, 3)).tolist() == [[False] * 3,
                                                                                   [True, True, False]]


def test_judge_skips_undefined_positions_only():
    class Loaded:
        compare: dict = {}

    ref = np.zeros((2, 3, 4), np.float32)
    got = ref.copy()
    got[1, 0] = 0.4  # a padding position: undefined
    where = cmp.undefined_positions(np.array([[1, 1, 1], [0, 1, 1]]), ref.shape)
    per, *_, ok, _ = cmp.judge(Loaded, [("logits", ref, got)], FP32, undefined={"logits": where})
    assert ok and per["logits"]["undefined_skipped"] == 4
    got[1, 1] = 0.4  # a valid position
    *_, ok, problems = cmp.judge(Loaded, [("logits", ref, got)], FP32, undefined={"logits": where})
    assert not ok and "max abs error 0.4" in problems[0]


LM_IN = (["input_ids:int64[batch,seq]{0..63}", "attention_mask:int64[batch,seq]"],
         [Dim("batch", 1, 4, 2), Dim("seq", 2, 16, 8)])
EDGE = [Case("edge values", {"batch": 4, "seq": 8}, "edge", 5)]


@pytest.fixture(scope="module")
def phi_export(tmp_path_factory):
    loaded = _loaded(em.tiny_phi(), *LM_IN)
    res = export(loaded, tmp_path_factory.mktemp("phi") / "model.onnx", exporter="dynamo")
    return loaded, res.path


def test_causal_lm_edge_values_pass_with_padded_rows(phi_export):
    loaded, path = phi_export
    result = compare(loaded, path, cases=EDGE)
    assert result.passed, result.cases[0].error
    assert result.cases[0].outputs["output"]["undefined_skipped"] > 0  # left padding: queries that see nothing


def test_causal_lm_edge_values_catch_a_wrong_export(phi_export, tmp_path):
    loaded, path = phi_export
    model = onnx.load(str(path))
    weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the embedding or the head
    arr = numpy_helper.to_array(weight).copy()
    arr += np.random.default_rng(0).normal(scale=0.05, size=arr.shape).astype(np.float32)  # not a constant shift:
    # a norm after the embedding would take that away
    weight.CopyFrom(numpy_helper.from_array(arr, weight.name))
    onnx.save(model, str(tmp_path / "altered.onnx"))
    result = compare(loaded, tmp_path / "altered.onnx", cases=EDGE)
    assert not result.passed


# --------------------------------------------------------------------------- magnitude at scaled inputs


def _vae_like(seed=0):
    """PyTorch's output of magnitude ~5 and onnxruntime's with 2.35e-3 of rounding at elements near zero."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(2, 3, 16, 16)).astype(np.float32).clip(-4, 4)
    ref[:, 0, 0, 0] = 5.0  # the magnitude of each sample
    got = ref.copy()
    near_zero = np.abs(ref) < 0.05
    got[near_zero] += np.float32(2.35e-3)
    return ref, got


def test_scaled_cases_are_judged_against_the_output_magnitude():
    class Loaded:
        compare: dict = {}

    ref, got = _vae_like()
    *_, ok, _ = cmp.judge(Loaded, [("sample", ref, got)], FP32)
    assert not ok  # elementwise: 2.35e-3 > 1e-4 + 1e-3 * |~0|
    per, *_, ok, _ = cmp.judge(Loaded, [("sample", ref, got)], FP32, scaled=True)
    assert ok and per["sample"]["tolerance_scale"] == pytest.approx(5.0)
    frozen = ref * 0.9  # a frozen branch moves the output by a fraction of its magnitude
    *_, ok, _ = cmp.judge(Loaded, [("sample", ref, frozen)], FP32, scaled=True)
    assert not ok


def test_magnitudes_per_sample():
    ref = np.zeros((2, 3), np.float32)
    ref[0, 1], ref[1, 2] = -4.0, np.nan
    assert cmp.magnitudes(ref).tolist() == [[4.0], [0.0]]
    assert cmp.magnitudes(np.array([1.0, -2.0])).tolist() == [2.0]
    assert cmp.magnitudes(np.array([1, 2])).tolist() == [0.0]


STACK_IN = (["z:float32[batch,4,h,h]"], [Dim("batch", 1, 2, 2), Dim("h", 4, 16, 8)])


def test_silu_groupnorm_stack_passes_edge_values(tmp_path):
    _, _, result = _proof(em.SiluGroupNormStack(), *STACK_IN, "dynamo", tmp_path)
    assert result.passed
    assert _by_label(result)["edge values"].outputs["output"]["tolerance_scale"] > 0


def test_edge_values_still_catch_a_branch_frozen_at_the_export_scale(tmp_path):
    _, _, result = _proof(em.FrozenScale(), *STACK_IN, "torchscript", tmp_path)
    by = _by_label(result)
    assert not result.passed and not by["edge values"].passed  # only large inputs take the other side
    assert all(c.passed for label, c in by.items() if label != "edge values")


def test_frozen_value_branch_still_fails(tmp_path):
    _, _, result = _proof(em.FrozenBranch(), ["x:float32[batch,8]"], [Dim("batch", 1, 8, 2)], "torchscript",
                          tmp_path)
    assert not result.passed


# --------------------------------------------------------------------------- masks and keypoints of detections


def _dets(boxes, scores, labels, **extra):
    d = {"boxes": np.asarray(boxes, np.float32), "scores": np.asarray(scores, np.float32),
         "labels": np.asarray(labels, np.int64)}
    return {**d, **{k: np.asarray(v, np.float32) for k, v in extra.items()}}


BOXES = [[0, 0, 10, 10], [20, 20, 40, 40]]


def _masks():
    m = np.zeros((2, 1, 8, 8), np.float32)
    m[0, 0, 2:6, 2:6] = 0.9
    m[1, 0, :4, :] = 0.8
    return m


def test_detection_groups_take_masks_and_keypoints():
    names = ["out_0_boxes", "out_0_scores", "out_0_labels", "out_0_masks", "out_0_keypoints",
             "out_0_keypoints_scores"]
    assert cmp.detection_groups(names) == {"out_0_": {
        "boxes": "out_0_boxes", "scores": "out_0_scores", "labels": "out_0_labels", "masks": "out_0_masks",
        "keypoints": "out_0_keypoints", "keypoints_scores": "out_0_keypoints_scores"}}


def test_masks_of_matched_detections_by_iou():
    ref = _dets(BOXES, [0.9, 0.6], [1, 2], masks=_masks())
    got = _dets(BOXES[::-1], [0.6, 0.9], [2, 1], masks=_masks()[::-1] + np.float32(3e-5))
    m = cmp.match_detections(ref, got, FP32, PARAMS)
    assert (m.passed, m.mask_iou, m.mask_failed) == (True, 1.0, 0)
    moved = _masks()
    moved[0, 0] = np.roll(moved[0, 0], 3, axis=1)
    m = cmp.match_detections(ref, _dets(BOXES, [0.9, 0.6], [1, 2], masks=moved), FP32, PARAMS)
    assert (m.passed, m.mask_failed) == (False, 1) and m.mask_iou < 0.5
    assert "masks of 1 matched detection" in m.problem("masks")


def test_mask_pixels_at_the_threshold_may_flip():
    ref = np.full((1, 1, 4, 4), 0.50001, np.float32)
    ref[0, 0, 0] = 0.9
    got = np.full_like(ref, 0.49999)
    got[0, 0, 0] = 0.9
    assert cmp.mask_ious(ref, got, FP32).tolist() == [1.0]
    assert cmp.mask_ious(ref, np.zeros_like(ref), FP32).tolist() == [0.0]
    assert cmp.mask_ious(np.zeros_like(ref), np.zeros_like(ref), FP32).tolist() == [1.0]


def test_keypoints_of_matched_detections_by_distance_over_box_size():
    kp = np.array([[[2, 3, 1], [8, 8, 1]], [[25, 30, 1], [35, 22, 1]]], np.float32)
    ref = _dets(BOXES, [0.9, 0.6], [1, 2], keypoints=kp)
    near = kp.copy()
    near[1, 0, :2] += 0.5  # 0.71 px on a 20 px box: 3.5 %
    m = cmp.match_detections(ref, _dets(BOXES, [0.9, 0.6], [1, 2], keypoints=near), FP32, PARAMS)
    assert m.passed and m.keypoint_err == pytest.approx(np.sqrt(0.5) / 20)
    far = kp.copy()
    far[0, 1, :2] = [2, 2]  # 8.5 px on a 10 px box
    m = cmp.match_detections(ref, _dets(BOXES, [0.9, 0.6], [1, 2], keypoints=far), FP32, PARAMS)
    assert (m.passed, m.keypoint_failed) == (False, 1) and "keypoints of 1" in m.problem("keypoints")
    assert cmp.match_detections(ref, _dets(BOXES, [0.9, 0.6], [1, 2], keypoints=near), FP16, PARAMS).passed


def test_a_keypoint_on_a_tied_heatmap_peak_may_move():
    kp = np.array([[[2, 3, 1], [8, 8, 1]]], np.float32)
    far = kp.copy()
    far[0, 1, :2] = [2, 2]
    scores = np.array([[4.0, 1.5]], np.float32)
    ref = _dets(BOXES[:1], [0.9], [1], keypoints=kp, keypoints_scores=scores)
    tied = _dets(BOXES[:1], [0.9], [1], keypoints=far, keypoints_scores=scores)
    assert cmp.match_detections(ref, tied, FP32, PARAMS).passed
    other = _dets(BOXES[:1], [0.9], [1], keypoints=far, keypoints_scores=scores - np.float32(0.5))
    assert not cmp.match_detections(ref, other, FP32, PARAMS).passed


def test_judge_reports_masks_in_the_detection_group():
    names = ("out_0_boxes", "out_0_scores", "out_0_labels", "out_0_masks")

    @dataclasses.dataclass
    class Loaded:
        compare: dict
        model: object

    import torch

    loaded = Loaded({n: "detections" for n in names}, torch.nn.Linear(1, 1))
    ref = _dets(BOXES, [0.9, 0.6], [1, 2], masks=_masks())
    moved = _masks()
    moved[1, 0] = moved[1, 0][::-1]
    pairs = [(n, ref[n[6:]], _dets(BOXES, [0.9, 0.6], [1, 2], masks=moved)[n[6:]]) for n in names]
    per, *_, ok, problems = cmp.judge(loaded, pairs, FP32)
    assert not ok and per["out_0_masks"]["mask_failed"] == 1
    assert problems == ["out_0_masks: the masks of 1 matched detection(s) differ (lowest IoU 0.000)"]


# --------------------------------------------------------------------------- rows float32 cannot decide


def _graph(tmp_path: Path, add: float = 0.0) -> Path:
    """x[2,8] → x + add, computed exactly (the float64 answer of CancelledRow when ``add`` is 0)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Add", ["x", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              [numpy_helper.from_array(np.array(add, np.float32), "c")])
    path = tmp_path / f"add{add}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_row_float32_cannot_decide_is_left_out_and_said(tmp_path):
    loaded = _loaded(em.CancelledRow((0,)), ["x:float32[2,8]"], [])
    res = compare(loaded, _graph(tmp_path), cases=[Case("export", {}, "random", 1)])
    case = res.cases[0]
    out = next(iter(case.outputs.values()))
    assert res.passed and case.passed and out["float32_unreliable_rows"] == [0]
    assert case.scaled  # a looser judgement: proves no dim
    assert out["compared_with"] == "float64"  # row 1, exact in float32 too
    assert [d.code for d in res.diagnostics] == ["float32-undecidable", "float32-noise"]


def test_rows_float32_decides_still_catch_a_wrong_export(tmp_path):
    loaded = _loaded(em.CancelledRow((0,)), ["x:float32[2,8]"], [])
    res = compare(loaded, _graph(tmp_path, add=0.01), cases=[Case("export", {}, "random", 1)])
    assert not res.passed and "max abs error 0.01" in res.cases[0].error


def test_fail_fast_stops_at_the_first_failing_case(tmp_path):
    """A file the chain would replace is proven up to its first failing case only; a passing file runs them all."""
    loaded = _loaded(em.CancelledRow((0,), big=0.0), ["x:float32[2,8]"], [])
    cases = [Case(f"seed {i}", {}, "random", i) for i in range(4)]
    wrong = compare(loaded, _graph(tmp_path, add=0.01), cases=cases, fail_fast=True)
    assert not wrong.passed and [c.label for c in wrong.cases] == ["seed 0"]
    right = compare(loaded, _graph(tmp_path), cases=cases, fail_fast=True)
    assert right.passed and len(right.cases) == 4


def test_a_case_float32_cannot_decide_at_all_stays_failed(tmp_path):
    loaded = _loaded(em.CancelledRow((0, 1)), ["x:float32[2,8]"], [])
    res = compare(loaded, _graph(tmp_path), cases=[Case("export", {}, "random", 1)])
    assert not res.passed
    assert "float32_unreliable_rows" not in next(iter(res.cases[0].outputs.values()))


def test_rounding_noise_over_the_tolerance_is_judged_against_float64(tmp_path):
    """Row 0 ends about 5e-4 from float64 in PyTorch's float32 (over atol 1e-4) on a magnitude near 3, as a deep
    stack's rounding does: the file is compared with float64, allowed twice that, and the case proves its dims."""
    loaded = _loaded(em.CancelledRow((0,), big=1e4), ["x:float32[2,8]"], [])
    res = compare(loaded, _graph(tmp_path), cases=[Case("export", {}, "random", 1)])
    case = res.cases[0]
    out = next(iter(case.outputs.values()))
    assert res.passed and out["compared_with"] == "float64" and 1e-4 < out["float32_noise"] < 1e-3
    assert "float32_unreliable_rows" not in out and not case.scaled
    assert [d.code for d in res.diagnostics] == ["float32-noise"]


def test_against_float64_a_wrong_export_still_fails(tmp_path):
    """0.01 off is far over twice PyTorch's own rounding error: judged against float64, still failed."""
    loaded = _loaded(em.CancelledRow((0, 1), big=1e4), ["x:float32[2,8]"], [])
    res = compare(loaded, _graph(tmp_path, add=0.01), cases=[Case("export", {}, "random", 1)])
    out = next(iter(res.cases[0].outputs.values()))
    assert not res.passed and out["compared_with"] == "float64" and out["max_abs_err"] > 9e-3


def _weights_off(path: Path, module: str) -> None:
    """The file at ``path`` with 0.5 added to the weights of the modules whose name holds ``module``."""
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        if module in init.name and init.name.endswith("weight"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 0.5, init.name))
    onnx.save(model, str(path))


def test_a_module_run_twice_is_matched_to_its_first_call(tmp_path):
    """The shared SiLU's scope holds both calls; the head's weights are wrong, so the head is where they part
    (matching the SiLU's first call to its last node would blame the SiLU)."""
    from onnxport.prove import localize

    loaded = _loaded(em.SharedActivation(), ["x:float32[batch,8]"], [Dim("batch", 1, 8)])
    path = export(loaded, tmp_path / "model.onnx", exporter="dynamo").path
    _weights_off(path, "head")
    div = localize.find(loaded, path, Case("export", {"batch": 2}, "random", 1), FP32)
    assert div is not None and div.module == "head", div
    act = [t for t in div.trace if t["module"] == "act"]
    assert act and act[0]["passed"] and act[0]["method"] == "metadata+value"


def test_a_batch_norm_folded_into_its_convolution_is_not_blamed_on_the_convolution(tmp_path):
    """The exporter folds the batch norm into the convolution: one ONNX value is both modules' match, and it is
    the batch norm's output, so the convolution is marked fused, not the divergence; the wrong head is."""
    import torch
    from torch import nn

    from onnxport.prove import localize

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(5))
    model(torch.randn(1, 3, 8, 8))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    loaded = _loaded(model.eval(), ["x:float32[batch,3,8,8]"], [Dim("batch", 1, 4)])
    path = export(loaded, tmp_path / "model.onnx", exporter="dynamo").path
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(str(path)).graph.node}  # folded
    _weights_off(path, "3")
    div = localize.find(loaded, path, Case("export", {"batch": 2}, "random", 1), FP32)
    assert div is not None and div.module == "3", div
    conv = next(t for t in div.trace if t["module"] == "0")
    assert not conv["passed"] and conv["fused_into"] == "1"


def test_the_float64_run_widens_what_forward_narrows_and_gives_the_model_back(tmp_path):
    import torch

    from onnxport.prove.conditioning import float64_outputs
    from onnxport.prove.references import torch_outputs

    loaded = _loaded(em.CancelledRowNarrowing(), ["x:float32[2,8]"], [])
    x = (torch.randn(2, 8),)
    before = torch_outputs(loaded, x)[0]
    wide = float64_outputs(loaded, x)
    assert wide is not None and wide[0].dtype == np.float64
    assert np.abs(wide[0][1] - before[1]).max() < 1e-5  # the row float32 computes exactly agrees
    assert next(loaded.model.parameters()).dtype == torch.float32 and torch.get_default_dtype() == torch.float32
    assert np.array_equal(torch_outputs(loaded, x)[0], before)  # the model is given back bit for bit


def test_no_float64_run_past_its_work_limit(monkeypatch):
    import torch

    from onnxport.prove import conditioning

    loaded = _loaded(em.CancelledRowNarrowing(), ["x:float32[2,8]"], [])
    x = (torch.randn(2, 8),)
    assert conditioning.float64_outputs(loaded, x) is not None
    monkeypatch.setattr(conditioning, "MAX_WORK", loaded.parameters * 16 - 1)  # 16 input elements: one over
    assert conditioning.float64_outputs(loaded, x) is None


class _TopBoxes:
    """Four boxes at the places of the input's four largest values: a constant input ties them all, so which four
    come out is rounding's choice (a black image into a detector)."""

    @staticmethod
    def build():
        import torch
        from torch import nn

        class TopBoxes(nn.Module):
            def forward(self, x):
                scores, idx = torch.topk(x[0] * 0.01 + 0.5, 4)
                at = idx.float() * 10
                return [{"boxes": torch.stack([at, at, at + 8, at + 8], -1), "scores": scores,
                         "labels": torch.ones_like(idx)}]

        return TopBoxes()


@pytest.mark.parametrize("tied", [True, False])
def test_detections_pytorch_itself_does_not_keep_are_not_judged(tied):
    """One of four boxes elsewhere: on a constant input PyTorch's own boxes move under a float32-size nudge, so the
    file cannot be judged there (not failed; the case proves no dim); on a random input they stay, and the same
    file fails."""
    import torch

    from onnxport.prove.conditioning import unsteady_detections
    from onnxport.prove.references import torch_outputs

    loaded = cmp.resolve(_loaded(_TopBoxes.build(), ["x:float32[1,64]"], []))
    x = torch.zeros(1, 64) if tied else torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    ref = torch_outputs(loaded, (x,))
    got = [r.copy() for r in ref]
    boxes = loaded.output_names.index("output_0_boxes")
    got[boxes][-1] += 400.0  # the last box somewhere else
    pairs = list(zip(loaded.output_names, ref, got))
    per_out, *_ = cmp.judge(loaded, pairs, FP32)
    assert not per_out["output_0_boxes"]["passed"] and per_out["output_0_boxes"]["unmatched"] == 2
    unsteady = unsteady_detections(loaded, (x,), pairs, per_out, FP32)
    if tied:
        assert set(unsteady) == {"output_0_boxes", "output_0_scores", "output_0_labels"}
        assert unsteady["output_0_boxes"]["unpaired"] >= 2
    else:
        assert unsteady == {}
