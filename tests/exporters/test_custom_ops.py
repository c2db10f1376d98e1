"""Custom operators: autograd.Function.symbolic through both exporters, and their ONNX Runtime implementations
(a Python one through onnxruntime-extensions, a compiled library loaded with --custom-op-library)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime_extensions as ortx
import pytest
import torch

from onnxport import api
from onnxport.core.errors import UsageError
from onnxport.exporters import custom_ops
from onnxport.runtime.sessions import session
from tests.conftest import FIXTURES, ROOT, load_report

MODELS = FIXTURES / "custom_op_models.py"
LIBRARY_MODEL = FIXTURES / "custom_op_library_model.py"
SPEC = {"inputs": ["x:float32[batch,8]"], "dims": ["batch=1..16"]}


CALLS: list[tuple] = []


@custom_ops.ort_python_op("unit_domain::Clamp01", attrs={"hi": float})
def clamp01(x, hi):
    """Registered at import, like a model file would: before any session loads onnxruntime-extensions' ops."""
    CALLS.append(x.shape)
    return np.clip(x, 0.0, hi).astype(np.float32)


@pytest.fixture(autouse=True)
def no_leftover_libraries():
    """Libraries load into every later session of the process: each test starts and ends without any."""
    custom_ops.reset(python_ops=False)
    yield
    custom_ops.reset(python_ops=False)


def nodes(path) -> list[tuple[str, str, dict]]:
    model = onnx.load(str(path), load_external_data=False)
    return [(n.domain, n.op_type, {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
            for n in model.graph.node]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_my_gelu_exports_as_gelu_with_both_exporters(tmp_path, exporter):
    rep = api.export(f"{MODELS}:GeluNet", tmp_path, exporter=exporter, **SPEC)
    load_report(tmp_path)
    assert rep["status"] == "ok", rep["summary"]
    assert rep["export"]["exporter"] == exporter
    ops = [op for _, op, _ in nodes(tmp_path / "model.onnx")]
    assert ops.count("Gelu") == 1 and "Erf" not in ops  # the Function's own math is not traced through
    assert rep["export"]["opset"] >= 20
    assert [f["onnx_ops"] for f in rep["export"]["custom_ops"]] == [["Gelu"]]
    assert rep["export"]["custom_ops"][0]["function"] == "custom_op_models.py:MyGELU"
    assert len(rep["validation"]["cases"]) >= 4 and all(c["passed"] for c in rep["validation"]["cases"])
    assert max(c["max_abs_err"] for c in rep["validation"]["cases"]) < 1e-5


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_custom_domain_op_is_proven_through_its_python_implementation(tmp_path, exporter):
    rep = api.export(f"{MODELS}:ShiftNet", tmp_path, exporter=exporter, **SPEC)
    assert rep["status"] == "ok", rep["summary"]
    custom = [(d, op, attrs) for d, op, attrs in nodes(tmp_path / "model.onnx") if d]
    assert custom == [("test_domain", "ScaledShift", {"alpha": pytest.approx(0.5), "shift": 3})]
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert ("test_domain", 1) in [(o.domain, o.version) for o in model.opset_import]
    assert {f["function"].split(":")[1]: f["arguments"] for f in rep["export"]["custom_ops"]} == \
        {"MyGELU": ["Tensor"], "ScaledShift": ["Tensor", "float", "int"]}
    assert all(c["passed"] for c in rep["validation"]["cases"])
    # the file on disk keeps the user's domain; only the session's copy moves it into onnxruntime-extensions'
    assert not list(tmp_path.glob(".*ortx.onnx"))


def test_custom_domain_op_without_implementation_says_how_to_provide_one(tmp_path):
    api.export(f"{MODELS}:ShiftNet", tmp_path, exporter="torchscript", **SPEC)
    with custom_ops.python_ops_suspended(), pytest.raises(UsageError) as e:
        session(tmp_path / "model.onnx")
    assert "test_domain:ScaledShift" in e.value.message and "--custom-op-library" in e.value.hint
    sess = session(tmp_path / "model.onnx")  # registered again: it loads and computes x * 0.5 + 3 after the Gelu
    assert sess.get_inputs()[0].name == "x"


def test_python_implementation_runs_in_onnxruntime():
    """The registered numpy function computes the node's output inside an ONNX Runtime session."""
    from onnx import TensorProto, helper

    CALLS.clear()
    node = helper.make_node("Clamp01", ["x"], ["y"], domain="unit_domain", hi=0.5)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("unit_domain", 1)],
                              ir_version=10)
    path = FIXTURES.parent.parent / "test-artifacts"
    path.mkdir(exist_ok=True)
    onnx.save(model, str(path / "clamp01.onnx"))
    out = session(path / "clamp01.onnx").run(None, {"x": np.array([-1.0, 0.25, 2.0], np.float32)})[0]
    np.testing.assert_array_equal(out, np.array([0.0, 0.25, 0.5], np.float32))
    assert CALLS == [(3,)]
    assert custom_ops.model_custom_ops(model) == [("unit_domain", "Clamp01")]


