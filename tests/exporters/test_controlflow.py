"""Control flow kept through export (torch.cond rewrite, torch.jit.script) and proven on every side."""

from __future__ import annotations

import ast

import onnx
import pytest
import torch

from onnxport import api
from onnxport.core.samples import Case
from onnxport.core.spec import parse_dim, parse_input
from onnxport.exporters import controlflow
from onnxport.prove import branches
from onnxport.sources import load
from tests.conftest import FIXTURES, load_report, run_cli

TRAPS = FIXTURES / "traps.py"
CF = FIXTURES / "controlflow.py"


def _loaded(source: str, inputs: list[str], dims: list[str] = ()):
    return load(source, inputs=[parse_input(i) for i in inputs], dims=[parse_dim(d) for d in dims], model_args={},
                weights=None, task=None, trust_remote_code=False)


def _export(tmp_path, source: str, inputs, dims=(), **kw) -> dict:
    out = tmp_path / "out"
    rep = api.export(source, out, inputs=inputs, dims=list(dims), **kw)
    assert load_report(out) == rep
    return rep


def _ops(tmp_path) -> set[str]:
    return {n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node}


# --------------------------------------------------------------------------- unit: the rewrites


def test_cond_rewrite_of_an_early_return_if_matches_pytorch_on_both_sides():
    loaded = _loaded(f"{TRAPS}:ValueBranch", ["x:float32[batch,4]"])
    flat, rewrites = controlflow.with_cond(loaded.flat, [(str(TRAPS), 11)])
    assert [(r.module, r.line) for r in rewrites] == [("gate", 11)]
    assert rewrites[0].code == "return torch.cond(x.sum() > 0, lambda: x * 2, lambda: x - 1, ())"
    ast.parse(rewrites[0].code)
    sides = set()
    for scale in (1.0, -1.0, 10.0, -10.0):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)) * scale
        sides.add(bool(loaded.model.proj(x).sum() > 0))
        torch.testing.assert_close(flat(x)[0], loaded.flat(x)[0])
    assert sides == {True, False}
    assert type(loaded.model.gate).forward is not flat.model.gate.forward  # the user's model is left alone


def test_cond_rewrite_of_an_if_else_assignment():
    loaded = _loaded(f"{CF}:AssignBranch", ["x:float32[batch,4]"])
    flat, rewrites = controlflow.with_cond(loaded.flat, [(str(CF), 31)])
    assert rewrites and rewrites[0].code.startswith("y = torch.cond(h.max() > 1.0,")
    for scale in (0.01, 100.0):
        x = torch.randn(2, 4) * scale
        torch.testing.assert_close(flat(x)[0], loaded.flat(x)[0])


def test_cond_rewrite_refuses_lines_without_a_rewritable_if():
    loaded = _loaded(f"{TRAPS}:LoopOverDim", ["x:float32[batch,seq,4]"], ["seq=1..32"])
    assert controlflow.with_cond(loaded.flat, [(str(TRAPS), 47)])[1] == []


def test_script_falls_back_to_the_submodule_holding_the_loop():
    loaded = _loaded(f"{CF}:NotScriptable", ["x:float32[batch,seq,4]"], ["seq=1..32"])
    flat, tries = controlflow.with_script(loaded.flat)
    assert [(t.module, t.ok) for t in tries] == [("", False), ("inner", True)]
    assert isinstance(flat.model.inner, torch.jit.ScriptModule)
    assert not isinstance(loaded.model.inner, torch.jit.ScriptModule)


def test_script_refusal_names_the_line():
    loaded = _loaded(f"{CF}:NonzeroSteps", ["x:float32[batch,4]"])
    with pytest.raises(ValueError, match=r"Comprehension.*controlflow.py:61"):
        controlflow.with_script(loaded.flat)


def test_thresholds_come_from_guard_expressions():
    guards = (("s27 > 8", "m.py", 3), ("Eq(s1, 16)", "m.py", 4), ("s3 <= 2*s4", "m.py", 5))
    assert branches.thresholds(guards) == [2, 8, 16]


# --------------------------------------------------------------------------- end to end: kept and proven


