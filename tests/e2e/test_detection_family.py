"""The torchvision detection family proven through the CLI, each judged by its task: boxes by label, IoU and score,
Mask R-CNN's masks by the IoU of the binarized masks, Keypoint R-CNN's keypoints by their distance relative to the
box. Random weights, three classes, small working sizes (tests/fixtures/detection.py)."""

import pytest

from tests.conftest import FIXTURES, load_report, run_cli

FIXTURE = FIXTURES / "detection.py"


@pytest.mark.slow
@pytest.mark.parametrize("detector, part", [
    ("MaskDetector", "mask_iou"),
    ("KeypointDetector", "keypoint_err"),
    ("RetinaDetector", None),
    ("FcosDetector", None),
])
def test_a_detector_of_the_family_is_proven_by_its_task(tmp_path, detector, part):
    out = tmp_path / "det"
    proc = run_cli("export", f"{FIXTURE}:{detector}", "-i", "image:float32[1,3,height,width]",
                   "-d", "height=160..320", "-d", "width=160..320", "--exporter", "torchscript", "-o", str(out))
    rep = load_report(out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert rep["status"] == "ok"
    boxes = [c["outputs"]["output_0_boxes"] for c in rep["validation"]["cases"]]
    assert all(b["compare"] == "detections" and b["unmatched"] == 0 for b in boxes)
    assert sum(b["matched"] for b in boxes) > 20  # detections came out: the proof compared something
    if part is not None:  # masks / keypoints judged at the matched detections, not element by element
        judged = [b[part] for b in boxes if b["matched"]]
        assert judged and all(v is not None for v in judged)
        assert (min(judged) >= 0.9) if part == "mask_iou" else (max(judged) <= 0.05)
    assert {d["symbol"] for d in rep["check"]["dynamic_dims"] if d["proven"]} == {"height", "width"}
