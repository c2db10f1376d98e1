"""The chain offers every strategy's file until one is proven: a file that is not proven sends it on."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxport import api
from onnxport.api import load_model
from onnxport.core.spec import Dim
from onnxport.exporters import strategies
from onnxport.exporters.chain import candidates
from onnxport.exporters.strategies import resized_sizes
from tests.conftest import FIXTURES, MODELS

MORE = FIXTURES / "more_models.py"


def test_resized_sizes_are_odd_plain_distinct_and_allowed():
    sizes = resized_sizes({"batch": Dim("batch", 1, 64, 2), "seq": Dim("seq", 1, 512, 16)})
    assert sizes is not None and sizes["batch"] != 2 and sizes["seq"] != 16
    assert all(n % 2 and n % 3 and n % 5 and n % 7 for n in sizes.values())
    assert sizes["batch"] != sizes["seq"]
    constrained = resized_sizes({"h": Dim("h", 32, 512, 224, sizes=tuple(range(32, 513, 32)))})
    assert constrained is not None and constrained["h"] % 32 == 0 and constrained["h"] != 224
    assert resized_sizes({"b": Dim("b", 4, 4, 4)}) is None


def _wrong(real):
    """A strategy whose file runs but computes something else (a weight moved by 1)."""
    def export(loaded, path, opset, external, lines=(), **kw):
        diags = real(loaded, path, opset, external, lines, **kw)
        model = onnx.load(str(path))
        init = next(i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and
                    np.prod(i.dims) > 1)
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 1.0, init.name))
        onnx.save(model, str(path))
        return diags
    return export


def test_chain_offers_the_next_strategy_when_told_a_file_is_not_proven(tmp_path, monkeypatch):
    lm = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..32"])
    found = candidates(lm, tmp_path / "m.onnx")
    first = next(found)
    assert first.exporter == "dynamo" and first.path.exists()
    second = found.send("wrong outputs")
    assert second.exporter == "torchscript" and second.path == first.path
    assert second.attempts[0].unproven == "wrong outputs" and second.attempts[0].to_dict()["unproven"]
    found.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # the other strategies' files are gone


def test_a_file_that_is_not_proven_is_replaced_by_the_next_exporters(tmp_path, monkeypatch):
    monkeypatch.setitem(strategies.STRATEGIES, "dynamo", _wrong(strategies.STRATEGIES["dynamo"]))
    rep = api.export(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..32"],
                     out=tmp_path / "o")
    assert rep["status"] == "ok", rep["summary"]
    assert rep["export"]["exporter"] == "torchscript"
    first = rep["export"]["attempts"][0]
    assert first["exporter"] == "dynamo" and first["ok"] and first["unproven"]
    assert any(d["code"] == "export-retried" for d in rep["diagnostics"])
    assert (tmp_path / "o" / "model.onnx").exists() and not (tmp_path / "o" / "model.unverified.onnx").exists()


def test_when_no_file_is_proven_the_first_is_reported_with_every_try(tmp_path, monkeypatch):
    for name in ("dynamo", "torchscript", strategies.RESIZED):
        monkeypatch.setitem(strategies.STRATEGIES, name, _wrong(strategies.STRATEGIES[name]))
    rep = api.export(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..32"],
                     out=tmp_path / "o")
    assert rep["status"] == "validation_failed"
    assert rep["export"]["exporter"] == "dynamo"
    tried = [a for a in rep["export"]["attempts"] if a.get("unproven")]
    assert [a["exporter"] for a in tried] == ["dynamo", "torchscript", "dynamo"]  # dynamo again, resized
    assert any("other example sizes" in (a.get("note") or "") for a in tried)
    assert (tmp_path / "o" / "model.unverified.onnx").exists() and not (tmp_path / "o" / "model.onnx").exists()
    assert rep["validation"]["divergence"] is not None  # the reported file's divergence is localized


def test_a_dim_fixed_by_dynamo_goes_to_the_torchscript_exporter(tmp_path):
    rep = api.export(f"{MORE}:GridWarp", inputs=["x:float32[batch,3,h,w]"], dims=["h=8..64", "w=8..64"],
                     out=tmp_path / "o")
    assert rep["status"] == "ok", rep["summary"]
    attempts = rep["export"]["attempts"]
    assert attempts[0]["exporter"] == "dynamo" and "came out fixed" in attempts[0]["frozen"]
    assert rep["export"]["exporter"] == "torchscript"
    assert all(d["proven"] for d in rep["check"]["dynamic_dims"])
