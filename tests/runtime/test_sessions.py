"""The session factory (runtime.sessions.session) and the offline optimization (write_optimized): every
ONNX Runtime session onnxport opens goes through them, with the custom ops and the spinning stop."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxport.bench import flops
from onnxport.bench.peak import measure_gemm, measure_int8_gemm
from onnxport.core.errors import UsageError
from onnxport.decoder.variants import fuse_offline
from onnxport.exporters.opsets import onnxruntime_max_opset
from onnxport.optimize.graph import build_ort
from onnxport.runtime import ops
from onnxport.runtime.sessions import session, write_optimized
from onnxport.runtime.variant_sessions import memcpy_nodes

SRC = Path(__file__).resolve().parents[2] / "src" / "onnxport"
SPIN = "session.force_spinning_stop"
# The modules that may create onnxruntime sessions or their options themselves, and why.
OWN_SESSIONS = {
    "runtime/sessions.py": "the factory",
    "runtime/ops.py": "add_library checks that a library loads (SessionOptions only, no session)",
    "seq2seq/triton_model.py": "runs inside Triton's Python backend, without onnxport installed",
}


@ops.ort_python_op("sessions_unit::SessionsTwice")
def twice(x):
    """Registered at import, before any session loads onnxruntime-extensions' ops."""
    return (x * 2.0).astype(np.float32)


def _fc_model(custom: str | None = None, width: int = 3) -> onnx.ModelProto:
    """x[2,4] → MatMul W[4,width] (ones) → Add b (-1) → Identity → Relu → y[2,width]; ``custom`` ("first",
    "last"): the Python op SessionsTwice before or after them."""
    chain = ["MatMul", "Add", "Identity", "Relu"]
    if custom:
        chain.insert(0 if custom == "first" else len(chain), "SessionsTwice")
    names = ["x", *(f"h{k}" for k in range(1, len(chain))), "y"]
    extra = {"MatMul": ["W"], "Add": ["B"]}
    nodes = [helper.make_node(op, [names[k], *extra.get(op, [])], [names[k + 1]],
                              domain="sessions_unit" if op == "SessionsTwice" else "") for k, op in enumerate(chain)]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("sessions_unit", 1)] if custom else [])
    weights = [numpy_helper.from_array(np.ones((4, width), np.float32), "W"),
               numpy_helper.from_array(np.full(width, -1.0, np.float32), "B")]
    graph = helper.make_graph(nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, width])], weights)
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _saved(tmp_path: Path, model: onnx.ModelProto, name: str = "fc.onnx") -> Path:
    onnx.save(model, str(tmp_path / name))
    return tmp_path / name


