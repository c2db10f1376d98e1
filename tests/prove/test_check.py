"""Unit tests for onnxport.check (structural checks) and the external-data helpers of onnxport.export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxport.core.errors import EXIT_USAGE, UsageError
from onnxport.core.onnxfile import external_data_files, move_model, save_model
from onnxport.core.records import CheckResult, DimCheck
from onnxport.core.spec import Dim, parse_input
from onnxport.prove.check import check

OPSET = 17
IR_VERSION = 10
K, N = 32, 24


def _weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((K, N)).astype(np.float32), rng.standard_normal((N,)).astype(np.float32)


def _linear_model(batch: int | str = "batch", extra_nodes: list | None = None,
                  outputs: list | None = None) -> onnx.ModelProto:
    """y = Relu(x @ W + b) with x: float32[batch, K]; two initializers (W: K*N, b: N) and a shape constant."""
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["xwb"], name="add"),
        helper.make_node("Relu", ["xwb"], ["y"], name="relu"),
        *(extra_nodes or []),
    ]
    graph = helper.make_graph(
        nodes, "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, K])],
        outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, N])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b"),
                     numpy_helper.from_array(np.array([1, N], dtype=np.int64), "shape_const")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="unit-test", producer_version="1.0")
    return model


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def _codes(result: CheckResult) -> list[str]:
    return [d.code for d in result.diagnostics]


# --------------------------------------------------------------------------- a good model


def test_check_summary_of_symbolic_model(tmp_path):
    path = _save(_linear_model("batch"), tmp_path / "linear.onnx")
    r = check(path)
    assert r.ok is True
    assert r.checker_error is None
    assert r.shape_inference_error is None
    assert r.diagnostics == ()
    assert r.path == path
    assert r.ir_version == IR_VERSION
    assert r.opset == OPSET
    assert r.opsets == {"ai.onnx": OPSET}
    assert r.producer == "unit-test 1.0"
    assert r.op_histogram == {"MatMul": 1, "Add": 1, "Relu": 1}
    assert r.nodes == 3
    assert r.initializers == 3
    assert r.parameters == K * N + N          # the int64 shape constant is not a parameter
    assert r.bytes > 0
    assert r.bytes == path.stat().st_size
    assert r.inputs == ({"name": "x", "dtype": "float32", "shape": ["batch", K]},)
    assert r.outputs == ({"name": "y", "dtype": "float32", "shape": ["batch", N]},)
    assert r.dynamic_dims == ()


def test_check_histogram_counts_repeats_and_custom_domains(tmp_path):
    extra = [helper.make_node("Relu", ["y"], ["y2"], name="relu2"),
             helper.make_node("Relu", ["y2"], ["y3"], name="relu3")]
    model = _linear_model("batch", extra, [helper.make_tensor_value_info("y3", TensorProto.FLOAT, ["batch", N])])
    r = check(_save(model, tmp_path / "m.onnx"))
    assert r.ok is True
    assert r.op_histogram == {"Relu": 3, "MatMul": 1, "Add": 1}
    assert list(r.op_histogram)[0] == "Relu"  # most common first
    assert r.nodes == 5


def test_check_counts_subgraph_nodes(tmp_path):
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["a"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    r = check(_save(model, tmp_path / "if.onnx"))
    assert r.op_histogram == {"If": 1, "Neg": 1, "Abs": 1}
    assert r.nodes == 3
    assert r.inputs == ({"name": "c", "dtype": "bool", "shape": []},
                        {"name": "a", "dtype": "float32", "shape": [2]})
    assert r.parameters == 0 and r.initializers == 0


def test_check_input_list_excludes_initializers(tmp_path):
    model = _linear_model("batch")
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [K, N]))
    r = check(_save(model, tmp_path / "m.onnx"))
    assert [io["name"] for io in r.inputs] == ["x"]


def test_check_to_dict_round_trip(tmp_path):
    path = _save(_linear_model("batch"), tmp_path / "m.onnx")
    spec = parse_input(f"x:float32[batch,{K}]")
    d = check(path, (spec,), {"batch": Dim("batch", 1, 16, 2)}).to_dict()
    assert d["ok"] is True
    assert d["nodes"] == 3
    assert d["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", K]}]
    assert d["dynamic_dims"] == [{"input": "x", "axis": 0, "symbol": "batch", "proven": False, "symbolic": True,
                                  "fixed_to": None, "min": 1, "max": 16, "sizes_passed": []}]


# --------------------------------------------------------------------------- dynamic dims


def test_check_dynamic_dim_symbolic(tmp_path):
    path = _save(_linear_model("batch"), tmp_path / "m.onnx")
    r = check(path, (parse_input(f"x:float32[batch,{K}]"),), {"batch": Dim("batch", 1, 64, 2)})
    assert r.dynamic_dims == (DimCheck("x", 0, "batch", True, None, 1, 64),)
    assert "dynamic-dim-fixed" not in _codes(r)
    assert r.ok is True


def test_check_dynamic_dim_with_other_symbol_name_is_still_symbolic(tmp_path):
    path = _save(_linear_model("s0"), tmp_path / "m.onnx")
    r = check(path, (parse_input(f"x:float32[batch,{K}]"),))
    assert r.dynamic_dims == (DimCheck("x", 0, "batch", True, None, None, None),)
    assert r.inputs[0]["shape"] == ["s0", K]


def test_check_dynamic_dim_fixed(tmp_path):
    path = _save(_linear_model(4), tmp_path / "fixed.onnx")
    r = check(path, (parse_input(f"x:float32[batch,{K}]"),), {"batch": Dim("batch", 1, 8, 2)})
    assert r.inputs == ({"name": "x", "dtype": "float32", "shape": [4, K]},)
    assert r.dynamic_dims == (DimCheck("x", 0, "batch", False, 4, 1, 8),)
    fixed = [d for d in r.diagnostics if d.code == "dynamic-dim-fixed"]
    assert len(fixed) == 1
    diag = fixed[0]
    assert diag.severity == "error"
    assert "'x'" in diag.message
    assert "axis 0" in diag.message
    assert "'batch'" in diag.message
    assert "fixed to 4" in diag.message
    assert diag.hint
    # the file itself is valid ONNX
    assert r.ok is True


def test_check_fixed_axes_of_spec_are_not_checked(tmp_path):
    path = _save(_linear_model("batch"), tmp_path / "m.onnx")
    r = check(path, (parse_input(f"x:float32[4,{K}]"),))
    assert r.dynamic_dims == ()
    assert r.diagnostics == ()


def test_check_declared_input_missing(tmp_path):
    path = _save(_linear_model("batch"), tmp_path / "m.onnx")
    r = check(path, (parse_input(f"x:float32[batch,{K}]"), parse_input("mask:int64[batch]")))
    missing = [d for d in r.diagnostics if d.code == "input-missing"]
    assert len(missing) == 1 and "'mask'" in missing[0].message
    assert [d.input for d in r.dynamic_dims] == ["x"]


def test_check_an_input_named_otherwise_is_matched_by_position(tmp_path):
    """A file whose one input is named 'features' for the model's 'x': fed by position (as parity feeds it), its
    dims checked, an info line saying so, no error."""
    path = _save(_linear_model("batch"), tmp_path / "m.onnx")
    r = check(path, (parse_input(f"features:float32[batch,{K}]"),))
    assert [d.code for d in r.diagnostics] == ["inputs-by-position"]
    assert "'x' for 'features'" in r.diagnostics[0].message
    assert [(d.input, d.symbolic) for d in r.dynamic_dims] == [("features", True)]


# --------------------------------------------------------------------------- invalid models


def test_check_unknown_op_fails_checker(tmp_path):
    model = _linear_model("batch", [helper.make_node("NoSuchOpXyz", ["y"], ["z"], name="bogus")],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", N])])
    r = check(_save(model, tmp_path / "bad.onnx"))
    assert r.ok is False
    assert r.checker_error and "NoSuchOpXyz" in r.checker_error
    checker = [d for d in r.diagnostics if d.code == "onnx-checker"]
    assert len(checker) == 1
    assert checker[0].severity == "error"
    assert "NoSuchOpXyz" in checker[0].message
    assert checker[0].hint
    # the summary is still filled in
    assert r.op_histogram["NoSuchOpXyz"] == 1
    assert r.nodes == 4


def test_check_undefined_node_input_fails_checker(tmp_path):
    model = _linear_model("batch", [helper.make_node("Add", ["y", "undefined_tensor"], ["z"], name="dangling")],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", N])])
    r = check(_save(model, tmp_path / "bad.onnx"))
    assert r.ok is False
    assert r.checker_error and "undefined_tensor" in r.checker_error
    assert "onnx-checker" in _codes(r)
    assert all(d.severity in ("error", "warning") for d in r.diagnostics)


def test_check_missing_file(tmp_path):
    with pytest.raises(UsageError) as excinfo:
        check(tmp_path / "nope.onnx")
    assert excinfo.value.exit_code == EXIT_USAGE
    assert "not found" in excinfo.value.message
    assert excinfo.value.hint


def test_check_directory_is_not_a_file(tmp_path):
    with pytest.raises(UsageError):
        check(tmp_path)


@pytest.mark.parametrize("content", [b"this is not an onnx model\n", bytes(range(256)) * 4])
def test_check_non_onnx_file(tmp_path, content):
    path = tmp_path / "junk.onnx"
    path.write_bytes(content)
    with pytest.raises(UsageError) as excinfo:
        check(path)
    assert excinfo.value.exit_code == EXIT_USAGE
    assert "not a readable ONNX file" in excinfo.value.message
    assert excinfo.value.hint


def test_check_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(UsageError):
        check(path)


# --------------------------------------------------------------------------- external data


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_save_model_inline(tmp_path):
    path = tmp_path / "inline.onnx"
    save_model(_linear_model("batch"), path, external=False)
    assert path.is_file()
    assert external_data_files(path) == []
    assert not (tmp_path / "inline.onnx.data").exists()


def test_save_move_external_data(tmp_path):
    x = np.random.default_rng(1).standard_normal((3, K)).astype(np.float32)
    w, b = _weights()
    expected = np.maximum(x @ w + b, 0.0)

    src = tmp_path / "stage" / "model.onnx"
    src.parent.mkdir()
    save_model(_linear_model("batch"), src, external=True)
    src_data = src.parent / "model.onnx.data"
    assert src_data.is_file()
    assert external_data_files(src) == [src_data]
    assert src_data.stat().st_size >= K * N * 4
    # check() counts the external data in bytes
    r = check(src)
    assert r.ok is True
    assert r.bytes == src.stat().st_size + src_data.stat().st_size
    assert r.parameters == K * N + N
    before = _run(src, x)
    np.testing.assert_allclose(before, expected, rtol=1e-5, atol=1e-5)

    dst = tmp_path / "out" / "final.onnx"
    dst.parent.mkdir()
    move_model(src, dst)
    dst_data = dst.parent / "final.onnx.data"
    assert not src.exists()
    assert not src_data.exists()
    assert dst.is_file() and dst_data.is_file()
    assert external_data_files(dst) == [dst_data]

    loaded = onnx.load(str(dst))  # loads the external weights from the renamed file
    np.testing.assert_array_equal(numpy_helper.to_array(next(t for t in loaded.graph.initializer if t.name == "W")),
                                  w)
    after = _run(dst, x)
    np.testing.assert_array_equal(after, before)


def test_move_model_inline(tmp_path):
    src = tmp_path / "a.onnx"
    save_model(_linear_model("batch"), src, external=False)
    content = src.read_bytes()
    dst = tmp_path / "b.onnx"
    move_model(src, dst)
    assert not src.exists()
    assert dst.read_bytes() == content
    assert not (tmp_path / "b.onnx.data").exists()
