"""A detector proven through the CLI: its detections are matched by IoU, ties reported, not failed."""

import pytest

from tests.conftest import FIXTURES, load_report, run_cli

FIXTURE = FIXTURES / "detection.py"


@pytest.mark.slow
def test_a_detector_is_proven_at_several_sizes_with_ties_reported(tmp_path):
    pytest.importorskip("torchvision")
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