@pytest.mark.slow
def test_value_branch_in_a_submodule_is_kept_as_if_and_proven_on_both_sides(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:ValueBranch", ["x:float32[batch,4]"])
    assert rep["status"] == "ok"
    attempts = [(a["exporter"], a["ok"], bool(a.get("frozen"))) for a in rep["export"]["attempts"]]
    assert attempts == [("dynamo", False, False), ("torchscript", True, True), ("cond", True, False)]
    assert "If" in _ops(tmp_path)
    [site] = rep["validation"]["branches"]
    assert site["module"] == "gate" and site["sides"]["true"] and site["sides"]["false"]
    labels = {c["label"]: c["passed"] for c in rep["validation"]["cases"]}
    assert labels[site["sides"]["true"]] and labels[site["sides"]["false"]]


@pytest.mark.slow
def test_shape_branch_is_kept_and_proven_across_the_threshold(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:ShapeBranch", ["x:float32[batch,seq,4]"], ["seq=1..32"])
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "cond"
    assert "If" in _ops(tmp_path)
    assert rep["export"]["attempts"][0]["frozen"].startswith("torch.export assumed seq in 9..32")
    seqs = {c["sizes"]["seq"] for c in rep["validation"]["cases"] if c["passed"]}
    assert min(seqs) <= 8 < max(seqs)
    assert rep["validation"]["branches"][0]["covered"]


@pytest.mark.slow
def test_loop_over_a_dynamic_dim_is_kept_as_loop_at_several_trip_counts(tmp_path):
    rep = _export(tmp_path, f"{TRAPS}:LoopOverDim", ["x:float32[batch,seq,4]"], ["seq=1..32"])
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "script"
    assert "Loop" in _ops(tmp_path)
    [site] = rep["validation"]["branches"]
    assert site["op"] == "Loop" and set(site["trip_counts"]) >= {"1", "16", "32"}


@pytest.mark.slow
def test_loop_counted_by_nonzero_is_kept_by_scripting(tmp_path):
    rep = _export(tmp_path, f"{CF}:NonzeroLoop", ["x:float32[batch,4]"])
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "script"
    assert "traced past control flow" in rep["export"]["attempts"][1]["frozen"]
    [site] = rep["validation"]["branches"]
    assert len(site["trip_counts"]) >= 3


@pytest.mark.slow
def test_only_the_submodule_is_scripted_when_the_model_is_not_scriptable(tmp_path):
    rep = _export(tmp_path, f"{CF}:NotScriptable", ["x:float32[batch,seq,4]"], ["seq=1..32"])
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "script"
    assert "scripted inner" in rep["export"]["attempts"][-1]["note"]
    assert all(c["passed"] for c in rep["validation"]["cases"])


@pytest.mark.slow
def test_user_written_torch_cond_exports_with_the_dynamo_exporter(tmp_path):
    rep = _export(tmp_path, f"{CF}:UserCond", ["x:float32[batch,4]"])
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "dynamo"
    assert rep["validation"]["branches"][0]["covered"]


@pytest.mark.slow
def test_explicit_cond_strategy_rewrites_without_a_failed_attempt(tmp_path):
    rep = _export(tmp_path, f"{CF}:AssignBranch", ["x:float32[batch,4]"], exporter="cond")
    assert rep["status"] == "ok" and [a["exporter"] for a in rep["export"]["attempts"]] == ["cond"]
    assert rep["validation"]["branches"][0]["covered"]


@pytest.mark.slow
@pytest.mark.parametrize("name,line,fix", [("NonzeroSteps", 61, "drop .tolist()"), ("ItemSteps", 46, "drop .item()")])
def test_a_loop_no_strategy_can_keep_fails_with_the_line_and_the_change(tmp_path, name, line, fix):
    rep = _export(tmp_path, f"{CF}:{name}", ["x:float32[batch,4]"])
    assert rep["status"] == "validation_failed"
    assert not (tmp_path / "out" / "model.onnx").exists()
    lost = next(d for d in rep["diagnostics"] if d["code"] == "control-flow-frozen")
    assert f"controlflow.py:{line}" in lost["message"] and fix in lost["hint"]
    assert lost["module"] == f"{name} (the model's own forward)"
    assert any(not c["passed"] for c in rep["validation"]["cases"])


@pytest.mark.slow
def test_cli_exit_codes_for_kept_and_lost_control_flow(tmp_path):
    ok = run_cli("export", f"{TRAPS}:ShapeBranch", "-i", "x:float32[batch,seq,4]", "-d", "seq=1..32",
                 "-o", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stderr
    lost = run_cli("export", f"{CF}:ItemSteps", "-i", "x:float32[batch,4]", "-o", str(tmp_path / "b"))
    assert lost.returncode == 1
    assert "controlflow.py:46" in lost.stdout + lost.stderr


def test_a_case_for_the_unreached_side_is_found_by_scaling(tmp_path):
    """The matrix alone may miss a side; the search adds a case that reaches it."""
    loaded = _loaded(f"{TRAPS}:ValueBranch", ["x:float32[batch,4]"])
    flat, _ = controlflow.with_cond(loaded.flat, [(str(TRAPS), 11)])
    path = tmp_path / "m.onnx"
    torch.onnx.export(flat, (torch.randn(2, 4),), str(path), dynamo=True, input_names=["x"],
                      dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    one = [Case("only", {"batch": 2}, "scaled:0", 0)]  # zeros: one side only
    extra, found = branches.cover(loaded, path, one)
    assert found[0].covered and extra and extra[0].values.startswith("scaled:")
