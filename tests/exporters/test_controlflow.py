"""Control flow kept through export (torch.cond and scan rewrites, torch.jit.script) and proven on every side."""

from __future__ import annotations

import ast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnxport import api
from onnxport.core.samples import Case
from onnxport.core.spec import parse_dim, parse_input
from onnxport.exporters import controlflow
from onnxport.prove import branches
from onnxport.sources import load
from tests.conftest import FIXTURES, load_report

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


def _ort_matches_pytorch(tmp_path, loaded, shapes, scales=(1.0,)) -> None:
    """ONNX Runtime on the written model against the user's PyTorch model, at sizes and values of our own."""
    sess = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    for shape in shapes:
        for scale in scales:
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))) * scale
            with torch.no_grad():
                want = loaded.flat(x)
            got = sess.run(None, {"x": x.numpy()})
            assert len(got) == len(want)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=1e-3)


def _rewritten(name: str, inputs, dims=(), loops=False):
    """The fixture loaded, and its flat wrapper with every branch (and with ``loops``, every loop) rewritten."""
    loaded = _loaded(f"{CF}:{name}", inputs, dims)
    flat, rewrites = controlflow.with_cond(loaded.flat, controlflow.if_lines(loaded.model), loops=loops)
    return loaded, flat, rewrites


def _same(flat, loaded, x) -> None:
    with torch.no_grad():
        for got, want in zip(flat(x), loaded.flat(x)):
            torch.testing.assert_close(got, want)


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
def test_cli_exit_codes_for_kept_and_lost_control_flow(tmp_path, cli):
    ok = cli("export", f"{TRAPS}:ShapeBranch", "-i", "x:float32[batch,seq,4]", "-d", "seq=1..16",
             "-o", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stderr
    lost = cli("export", f"{CF}:ItemSteps", "-i", "x:float32[batch,4]", "-o", str(tmp_path / "b"))
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


# --------------------------------------------------------------------------- unit: the forms people write


def test_a_conditional_expression_on_values_becomes_torch_cond():
    loaded, flat, rewrites = _rewritten("ValueIfExp", ["x:float32[batch,4]"])
    assert [(r.line, r.kind) for r in rewrites] == [(115, "if")]
    assert rewrites[0].code == "h = torch.cond(x.sum() > 0, lambda: self.a(x).clone(), lambda: self.b(x).clone(), ())"
    for scale in (10.0, -10.0):
        _same(flat, loaded, torch.randn(3, 4) * scale)


def test_nested_conditional_expressions_in_a_return_become_nested_conds():
    loaded, flat, rewrites = _rewritten("NestedIfExpReturn", ["x:float32[batch,4]"])
    [r] = rewrites
    assert r.code.startswith("return torch.cond(h.mean() > 0.2,") and r.code.count("torch.cond(") == 2
    for scale in (10.0, -10.0, 0.01):
        _same(flat, loaded, torch.randn(3, 4) * scale)


def test_an_elif_chain_becomes_one_cond_inside_another():
    loaded, flat, rewrites = _rewritten("ElifChain", ["x:float32[batch,4]"])
    [r] = rewrites  # the chain is one rewrite, reported at its first line
    assert r.line == 161 and r.code.count("torch.cond(") == 2 and r.code.endswith("_false_branch_0, ())")
    sides = set()
    for scale in (10.0, -10.0, 0.01):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)) * scale
        with torch.no_grad():
            mean = float(loaded.model.pre(x).mean())
        sides.add("if" if mean > 0.2 else "elif" if mean < -0.2 else "else")
        _same(flat, loaded, x)
    assert len(sides) >= 2


def test_an_if_inside_a_fixed_loop_and_an_early_return_are_rewritten_in_place():
    loaded, flat, rewrites = _rewritten("IfInFixedLoop", ["x:float32[batch,4]"])
    assert [(r.line, r.code.split(" = ")[0]) for r in rewrites] == [(180, "h")]
    ast.parse(rewrites[0].code)
    for scale in (100.0, -100.0, 1.0):
        _same(flat, loaded, torch.randn(3, 4) * scale)
    loaded, flat, rewrites = _rewritten("EarlyReturn", ["x:float32[batch,4]"])
    assert rewrites[0].code.splitlines()[0] == "def _false_branch_0(h=h):"
    assert rewrites[0].code.splitlines()[-1].startswith("return torch.cond(h.max() > 1.5, lambda: self.short(h)")
    for scale in (10.0, -10.0):
        _same(flat, loaded, torch.randn(3, 4) * scale)


