"""The trap catalogue: each model is either converted and proven, or fails with the documented exit code
and a diagnostic that names the right module (asserted, not printed)."""

from __future__ import annotations

import pytest

from onnxport import api
from onnxport.core.errors import UsageError
from tests.conftest import FIXTURES, MODELS, load_report
from tests.fixtures import forked_cli

TRAPS = FIXTURES / "traps.py"
cli = forked_cli.cli  # a fixture: commands forked from one process that did the CLI's imports once
pytestmark = pytest.mark.slow


def _export(tmp_path, source: str, inputs, dims=(), **kw) -> dict:
    out = tmp_path / "out"
    rep = api.export(source, out, inputs=inputs, dims=list(dims), **kw)
    assert load_report(out) == rep
    return rep


def _diag(rep: dict, code: str) -> dict:
    found = [d for d in rep["diagnostics"] if d["code"] == code]
    assert found, f"no {code} diagnostic in {[d['code'] for d in rep['diagnostics']]}"
    return found[0]


def test_branch_on_tensor_values_in_a_submodule_is_named(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:ValueBranch", ["x:float32[batch,4]"], exporter="torchscript")
    assert rep["status"] == "validation_failed"
    assert _diag(rep, "frozen-branch")["module"] == "gate"
    assert "traps.py:11" in _diag(rep, "tracer-warning")["message"]
    assert rep["validation"]["divergence"]["module"] == "gate"
    failing = [c for c in rep["validation"]["cases"] if not c["passed"]]
    smallest = min(failing, key=lambda c: c["sizes"]["batch"])  # localized where it costs least
    assert rep["validation"]["divergence"]["case"] == smallest["label"]
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_a_failing_case_too_large_to_localize_is_said(tmp_path, monkeypatch):
    """Localizing keeps every module's and every node's value of its case (a ResNet's case at 4 x 512 x 512: 12
    GiB): past the limit the run says so instead of holding them."""
    from onnxport.prove import localize

    monkeypatch.setattr(localize, "MAX_HELD", 16)
    rep = _export(tmp_path, f"{TRAPS}:ValueBranch", ["x:float32[batch,4]"], exporter="torchscript")
    assert rep["status"] == "validation_failed" and rep["validation"]["divergence"] is None
    skipped = _diag(rep, "localize-skipped")
    assert skipped["severity"] == "info" and "too large to localize" in skipped["message"]


def test_branch_on_tensor_values_is_kept_by_auto(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:ValueBranch", ["x:float32[batch,4]"])
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "cond"
    assert _diag(rep, "data-dependent-control-flow")["module"] == "gate"  # why dynamo alone failed
    assert _diag(rep, "data-dependent-control-flow")["severity"] == "info"  # and the cond strategy kept it
    assert "traps.py:11" in _diag(rep, "data-dependent-control-flow")["message"]
    [site] = rep["validation"]["branches"]
    assert site["op"] == "If" and site["module"] == "gate" and site["covered"]


def test_branch_on_a_shape_is_caught_on_both_sides(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:ShapeBranch", ["x:float32[batch,seq,4]"], ["seq=1..32"], exporter="dynamo")
    assert rep["status"] == "validation_failed"
    narrowed = _diag(rep, "dynamic-dim-narrowed")
    assert "seq in 9..32" in narrowed["message"] and "traps.py:35" in narrowed["message"]
    assert rep["validation"]["divergence"]["module"] == "ShapeBranch (the model's own forward)"
    failing = [c for c in rep["validation"]["cases"] if not c["passed"]]
    assert failing and all(c["sizes"]["seq"] <= 8 for c in failing)


def test_python_loop_over_a_dynamic_dim_names_the_dim_and_line(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:LoopOverDim", ["x:float32[batch,seq,4]"], ["seq=1..32"], exporter="dynamo")
    assert rep["status"] == "validation_failed"
    fixed = _diag(rep, "dynamic-dim-fixed")
    assert "'seq'" in fixed["message"] and "traps.py:47" in fixed["message"]
    seq = next(d for d in rep["check"]["dynamic_dims"] if d["symbol"] == "seq")
    assert not seq["symbolic"] and not seq["proven"]


@pytest.mark.parametrize("name", ["ItemScale", "MaskedSum", "CustomFunction"])
def test_value_dependent_ops_that_the_dynamo_exporter_keeps_are_proven(tmp_path, name):
    rep = _export(tmp_path, f"{TRAPS}:{name}", ["x:float32[batch,4]"])
    assert rep["status"] == "ok", rep["summary"]
    assert rep["export"]["exporter"] == "dynamo"
    assert all(c["passed"] for c in rep["validation"]["cases"])


def test_operator_without_onnx_export_exits_3_naming_op_and_line(tmp_path, cli):
    rep = _export(tmp_path, f"{TRAPS}:Eig", ["x:float32[batch,3,3]"])
    assert rep["status"] == "export_failed"
    unsupported = [d for d in rep["diagnostics"] if d["code"] == "unsupported-operator"]
    assert {d["node"] for d in unsupported} >= {"aten.linalg_eig"}
    assert all("traps.py:73" in d["message"] for d in unsupported)
    assert unsupported[0]["module"] == "Eig (the model's own forward)"
    proc = cli("export", f"{TRAPS}:Eig", "-i", "x:float32[batch,3,3]", "-o", str(tmp_path / "cli"))
    assert proc.returncode == 3


def test_dropout_left_in_train_mode_is_warned_and_fixed(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:dropout_in_train_mode", ["x:float32[batch,4]"])
    assert rep["status"] == "ok"
    d = _diag(rep, "train-mode")
    assert d["severity"] == "warning" and d["module"] == "1"


def test_dict_nested_tuple_outputs_and_keyword_only_input(tmp_path):
    rep = _export(tmp_path, f"{MODELS}:DictOut", ["x:float32[batch,4]", "mask:int64[batch,3]"])
    assert rep["status"] == "ok", rep["summary"]
    assert [o["name"] for o in rep["export"]["outputs"]] == ["logits", "extra_0", "extra_1"]
    assert [i["name"] for i in rep["export"]["inputs"]] == ["x", "mask"]


def test_scalar_arguments_are_reported_as_baked_in(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:ScalarArg", ["x:float32[batch,4]"])
    assert rep["status"] == "ok"
    scalars = {d["message"].split("'")[1] for d in rep["diagnostics"] if d["code"] == "scalar-argument"}
    assert scalars == {"repeats", "scale"}


def test_random_ops_are_nondeterministic(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:RandomNoise", ["x:float32[batch,4]"])
    assert rep["status"] == "validation_failed"
    assert _diag(rep, "nondeterministic")["module"] == "RandomNoise (the model's own forward)"


def test_random_ops_and_nans_found_from_the_outputs_when_module_outputs_are_too_large(monkeypatch):
    """Every module's output is held twice to name the one that draws random numbers; past the localizing budget
    (SAM's ViT at batch 2 and 1024 x 1024: 10 GiB) the model's outputs alone are compared."""
    from onnxport.core.samples import validation_cases
    from onnxport.diagnose import explain

    monkeypatch.setattr(explain, "MAX_HELD", 1)
    for name, code in (("RandomNoise", "nondeterministic"), ("LogOfNegative", "nan-in-pytorch")):
        loaded = api.load_model(f"{TRAPS}:{name}", inputs=["x:float32[batch,4]"])
        (found,) = [d for d in explain.runtime_traps(loaded, validation_cases(loaded.dims)[0]) if d.code == code]
        assert name in found.message
    quiet = api.load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    assert explain.runtime_traps(quiet, validation_cases(quiet.dims)[0]) == []


def test_nan_in_pytorch_itself_is_reported_with_its_module(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:LogOfNegative", ["x:float32[batch,4]"])
    d = _diag(rep, "nan-in-pytorch")
    assert d["severity"] == "warning" and d["module"] == "LogOfNegative (the model's own forward)"


def test_integer_values_out_of_embedding_range_are_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as info:
        api.export(f"{MODELS}:TinyText", tmp_path / "out", inputs=["input_ids:int64[batch,seq]{0..99}"])
    assert info.value.code == "int-out-of-range" and "embed (50 rows" in info.value.message
    assert not (tmp_path / "out").exists()


def test_compare_names_the_submodule_whose_weight_was_altered(tmp_path, cli):
    import onnx
    from onnx import numpy_helper

    src = tmp_path / "src"
    rep = api.export(f"{MODELS}:TinyText", src, inputs=["input_ids:int64[batch,seq]"], dims=["seq=1..32"])
    assert rep["status"] == "ok"
    model = onnx.load(str(src / "model.onnx"))
    target = next(t for t in model.graph.initializer if t.name.endswith("encoder.layers.0.linear1.bias"))
    target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(target) + 0.5, target.name))
    altered = tmp_path / "altered.onnx"
    onnx.save(model, str(altered))
    out = tmp_path / "cmp"
    proc = cli("compare", f"{MODELS}:TinyText", str(altered), "-i", "input_ids:int64[batch,seq]",
                   "-d", "seq=1..32", "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    rep = load_report(out)
    div = rep["validation"]["divergence"]
    assert div["module"] == "encoder.layers.0.linear1"
    assert div["trace"][0]["passed"] and any(not e["passed"] for e in div["trace"])
    assert _diag(rep, "divergence")["module"] == "encoder.layers.0.linear1"
    assert rep["export"]["path"] == str(altered)
    # the untouched export is proven by the same command
    ok = cli("compare", f"{MODELS}:TinyText", str(src / "model.onnx"), "-i", "input_ids:int64[batch,seq]",
                 "-d", "seq=1..32", "-o", str(tmp_path / "cmp_ok"))
    assert ok.returncode == 0, ok.stderr
