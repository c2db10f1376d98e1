"""A detector proven through the CLI: its detections are matched by IoU, ties reported, not failed."""

import pytest

from tests.conftest import FIXTURES, load_report, run_cli

FIXTURE = FIXTURES / "detection.py"


@pytest.mark.slow
def test_a_detector_is_proven_at_several_sizes_with_ties_reported(tmp_path):
    out = tmp_path / "det"
    proc = run_cli("export", f"{FIXTURE}:TiedDetector", "-i", "image:float32[1,3,height,width]",
                   "-d", "height=160..320", "-d", "width=160..320", "--exporter", "torchscript", "-o", str(out))
    rep = load_report(out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert rep["status"] == "ok"
    val = rep["validation"]
    assert val["compare"] == {"output_0_boxes": "detections", "output_0_labels": "detections",
                              "output_0_scores": "detections"}
    boxes = [c["outputs"]["output_0_boxes"] for c in val["cases"]]
    assert len({tuple(c["shapes"]["image"]) for c in val["cases"]}) >= 3  # several image sizes
    assert all(b["compare"] == "detections" and b["unmatched"] == 0 for b in boxes)
    assert sum(b["matched"] for b in boxes) > 100
    assert any(b["borderline"] for b in boxes)  # tied boxes came and went: element by element would fail
    codes = {d["code"] for d in rep["diagnostics"]}
    assert "detections-borderline" in codes
    assert {d["symbol"] for d in rep["check"]["dynamic_dims"] if d["proven"]} == {"height", "width"}


@pytest.mark.slow
@pytest.mark.parametrize("detector", [
    "SpreadDetector",  # Faster R-CNN; its scores spread, so every case can tell whatever the thread count
    "FcosDetector",  # random weights: zero-width boxes, identical on both sides (paired by their corners)
])
def test_a_detector_resizes_like_eager_where_the_traced_resize_is_a_pixel_off(tmp_path, detector):
    """At 32×77 torchvision's traced resize size (float32) is a pixel wider than eager's (float64): the image
    entering the backbone differs. The export patches the resize while exporting and records it."""
    out = tmp_path / "det"
    proc = run_cli("export", f"{FIXTURE}:{detector}", "-i", "image:float32[1,3,height,width]",
                   "-d", "height=32..160", "-d", "width=77..160", "--exporter", "torchscript", "-o", str(out))
    rep = load_report(out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert rep["status"] == "ok"
    cases = rep["validation"]["cases"]
    assert any(c["shapes"]["image"][2:] == [32, 77] for c in cases)  # the min case: a pixel off unpatched
    boxes = [c["outputs"]["output_0_boxes"] for c in cases]
    assert all(b["unmatched"] == 0 for b in boxes) and sum(b["matched"] for b in boxes) > 0
    patched = [d for d in rep["diagnostics"] if d["code"] == "export-patch"]
    assert len(patched) == 1 and "torchvision-rcnn-resize" in patched[0]["message"]