@pytest.mark.parametrize("name", ["GRUOverTime", "LSTMWhile", "TanhRecurrence"])
def test_a_loop_over_the_time_dim_becomes_a_scan(name):
    loaded, flat, rewrites = _rewritten(name, ["x:float32[batch,seq,4]"], ["seq=1..32"], loops=True)
    [r] = rewrites
    assert r.kind == "loop" and "torch._higher_order_ops.scan(_scan_step_0," in r.code and "x.movedim(1, 0)" in r.code
    for seq in (1, 3, 17):
        _same(flat, loaded, torch.randn(2, seq, 4))
    _, plain = controlflow.with_cond(loaded.flat, controlflow.if_lines(loaded.model))
    assert plain == []  # the cond strategy leaves loops to scan


def test_lists_filled_by_the_loop_are_read_from_the_scan_outputs():
    loaded, flat, rewrites = _rewritten("CatOverTime", ["x:float32[batch,seq,4]"], ["seq=1..32"], loops=True)
    [r] = rewrites
    assert "torch.arange(0, n, device=x.device)" in r.code and "x.movedim(1, 0)[:n]" in r.code
    for seq in (1, 2, 9):
        _same(flat, loaded, torch.randn(3, seq, 4))


@pytest.mark.parametrize("name", ["StepsIntoBuffer", "BreakingLoop"])
def test_a_loop_a_scan_cannot_express_is_left_alone(name):
    loaded = _loaded(f"{CF}:{name}", ["x:float32[batch,seq,4]"], ["seq=1..32"])
    assert controlflow.with_cond(loaded.flat, controlflow.if_lines(loaded.model), loops=True)[1] == []


def test_if_lines_name_branch_tests_and_loops_over_sizes():
    lines = {ln for _, ln in controlflow.if_lines(_loaded(f"{CF}:ElifChain", ["x:float32[batch,4]"]).model)}
    assert lines == {161, 163}
    lines = {ln for _, ln in controlflow.if_lines(_loaded(f"{CF}:IfInFixedLoop", ["x:float32[batch,4]"]).model)}
    assert lines == {180}  # range(3) unrolls the same at every size
    model = _loaded(f"{CF}:LSTMWhile", ["x:float32[batch,seq,4]"], ["seq=1..32"]).model
    assert controlflow.holds_loop(model) and not controlflow.holds_loop(
        _loaded(f"{CF}:ElifChain", ["x:float32[batch,4]"]).model)


# --------------------------------------------------------------------------- end to end: the forms people write

BATCH = ["x:float32[batch,4]"]
TIME = (["x:float32[batch,seq,4]"], ["seq=1..32"])


def _if_sites_proven(rep: dict, count: int) -> None:
    """``count`` If sites, each seen on both sides by cases that passed parity."""
    sites = [s for s in rep["validation"]["branches"] if s["op"] == "If"]
    assert len(sites) == count and all(s["covered"] for s in sites), sites
    passed = {c["label"]: c["passed"] for c in rep["validation"]["cases"]}
    assert all(passed[s["sides"][side]] for s in sites for side in ("true", "false"))


@pytest.mark.slow
@pytest.mark.parametrize("name,ifs", [("ValueIfExp", 1), ("NestedIfExpReturn", 2), ("ElifChain", 2),
                                      ("IfInFixedLoop", 3), ("EarlyReturn", 1)])
def test_branches_on_values_are_kept_as_if_and_proven_on_both_sides(tmp_path, name, ifs):
    rep = _export(tmp_path, f"{CF}:{name}", BATCH)
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "cond"
    assert rep["export"]["attempts"][0]["exporter"] == "dynamo" and not rep["export"]["attempts"][0]["ok"]
    assert "If" in _ops(tmp_path)
    _if_sites_proven(rep, ifs)  # nested Ifs (elif, the inner conditional expression) included
    _ort_matches_pytorch(tmp_path, _loaded(f"{CF}:{name}", BATCH), [(3, 4), (17, 4)], scales=(100.0, -100.0, 0.1))


