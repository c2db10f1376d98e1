"""serve and triton read report.json's ``benchmark.tuned`` once into ModelSource.tuned (runtime.OrtOptions): the
session opens with what it sets and ONNX Runtime's defaults for the rest, Triton's parameters say the same, and a
report without tuned options serves with ONNX Runtime's defaults."""

from __future__ import annotations

import json

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxport.core.errors import UsageError
from onnxport.runtime.sessions import OrtOptions
from onnxport.serve.models import discover, signature
from onnxport.serve.repository import triton_repository
from onnxport.serve.served import Metrics, device_options, load
from onnxport.serve.triton import model_config

FULL = {"intra_op_num_threads": 2, "inter_op_num_threads": 2, "execution_mode": "parallel",
        "graph_optimization_level": "basic", "enable_mem_pattern": False, "enable_cpu_mem_arena": False}


def _out(folder, tuned=None, *, report: bool = True):
    folder.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    if report:
        (folder / "report.json").write_text(json.dumps({"model": {"name": "relu"},
                                                        **({"benchmark": {"tuned": tuned}} if tuned else {})}))
    return folder


def _options(session) -> tuple:
    o = session.get_session_options()
    return (o.intra_op_num_threads, o.inter_op_num_threads, o.execution_mode, o.graph_optimization_level,
            o.enable_mem_pattern, o.enable_cpu_mem_arena)


def _params(config: dict) -> dict:
    return {k: v["string_value"] for k, v in config["parameters"].items()}


@pytest.mark.parametrize("report", [True, False])
def test_no_tuned_options_serve_with_onnx_runtimes_defaults(tmp_path, report):
    (source,) = discover(_out(tmp_path / "plain", report=report))
    assert source.tuned is None and source.threads is None and source.session_options == {}
    assert device_options(source) == {}
    served = load(source, None, None, Metrics())
    assert _options(served.session) == _options(ort.InferenceSession(str(source.onnx_path)))
    assert _params(served.config()) == {"intra_op_thread_count": "0", "inter_op_thread_count": "0"}


@pytest.mark.parametrize("tuned", [FULL, {"config": FULL, "p50_ms": 0.5, "baseline_p50_ms": 0.6}])
def test_the_tuned_options_open_the_session_and_write_the_config(tmp_path, tuned):
    out = _out(tmp_path / "tuned", tuned)
    (source,) = discover(out)
    assert source.tuned == OrtOptions.from_dict(FULL) and source.threads == 2
    served = load(source, None, None, Metrics())
    assert _options(served.session) == (2, 2, ort.ExecutionMode.ORT_PARALLEL,
                                        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, False, False)
    want = {"intra_op_thread_count": "2", "inter_op_thread_count": "2", "execution_mode": "1"}
    assert _params(served.config()) == want
    repo = triton_repository(out, tmp_path / "repo")
    assert 'key: "execution_mode"\n  value {\n    string_value: "1"' in repo.config_path.read_text()
    (back,) = discover(tmp_path / "repo")  # the repository keeps the thread counts only
    assert back.tuned == OrtOptions(intra_op_num_threads=2, inter_op_num_threads=2, execution_mode=None,
                                    graph_optimization_level=None)


def test_a_partly_tuned_report_leaves_the_rest_to_onnx_runtime(tmp_path):
    (source,) = discover(_out(tmp_path / "part", {"intra_op_num_threads": 3}))
    assert device_options(source) == {"threads": 3, "options": source.tuned}
    served = load(source, None, None, Metrics())
    default = _options(ort.InferenceSession(str(source.onnx_path)))
    assert _options(served.session) == (3, *default[1:])
    assert _params(served.config()) == {"intra_op_thread_count": "3", "inter_op_thread_count": "0"}  # no mode given
    (seq,) = discover(_out(tmp_path / "seq", {"execution_mode": "sequential"}))
    assert _params(load(seq, None, None, Metrics()).config())["execution_mode"] == "0"  # given: written


def test_a_bad_tuned_option_is_the_same_usage_error_for_serve_and_triton(tmp_path):
    out = _out(tmp_path / "bad", {"config": {"graph_optimization_level": "max"}})
    for read in (discover, lambda p: triton_repository(p, tmp_path / "repo")):
        with pytest.raises(UsageError, match="report.json benchmark.tuned.graph_optimization_level is 'max'"):
            read(out)


def test_a_repositorys_thread_count_still_sets_the_threads(tmp_path):
    """What sets the threads of a served repository model (``onnxport serve`` has no --threads of its own): its
    config.pbtxt's intra_op_thread_count, read into the record and opened with it."""
    triton_repository(_out(tmp_path / "out", {"intra_op_num_threads": 3}), tmp_path / "repo", name="m")
    (source,) = discover(tmp_path / "repo")
    assert source.tuned == OrtOptions(intra_op_num_threads=3, execution_mode=None, graph_optimization_level=None)
    assert source.session_options == {"threads": 3, "options": source.tuned}
    assert load(source, None, None, Metrics()).session.get_session_options().intra_op_num_threads == 3


def test_model_config_writes_the_record_and_nothing_for_what_it_leaves_unset(tmp_path):
    sig = signature(_out(tmp_path / "kw", report=False) / "model.onnx")
    record = OrtOptions(intra_op_num_threads=2, inter_op_num_threads=2, execution_mode="parallel")
    assert model_config(sig, "m", tuned=record)["parameters"] == {
        "intra_op_thread_count": {"string_value": "2"}, "inter_op_thread_count": {"string_value": "2"},
        "execution_mode": {"string_value": "1"}}
    assert model_config(sig, "m") == model_config(sig, "m", tuned=OrtOptions.unset())
    assert "execution_mode" not in model_config(sig, "m", tuned=OrtOptions.unset())["parameters"]
