"""The pipeline façade: output folder safety, status and file naming, report contents."""

from __future__ import annotations

import onnx
import pytest

from onnxport import api
from onnxport.core.errors import UsageError
from tests.conftest import MODELS, load_report


def test_prepare_out_refuses_existing_results_and_clears_them_with_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    api.prepare_out(out, force=False)  # unrelated files are fine
    (out / "model.onnx").write_text("old")
    with pytest.raises(UsageError, match="--force"):
        api.prepare_out(out, force=False)
    api.prepare_out(out, force=True)
    assert not (out / "model.onnx").exists() and (out / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError):
        api.prepare_out(tmp_path / "file", force=True)


def test_export_ok_writes_model_report_and_markdown(tmp_path):
    out = tmp_path / "out"
    rep = api.export(f"{MODELS}:TinyText", out, inputs=["input_ids:int64[batch,seq]"],
                     dims=["batch=1..8", "seq=1..32"])
    assert rep["status"] == "ok", rep["summary"]
    assert load_report(out) == rep
    assert onnx.load(str(out / "model.onnx")).graph.input[0].name == "input_ids"
    assert rep["export"]["path"] == "model.onnx"
    assert rep["summary"].startswith("Proven")
    assert [c["label"] for c in rep["validation"]["cases"]][:4] == ["export", "min", "max", "odd"]
    assert {d["symbol"] for d in rep["check"]["dynamic_dims"] if d["proven"]} == {"batch", "seq"}
    assert "## onnxport: ✅ ok" in (out / "report.md").read_text()
    assert set(rep["timings"]) == {"load", "export", "check", "parity"}


def test_torchscript_reshape_baked_in_is_caught(tmp_path):
    """The tutorial's trap: the TorchScript exporter bakes the example's sizes into the attention Reshape."""
    out = tmp_path / "out"
    rep = api.export(f"{MODELS}:TinyText", out, inputs=["input_ids:int64[batch,seq]"],
                     dims=["batch=1..8", "seq=1..32"], exporter="torchscript")
    assert rep["status"] == "validation_failed"
    cases = {c["label"]: c for c in rep["validation"]["cases"]}
    assert not cases["min"]["passed"] and "Reshape" in cases["min"]["error"]
    dims = {d["symbol"]: d for d in rep["check"]["dynamic_dims"]}
    assert dims["seq"]["symbolic"] and not dims["seq"]["proven"]  # the baked-in size
    assert dims["batch"]["proven"]  # proven by cases that change batch alone: not blamed for seq's Reshape
    unproven = [d for d in rep["diagnostics"] if d["code"] == "dynamic-dim-unproven"]
    assert unproven and all("'seq'" in d["message"] for d in unproven)
    assert "parity-failed" in {d["code"] for d in rep["diagnostics"]}
    assert not (out / "model.onnx").exists()


def test_failed_proof_replaces_a_stale_model_onnx(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_text("an older, proven model")
    rep = api.export(f"{MODELS}:NeedsItem", out, inputs=["x:float32[batch,4]"], exporter="torchscript", force=True)
    assert rep["status"] == "validation_failed"
    assert not (out / "model.onnx").exists(), "a failed run must not leave a model.onnx that looks valid"
    assert (out / "model.unverified.onnx").exists()
    assert any(d["code"] == "parity-failed" for d in rep["diagnostics"])
    load_report(out)