@pytest.mark.slow
def test_a_conditional_expression_on_a_dynamic_size_is_right_on_both_sides_of_the_threshold(tmp_path):
    rep = _export(tmp_path, f"{CF}:SizeIfExp", *TIME)
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "cond"
    assert rep["export"]["attempts"][0]["frozen"].startswith("torch.export assumed seq in 9..32")
    _if_sites_proven(rep, 1)
    sizes = {c["sizes"]["seq"]: c["passed"] for c in rep["validation"]["cases"]}
    assert sizes[8] and sizes[9]  # the sizes either side of the threshold, proven
    assert branches.graph_thresholds(onnx.load(str(tmp_path / "out" / "model.onnx"))) == [8]
    _ort_matches_pytorch(tmp_path, _loaded(f"{CF}:SizeIfExp", *TIME), [(2, 3, 4), (3, 8, 4), (2, 9, 4), (1, 30, 4)])


@pytest.mark.slow
def test_a_gru_cell_stepped_over_the_time_dim_is_kept_as_a_scan(tmp_path):
    rep = _export(tmp_path, f"{CF}:GRUOverTime", *TIME)
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "scan"
    attempts = {a["exporter"]: a for a in rep["export"]["attempts"]}
    assert attempts["dynamo"]["frozen"].startswith("dynamic dim seq came out fixed")
    assert not attempts["script"]["ok"] and "was exported as scan" in attempts["scan"]["note"]
    ops = _ops(tmp_path)
    assert "Scan" in ops and "GRU" not in ops and "Loop" not in ops  # one step in a Scan body, not unrolled
    [site] = rep["validation"]["branches"]
    assert site["op"] == "Scan" and site["covered"] and set(site["trip_counts"]) >= {"1", "7", "16", "32"}
    assert all(c["passed"] for c in rep["validation"]["cases"])
    _ort_matches_pytorch(tmp_path, _loaded(f"{CF}:GRUOverTime", *TIME), [(2, 3, 4), (1, 25, 4), (5, 1, 4)])


@pytest.mark.slow
def test_an_lstm_cell_in_a_while_loop_is_kept_as_a_scan_when_asked(tmp_path):
    rep = _export(tmp_path, f"{CF}:LSTMWhile", *TIME, exporter="scan")
    assert rep["status"] == "ok" and [a["exporter"] for a in rep["export"]["attempts"]] == ["scan"]
    assert "Scan" in _ops(tmp_path)
    [site] = rep["validation"]["branches"]
    assert site["covered"] and len(site["trip_counts"]) >= 3
    _ort_matches_pytorch(tmp_path, _loaded(f"{CF}:LSTMWhile", *TIME), [(2, 5, 4), (3, 29, 4)])


@pytest.mark.slow
def test_a_while_loop_kept_by_scripting_is_proven_at_the_trip_counts_it_ran(tmp_path):
    """A scripted while loop is an ONNX Loop whose trip count input is the largest int64: the proof counts its
    steps."""
    rep = _export(tmp_path, f"{CF}:TanhRecurrence", *TIME)
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "script"
    assert "Loop" in _ops(tmp_path)
    [site] = rep["validation"]["branches"]
    assert site["op"] == "Loop" and set(site["trip_counts"]) >= {"1", "7", "16", "32"}
    _ort_matches_pytorch(tmp_path, _loaded(f"{CF}:TanhRecurrence", *TIME), [(2, 5, 4), (3, 29, 4)])


def test_a_source_path_cut_mid_name_by_torch_logs_is_still_found():
    from onnxport.exporters.controlflow import same_file

    # torch's logs drop what a path shares with torch's own location, character by character (a venv elsewhere)
    assert same_file("/tmp/proj/tests/model.py", "mp/proj/tests/model.py")
    assert same_file("/work/proj/model.py", "model.py") and same_file("/work/proj/a/model.py", "a/model.py")
    assert not same_file("/work/proj/my_model.py", "model.py") and not same_file("/w/b/model.py", "a/model.py")


def test_a_model_holding_a_tensor_with_a_grad_fn_is_still_copied():
    """A module that cached a tensor computed with autograd on (RAFT's correlation pyramid after a trace): the
    copy the rewrites work on detaches it instead of failing (deepcopy refuses non-leaf tensors)."""
    import copy

    import torch

    from onnxport.exporters.controlflow import copied

    m = torch.nn.Linear(2, 2)
    m.cache = [m(torch.randn(1, 2))]
    with pytest.raises(RuntimeError):
        copy.deepcopy(m)
    c = copied(m)
    assert c.cache[0].grad_fn is None and torch.equal(c.cache[0], m.cache[0]) and c is not m
