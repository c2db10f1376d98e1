"""A model proven at some sizes of a dim only says so in its served configuration."""

from __future__ import annotations

import json

from onnxport.serve.models import _from_output_folder


def test_constrained_dims_reach_the_served_config(tmp_path):
    report = {"model": {"dims": {"batch": {"min": 1, "max": 64, "export": 2},
                                 "n": {"min": 4, "max": 64, "export": 8, "sizes": [4, 8, 12], "rule": "multiples of 4"},
                                 "k": {"min": 1, "max": 9, "export": 4, "sizes": [1, 4, 9]}}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    source = _from_output_folder(tmp_path)
    assert source.constrained_dims == {"n": "multiples of 4", "k": "1,4,9"}
    (tmp_path / "report.json").write_text(json.dumps({"model": {"dims": {"batch": {"min": 1, "max": 8}}}}))
    assert _from_output_folder(tmp_path).constrained_dims is None
