"""The --compare rules judged over the cases on what varies between the inputs (prove/across.py, issue 51)."""

from __future__ import annotations

import numpy as np

from onnxport.api import load_model
from onnxport.core.records import FP32
from onnxport.exporters.chain import export
from onnxport.prove.across import judge_across
from onnxport.prove.compare import resolve
from onnxport.prove.parity import compare
from tests.conftest import FIXTURES

VARYING = FIXTURES / "varying.py"
X = ["x:float32[batch,8]"]


def _file(tmp_path, name: str, inputs=X):
    loaded = load_model(f"{VARYING}:{name}", inputs=inputs)
    export(loaded, tmp_path / f"{name}.onnx", exporter="torchscript")
    return tmp_path / f"{name}.onnx"


def test_a_file_that_keeps_the_constant_logits_and_changes_what_varies_fails_topk(tmp_path):
    loaded = load_model(f"{VARYING}:Offset", inputs=X)
    loaded = resolve(loaded, {loaded.output_names[0]: "topk"})
    name = loaded.output_names[0]
    right, wrong = _file(tmp_path, "Offset"), _file(tmp_path, "OffsetOther")
    good = compare(loaded, right)
    assert good.passed and good.varying[name]["passed"] and good.varying[name]["judged_by"] == "what varies"
    bad = compare(loaded, wrong)
    assert all(c.passed for c in bad.cases)  # case by case the topk rule sees one class first everywhere
    assert not bad.passed and not bad.varying[name]["passed"] and bad.varying[name]["top1_centred"] < 0.9
    assert any(d.code == "varying-failed" for d in bad.diagnostics)
    as_cosine = compare(resolve(loaded, {name: "cosine"}), wrong)
    assert not as_cosine.passed and as_cosine.varying[name]["cosine_centred"] < 0.9


def test_a_varying_classifier_keeps_its_right_file():
    rng = np.random.default_rng(0)
    ref = [3 * rng.normal(size=(4, 16)) for _ in range(6)]
    found = judge_across({"logits": "topk"}, [{"logits": (r, r + 1e-6)} for r in ref], FP32)["logits"]
    assert found.passed and not found.fallback and found.figures["reference_classes"] > 1
    swapped = judge_across({"logits": "topk"}, [{"logits": (r, r[:, ::-1])} for r in ref], FP32)["logits"]
    assert not swapped.passed


def test_logits_that_do_not_vary_cannot_tell_and_fall_back_to_their_own_scale():
    flat = np.tile(np.linspace(-1, 1, 16), (4, 1))
    same = judge_across({"logits": "topk"}, [{"logits": (flat, flat + 1e-7)}] * 3, FP32)["logits"]
    assert same.passed and same.fallback and "top1" in same.cannot_tell
    off = judge_across({"logits": "cosine"}, [{"logits": (flat, flat + 1e-2)}] * 3, FP32)["logits"]
    assert not off.passed and off.fallback and "own scale" in off.problem


def test_boxes_that_hardly_vary_are_judged_element_by_element(tmp_path):
    loaded = load_model(f"{VARYING}:Boxes", inputs=X)
    boxes = next(n for n in loaded.output_names if n.endswith("boxes"))
    assert loaded.compare.get(boxes) == "detections"
    good = compare(loaded, _file(tmp_path, "Boxes"))
    assert good.passed and good.varying[boxes]["judged_by"] == "elementwise at its own scale"
    bad = compare(loaded, _file(tmp_path, "BoxesOther"))
    assert all(c.passed for c in bad.cases)  # the IoU match pairs the other file's boxes in every case
    assert not bad.passed and not bad.varying[boxes]["passed"]
    moving = load_model(f"{VARYING}:MovingBoxes", inputs=X)
    told = compare(moving, _file(tmp_path, "MovingBoxes"))
    assert told.passed and told.varying[boxes]["judged_by"] == "what varies"
