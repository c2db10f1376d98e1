"""An output holding NaN or ±Infinity, served for real on 127.0.0.1: the JSON answer stays strict JSON (the
values written as proto3's strings "NaN", "Infinity", "-Infinity"), tritonclient reads them back as the same
floats, and the binary tensor extension keeps their bits."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tritonclient.http as th
from onnx import TensorProto, helper

from onnxport.serve import serve_app
from tests.serve.test_serve import post, running


def _strict(raw: bytes) -> dict:
    def refuse(word: str):
        raise AssertionError(f"not strict JSON: bare {word}")

    return json.loads(raw, parse_constant=refuse)


@pytest.fixture(scope="module")
def log_server(tmp_path_factory):
    """A model whose output is log(x): -inf at 0, NaN below 0, and +inf from 1/x at 0 (a second output)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["log"]), helper.make_node("Reciprocal", ["x"], ["inv"])], "g", [x],
        [helper.make_tensor_value_info("log", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("inv", TensorProto.FLOAT, ["batch", 4])])
    path = tmp_path_factory.mktemp("nonfinite") / "log.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    with running(serve_app(path, max_delay_ms=1)) as url:
        yield url


def test_non_finite_outputs_are_strict_json_words(log_server):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0, -1.0, 1.0, 4.0]}]}
    status, headers, raw = post(log_server, "/v2/models/log/infer", json.dumps(body).encode())
    assert status == 200 and headers["content-type"].startswith("application/json")
    outputs = {o["name"]: o for o in _strict(raw)["outputs"]}
    assert outputs["log"]["data"][:3] == ["-Infinity", "NaN", 0.0]
    assert outputs["log"]["data"][3] == pytest.approx(np.log(4.0))
    assert outputs["inv"]["data"] == ["Infinity", -1.0, 1.0, 0.25]


def test_finite_outputs_stay_numbers(log_server):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 4.0, 8.0]}]}
    status, _, raw = post(log_server, "/v2/models/log/infer", json.dumps(body).encode())
    assert status == 200 and all(isinstance(v, float) for o in _strict(raw)["outputs"] for v in o["data"])


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_reads_the_non_finite_values_back(log_server, binary):
    client = th.InferenceServerClient(log_server)
    inp = th.InferInput("x", [2, 4], "FP32")
    x = np.array([[0.0, -1.0, 1.0, 4.0], [-0.0, 2.0, -3.0, 0.5]], np.float32)
    inp.set_data_from_numpy(x, binary_data=binary)
    outs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("log", "inv")]
    with np.errstate(all="ignore"):
        want_log, want_inv = np.log(x), np.reciprocal(x)
    got = client.infer("log", [inp], outputs=outs)
    assert got.as_numpy("log").dtype == np.float32
    np.testing.assert_array_equal(got.as_numpy("log"), want_log)  # NaN equals NaN here, ±inf keep their sign
    np.testing.assert_array_equal(got.as_numpy("inv"), want_inv)