def test_standard_op_names_are_refused_for_python_implementations():
    with pytest.raises(UsageError):
        custom_ops.ort_python_op("Gelu")


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_compiled_custom_op_library_proves_the_model(tmp_path, exporter, cli):
    """A real compiled library (onnxruntime-extensions' own .so, ``Inverse``) loaded with --custom-op-library.

    Run in a process of its own: that .so is also the Python extension holding this process's Python ops."""
    out = tmp_path / "out"
    res = cli("export", f"{LIBRARY_MODEL}:InverseNet", "-i", "x:float32[batch,16]", "-d", "batch=2..8",
              "--exporter", exporter, "-o", str(out), "--custom-op-library", ortx.get_library_path(), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    load_report(out)
    assert ("ai.onnx.contrib", "Inverse") in [(d, op) for d, op, _ in nodes(out / "model.onnx")]
    assert rep["export"]["custom_ops"][0]["onnx_ops"] == ["ai.onnx.contrib::Inverse"]
    assert len(rep["validation"]["cases"]) >= 3 and all(c["passed"] for c in rep["validation"]["cases"])


def test_without_the_library_the_proof_fails_with_the_reason(tmp_path, cli):
    out = tmp_path / "out"
    res = cli("export", f"{LIBRARY_MODEL}:InverseNet", "-i", "x:float32[batch,16]", "-d", "batch=2..8",
              "--exporter", "torchscript", "-o", str(out), "--json")
    assert res.returncode == 1, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    diag = next(d for d in rep["diagnostics"] if d["code"] == "onnxruntime-load-failed")
    assert "ai.onnx.contrib:Inverse" in diag["message"] and "--custom-op-library" in diag["hint"]
    assert (out / "model.unverified.onnx").is_file() and not (out / "model.onnx").exists()
    bad = cli("export", f"{LIBRARY_MODEL}:InverseNet", "-i", "x:float32[batch,16]", "-o", str(tmp_path / "b"),
              "--custom-op-library", str(tmp_path / "nope.so"))
    assert bad.returncode == 2 and "custom-op library not found" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_library_paths_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        custom_ops.add_library(tmp_path / "missing.so")
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"not a shared object")
    with pytest.raises(UsageError, match="cannot load the custom-op library"):
        custom_ops.add_library(fake)
    assert custom_ops.libraries() == ()


