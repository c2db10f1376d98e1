"""Batch invariance: a row's answer alone equals its answer inside a batch (what a batching server needs)."""

from __future__ import annotations

import json
import shutil

import pytest
from onnxruntime.quantization import QuantType, quantize_dynamic

from onnxport.api import export, load_model
from onnxport.prove import batching
from onnxport.serve import discover, serve_app
from tests.conftest import MODELS


@pytest.fixture(scope="module")
def projection(tmp_path_factory):
    """A [batch, seq, 16] projection exported and proven, and its dynamic int8 form."""
    root = tmp_path_factory.mktemp("batching")
    src = root / "proj.py"
    src.write_text("import torch\nclass Projection(torch.nn.Module):\n    def __init__(self):\n"
                   "        super().__init__()\n        self.lin = torch.nn.Linear(16, 16)\n"
                   "    def forward(self, x):\n        return self.lin(x)\n")
    spec = dict(inputs=["x:float32[batch,seq,16]"], dims=["batch=1..32", "seq=1..8"])
    rep = export(f"{src}:Projection", root / "out", exporter="torchscript", **spec)
    assert rep["status"] == "ok"
    int8 = root / "int8.onnx"
    quantize_dynamic(str(root / "out" / "model.onnx"), str(int8), weight_type=QuantType.QInt8)
    return load_model(f"{src}:Projection", **spec), root / "out", int8, rep


def test_an_fp32_export_is_batch_invariant(projection):
    loaded, out, _, rep = projection
    res = batching.check(loaded, out / "model.onnx")
    assert res.applicable and res.passed and res.rows == 32 and res.max_abs_diff < 1e-5
    assert rep["validation"]["batch_invariance"]["passed"] is True  # the pipeline records it for the export


def test_dynamic_int8_is_not_batch_invariant(projection):
    loaded, _, int8, _ = projection
    res = batching.check(loaded, int8)
    assert res.applicable and not res.passed and res.max_abs_diff > 1e-3 and res.worst_row is not None


def test_a_graph_that_mixes_rows_fails(tmp_path):
    src = tmp_path / "mix.py"
    src.write_text("import torch\nclass MixesRows(torch.nn.Module):\n    def forward(self, x):\n"
                   "        return x - x.mean(dim=0, keepdim=True)\n")
    rep = export(f"{src}:MixesRows", tmp_path / "out", inputs=["x:float32[batch,4]"], exporter="torchscript")
    inv = rep["validation"]["batch_invariance"]
    assert inv["passed"] is False and inv["rows"] == 32
    assert any(d["code"] == "batch-dependent" for d in rep["diagnostics"])


def test_an_output_not_split_by_row_is_not_applicable(tmp_path):
    """Detections-like output: its first dim counts found items, not rows, so no row can be cut out of it."""
    src = tmp_path / "flat.py"
    src.write_text("import torch\nclass Flattens(torch.nn.Module):\n    def forward(self, x):\n"
                   "        return x.reshape(-1)\n")
    rep = export(f"{src}:Flattens", tmp_path / "out", inputs=["x:float32[batch,4]"], exporter="torchscript")
    assert rep["status"] == "ok" and "batch_invariance" not in rep["validation"]  # not applicable: not reported
    assert not any(d["code"] == "batch-dependent" for d in rep["diagnostics"])
    res = batching.check(load_model(f"{src}:Flattens", inputs=["x:float32[batch,4]"]), tmp_path / "out" / "model.onnx")
    assert not res.applicable and res.passed
    assert "is not split by row (shape [128] for a batch of 32)" in res.reason


def test_inputs_without_a_shared_batch_dim_are_not_applicable():
    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[4,8]"])
    res = batching.check(loaded, "unused.onnx")
    assert not res.applicable and "batch" in res.reason


def test_the_batch_is_heterogeneous(projection):
    loaded = projection[0]
    (x,) = batching.heterogeneous_batch(loaded, 8)
    norms = x.reshape(8, -1).abs().mean(dim=1)
    assert x.shape[0] == 8 and float(norms.max() / norms.min()) > 20  # rows at scales 0.1 .. 10


def test_serve_does_not_batch_a_variant_that_is_not_batch_invariant(tmp_path, projection):
    _, out, int8, rep = projection
    folder = tmp_path / "served"
    shutil.copytree(out, folder)
    shutil.copyfile(int8, folder / "best.onnx")
    rep = dict(rep, best={"name": "int8", "path": "best.onnx", "speedup": 1.5},
               variants=[{"name": "int8", "batch_invariant": {"rows": 32, "passed": False, "max_abs_diff": 0.04}}])
    (folder / "report.json").write_text(json.dumps(rep))
    (source,) = discover(folder)
    assert source.max_batch == 1 and "int8 is not batch-invariant" in source.batching_off
    app = serve_app(folder, max_batch=16)  # the user's --max-batch does not turn it back on
    served = app.state.models["served"]
    assert served.max_batch == 1 and served.batcher.batched is False
    assert "not batch-invariant" in served.config()["parameters"]["onnxport_batching"]["string_value"]
    rep["variants"][0]["batch_invariant"]["passed"] = True
    (folder / "report.json").write_text(json.dumps(rep))
    assert discover(folder)[0].batching_off is None


def test_a_graph_that_mixes_rows_below_the_raw_tolerance_fails_on_what_varies(tmp_path):
    """Outputs of ~100 (one input-independent offset) whose input-dependent part reads the batch's mean by less
    than the raw tolerance at 100 allows: centred by the rows' mean alone, the part that varies differs."""
    src = tmp_path / "offset.py"
    src.write_text("import torch\nclass Offset(torch.nn.Module):\n    def forward(self, x):\n"
                   "        return 100.0 + 1e-2 * x + MIX * x.mean(dim=0, keepdim=True).flip(-1)\n")
    loaded = {}
    for mix in ("0.0", "1e-3"):
        (tmp_path / f"m{mix}").mkdir()
        (tmp_path / f"m{mix}" / "offset.py").write_text(src.read_text().replace("MIX", mix))
        rep = export(f"{tmp_path / f'm{mix}' / 'offset.py'}:Offset", tmp_path / f"m{mix}" / "out",
                     inputs=["x:float32[batch,16]"], exporter="torchscript")
        loaded[mix] = (load_model(f"{tmp_path / f'm{mix}' / 'offset.py'}:Offset", inputs=["x:float32[batch,16]"]),
                       tmp_path / f"m{mix}" / "out" / "model.onnx", rep)
    model, path, _ = loaded["1e-3"]
    res = batching.check(model, path)
    assert res.max_abs_diff < 0.1 and not res.passed  # the raw tolerance at 100 (0.1) lets the mixing through
    assert res.cosine_centred < 0.999 and "centred cosine" in res.reason
    model, path, rep = loaded["0.0"]
    fine = batching.check(model, path)
    assert fine.passed and fine.cosine_centred > 0.9999 and not fine.cannot_tell
    assert rep["validation"]["batch_invariance"]["cosine_centred"] is not None