def _op_types(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


X = np.ones((2, 4), np.float32)


@pytest.fixture
def opened(monkeypatch) -> list[tuple[object, ort.SessionOptions]]:
    """Every InferenceSession created, as (what it loaded, its options)."""
    made: list[tuple[object, ort.SessionOptions]] = []
    real = ort.InferenceSession

    def spy(loadable, opts=None, *args, **kw):
        made.append((loadable, opts))
        return real(loadable, opts, *args, **kw)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    return made


class _Options(ort.SessionOptions):
    """SessionOptions that record the custom-op libraries registered on them instead of loading them."""

    registered: list[str] = []

    def register_custom_ops_library(self, path: str) -> None:
        self.registered.append(path)


# --------------------------------------------------------------------------- nothing else opens a session


def _own_sessions(path: Path) -> list[str]:
    """``ort.InferenceSession(`` / ``ort.SessionOptions(`` calls in one module (line: call)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("InferenceSession", "SessionOptions")
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("ort", "onnxruntime")):
            found.append(f"{node.lineno}: {node.func.attr}")
    return found


def test_no_module_opens_a_session_but_the_factory():
    found = {str(p.relative_to(SRC)): _own_sessions(p) for p in sorted(SRC.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v and k not in OWN_SESSIONS} == {}
    assert found["runtime/sessions.py"] and found["seq2seq/triton_model.py"]  # the scan sees them


# --------------------------------------------------------------------------- session()


def test_session_on_a_model_in_memory_and_on_its_file(tmp_path, opened):
    model = _fc_model()
    for source in (model, _saved(tmp_path, model)):
        out = session(source, threads=1).run(None, {"x": X})[0]
        np.testing.assert_array_equal(out, np.full((2, 3), 3.0, np.float32))
    assert isinstance(opened[0][0], bytes) and opened[1][0] == str(tmp_path / "fc.onnx")
    for _, opts in opened:
        assert opts.get_session_config_entry(SPIN) == "1"
        assert opts.intra_op_num_threads == 1


def test_a_python_custom_op_runs_in_a_model_in_memory_and_on_file(tmp_path):
    model = _fc_model("last")
    for source in (model, _saved(tmp_path, model)):
        np.testing.assert_array_equal(session(source).run(None, {"x": X})[0], np.full((2, 3), 6.0, np.float32))
    assert [p.name for p in tmp_path.iterdir()] == ["fc.onnx"]  # the domain-moved copy is gone


def test_compiled_libraries_are_registered_on_every_path(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_LIBRARIES", [Path("/libs/libunit_ops.so")])
    monkeypatch.setattr(ort, "SessionOptions", _Options)
    monkeypatch.setattr(_Options, "registered", [])
    path = _saved(tmp_path, _fc_model())
    session(path)
    session(_fc_model())
    write_optimized(path, tmp_path / "opt.onnx")
    assert _Options.registered == ["/libs/libunit_ops.so"] * 3


def test_a_model_in_memory_that_cannot_load_is_a_usage_error_naming_it():
    model = _fc_model()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UsageError, match="cannot load the model 'fc'"):
        session(model)


# --------------------------------------------------------------------------- write_optimized()


def test_write_optimized_writes_the_graph_at_each_level(tmp_path, opened):
    path = _saved(tmp_path, _fc_model())
    kinds = {level: _op_types(write_optimized(path, tmp_path / f"{level}.onnx", opt_level=level))
             for level in ("disable", "basic", "extended")}
    assert kinds == {"disable": ["MatMul", "Add", "Identity", "Relu"], "basic": ["Gemm", "Relu"],
                     "extended": ["FusedGemm"]}
    assert [Path(o.optimized_model_filepath).name for _, o in opened] == ["disable.onnx", "basic.onnx",
                                                                         "extended.onnx"]
    assert all(o.get_session_config_entry(SPIN) == "1" for _, o in opened)
    assert not list(tmp_path.glob("*.data"))


def test_write_optimized_keeps_a_python_custom_op(tmp_path):
    """The file is optimized from the session's copy, whose Python op runs in onnxruntime-extensions' domain."""
    dst = write_optimized(_saved(tmp_path, _fc_model("last")), tmp_path / "opt.onnx")
    nodes = onnx.load(str(dst)).graph.node
    assert [(n.domain, n.op_type) for n in nodes] == [("com.microsoft", "FusedGemm"), (ops.ORTX_DOMAIN, "SessionsTwice")]


def test_write_optimized_puts_weights_beside_the_file_when_external(tmp_path):
    src = _saved(tmp_path, _fc_model(width=300))  # weights over onnxruntime's 1 KiB minimum for external data
    dst = write_optimized(src, tmp_path / "opt.onnx", external=True)
    assert (tmp_path / "opt.onnx.data").stat().st_size >= 4 * 300 * 4
    np.testing.assert_array_equal(session(dst).run(None, {"x": X})[0], np.full((2, 300), 3.0, np.float32))
    write_optimized(src, tmp_path / "inline.onnx")  # small: inline
    assert not (tmp_path / "inline.onnx.data").exists()


def test_write_optimized_raises_what_onnxruntime_raises(tmp_path):
    model = _fc_model()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(Exception) as info:
        write_optimized(_saved(tmp_path, model), tmp_path / "opt.onnx")
    assert not isinstance(info.value, UsageError) and "NoSuchOp" in str(info.value)


# --------------------------------------------------------------------------- the callers


def test_both_offline_optimizations_are_write_optimized(tmp_path, opened):
    src = _saved(tmp_path, _fc_model("last"))
    build_ort(src, tmp_path / "ort.onnx", None)
    fuse_offline(src, tmp_path / "fused.onnx", None)
    assert _op_types(tmp_path / "ort.onnx") == _op_types(tmp_path / "fused.onnx") == ["FusedGemm", "SessionsTwice"]
    assert [o.graph_optimization_level for _, o in opened] == [ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED] * 2
    assert all(o.get_session_config_entry(SPIN) == "1" for _, o in opened)


def test_memcpy_nodes_reads_a_custom_op_graph(tmp_path):
    assert memcpy_nodes(_saved(tmp_path, _fc_model("last")), ["CPUExecutionProvider"]) == []


def test_flop_count_runs_a_custom_op_model_to_read_its_shapes(opened):
    """Shape inference stops at the custom op (an output of the graph too): the MatMul's shapes come from
    running the graph, through the op's Python implementation."""
    model = _fc_model("first")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output.append(helper.make_tensor_value_info("h1", TensorProto.FLOAT, None))
    counted = flops(model, {"x": [5, 4]})
    assert counted.unknown == () and counted.by_op == {"MatMul": 2 * 5 * 4 * 3}
    assert opened and all(o.get_session_config_entry(SPIN) == "1" for _, o in opened)


def test_peak_and_opset_probe_sessions_come_from_the_factory(opened):
    assert measure_int8_gemm(1, size=16, repeats=1) > 0
    assert measure_gemm(1, size=16, repeats=1, cpu_flags=[])["by_precision"]["bf16"] is None
    onnxruntime_max_opset.cache_clear()
    try:
        assert onnxruntime_max_opset() >= 17
    finally:
        onnxruntime_max_opset.cache_clear()
    assert len(opened) >= 4 and all(o.get_session_config_entry(SPIN) == "1" for _, o in opened)
    assert [o.intra_op_num_threads for _, o in opened[:3]] == [1, 1, 1]