def test_discovery_records_argument_kinds_and_emitted_ops():
    import importlib.util

    spec = importlib.util.spec_from_file_location("custom_op_models_unit", MODELS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found = custom_ops.discover(mod.ShiftNet().eval(), (torch.randn(2, 8),))
    by_name = {f.cls.__name__: f for f in found}
    assert set(by_name) == {"MyGELU", "ScaledShift"}
    assert by_name["ScaledShift"].kinds == ("Tensor", "float", "int")
    assert by_name["ScaledShift"].onnx_ops == ("test_domain::ScaledShift",)
    assert by_name["ScaledShift"].domains == ("test_domain",)
    assert by_name["MyGELU"].n_outputs == 1
    assert custom_ops.discover(torch.nn.Linear(2, 2), (torch.randn(1, 2),)) == ()
    assert "apply" not in vars(mod.MyGELU)  # the recording patch is gone


@pytest.mark.slow
def test_worked_example_through_the_cli(tmp_path, cli):
    out = tmp_path / "out"
    res = cli("export", f"{ROOT / 'examples' / 'custom_ops.py'}:CustomNet", "-i", "x:float32[batch,16]",
              "-d", "batch=1..32", "--exporter", "dynamo", "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert [o for f in rep["export"]["custom_ops"] for o in f["onnx_ops"]] == ["Gelu", "custom_domain::MyCustomOp"]
    assert rep["runtime"]["providers_used"] == ["CPUExecutionProvider"]
    assert "runtime   cpu · CPUExecutionProvider (" in res.stderr
    assert {(d, op) for d, op, _ in nodes(out / "model.onnx")} >= {("", "Gelu"), ("custom_domain", "MyCustomOp")}



def test_new_python_op_after_sessions_is_refused_not_a_crash(tmp_path):
    api.export(f"{MODELS}:ShiftNet", tmp_path, exporter="torchscript", **SPEC)  # a session ran ScaledShift
    with pytest.raises(UsageError, match="at import time"):
        custom_ops.ort_python_op("late_domain::Late")(lambda x: x)

    @custom_ops.ort_python_op("test_domain::ScaledShift", attrs={"alpha": float, "shift": int})
    def again(x, alpha, shift):  # the same op again (a model file imported twice) only swaps the function
        return (x * alpha + shift).astype(np.float32)

    assert custom_ops.python_ops()[("test_domain", "ScaledShift")] is again


def test_dynamo_translation_with_two_outputs_and_constants(tmp_path):
    rep = api.export(f"{MODELS}:TwoWaysNet", tmp_path, exporter="dynamo", **SPEC)
    assert rep["status"] == "ok", rep["summary"]
    fn = rep["export"]["custom_ops"][0]
    assert fn["outputs"] == 2 and fn["onnx_ops"] == ["Constant", "Constant", "Mul", "Add"]
    ops = [op for _, op, _ in nodes(tmp_path / "model.onnx")]
    assert ops.count("Mul") == 1 and ops.count("Add") == 1 and ops[-1] == "Sub"
    assert all(c["passed"] and c["max_abs_err"] == 0.0 for c in rep["validation"]["cases"])


class _WithNone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, maybe):
        return x + 1

    @staticmethod
    def symbolic(g, x, maybe):
        return g.op("Add", x, x)


def test_calls_that_cannot_be_one_node_are_left_to_tracing():
    class Uses(torch.nn.Module):
        def forward(self, x):
            return _WithNone.apply(x, None)

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("cannot run here")

    assert custom_ops.discover(Uses(), (torch.randn(2, 2),)) == ()  # None cannot be an input or attribute
    assert custom_ops.discover(Broken(), (torch.randn(2, 2),)) == ()  # parity reports the failure, not discovery
    assert "apply" not in vars(_WithNone)


@pytest.mark.slow
def test_convert_with_benchmark_leaves_the_working_directory_clean(tmp_path):
    """ONNX Runtime's symbolic shape inference (FLOP count) gives up on custom ops and saves a model into the
    working directory; onnxport runs it in a temporary one."""
    import os
    import subprocess
    import sys

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT),
                                                                    os.environ.get("PYTHONPATH", "")])))
    res = subprocess.run([sys.executable, "-m", "onnxport", "convert", f"{ROOT / 'examples' / 'custom_ops.py'}:CustomNet",
                          "-i", "x:float32[batch,16]", "-d", "batch=1..8", "--exporter", "torchscript",
                          "-o", str(tmp_path / "out")], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["benchmark"]["runs"]
    assert list(cwd.iterdir()) == []
