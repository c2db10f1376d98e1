"""The OIP v2 server, started for real with uvicorn and driven by tritonclient.http and raw HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as th
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from onnxport.core.errors import UsageError
from onnxport.runtime.sessions import OrtOptions
from onnxport.serve import listen, serve_app
from tests.conftest import MODELS, ROOT

MAX_BODY = 256 * 1024


# ---------------------------------------------------------------- helpers shared with test_deploy


@contextlib.contextmanager
def running(app):
    """Serve ``app`` with uvicorn on 127.0.0.1:<free port> in a thread; yields 'host:port'."""
    import uvicorn

    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """POST raw bytes; returns (status, headers, body)."""
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def metric(url: str, name: str, model: str) -> float:
    """One sample of /metrics, e.g. metric(url, 'onnxport_batch_size_count', 'TinyMLP')."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = get(url, "/metrics")
    assert status == 200
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model:
                total += sample.value
    return total


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    """The plain onnxruntime result for one request."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def fixed_shape_model(path: Path) -> Path:
    """A tiny ONNX model without a batch dim: y = relu(x) * 2 on float32[2, 3]."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])]
    graph = helper.make_graph(nodes, "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def mlp_out(tmp_path_factory) -> Path:
    """TinyMLP exported by onnxport: OUT/model.onnx with x:float32[batch,8] -> output:float32[batch,3]."""
    from onnxport import api

    out = tmp_path_factory.mktemp("serve") / "TinyMLP"  # served under the folder's name
    rep = api.export(f"{MODELS}:TinyMLP", out, inputs=["x:float32[batch,8]"], exporter="torchscript")
    assert rep["status"] == "ok", rep.get("summary")
    return out


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(mlp_out):
    with running(serve_app(mlp_out, max_batch=16, max_delay_ms=20, max_body_bytes=MAX_BODY)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    c = th.InferenceServerClient(server)
    yield c
    c.close()


def ready(url: str) -> int:
    return get(url, "/v2/health/ready")[0]


# ---------------------------------------------------------------- protocol


def test_health_metadata_and_config(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "onnxport"
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready("TinyMLP")
    meta = client.get_model_metadata("TinyMLP")
    assert meta == {"name": "TinyMLP", "versions": ["1"], "platform": "onnxruntime_onnx",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
                    "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]}
    assert client.get_model_metadata("TinyMLP", model_version="1") == meta
    config = client.get_model_config("TinyMLP")
    assert config["max_batch_size"] == 16 and config["platform"] == "onnxruntime_onnx"
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [8]}]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
    assert get(server, "/v2/health/live")[0] == 200
    assert get(server, "/v2/models/TinyMLP/versions/7")[0] == 404
    assert get(server, "/v2/models/TinyMLP/ready")[0] == 200
    status, body = get(server, "/v2/models/nope/ready")
    assert status == 404 and "unknown model 'nope'" in json.loads(body)["error"]
    stats = client.get_inference_statistics("TinyMLP")["model_stats"][0]
    assert stats["name"] == "TinyMLP" and stats["version"] == "1"


@pytest.mark.parametrize("binary_in,binary_out", [(False, False), (True, True), (True, False), (False, True)])
def test_infer_matches_onnxruntime(client, mlp_out, binary_in, binary_out):
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    inp = th.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    out = th.InferRequestedOutput("output", binary_data=binary_out)
    result = client.infer("TinyMLP", [inp], outputs=[out], request_id="r1")
    got = result.as_numpy("output")
    assert got.shape == (5, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(mlp_out / "model.onnx", x), rtol=1e-6, atol=1e-6)
    response = result.get_response()
    assert response["id"] == "r1" and response["model_name"] == "TinyMLP"
    assert ("binary_data_size" in response["outputs"][0].get("parameters", {})) == binary_out
    # no outputs requested: tritonclient asks for binary_data_output, every output comes back binary
    everything = client.infer("TinyMLP", [inp], model_version="1")
    np.testing.assert_allclose(everything.as_numpy("output"), got, rtol=1e-6, atol=1e-6)


def test_infer_json_nested_data_and_gzip(server, mlp_out):
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": x.tolist()}]}
    status, _, raw = post(server, "/v2/models/TinyMLP/infer", json.dumps(body).encode())
    assert status == 200, raw
    out = json.loads(raw)["outputs"][0]
    assert out["name"] == "output" and out["shape"] == [2, 3] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 3),
                               reference(mlp_out / "model.onnx", x), rtol=1e-6, atol=1e-6)
    import gzip

    status, headers, raw = post(server, "/v2/models/TinyMLP/versions/1/infer", gzip.compress(json.dumps(body).encode()),
                                {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(raw))["outputs"][0]["data"] == out["data"]


def test_concurrent_requests_are_batched_and_answered_each_with_its_own_result(server, mlp_out):
    before_batches = metric(server, "onnxport_batch_size_count", "TinyMLP")
    before_rows = metric(server, "onnxport_batch_size_sum", "TinyMLP")
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1 + i % 3, 8)).astype(np.float32) for i in range(64)]
    barrier = threading.Barrier(64)

    def one(x: np.ndarray) -> np.ndarray:
        c = th.InferenceServerClient(server)
        try:
            inp = th.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            barrier.wait(10)
            return c.infer("TinyMLP", [inp]).as_numpy("output")
        finally:
            c.close()

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, xs))
    session = ort.InferenceSession(str(mlp_out / "model.onnx"), providers=["CPUExecutionProvider"])
    for x, got in zip(xs, results):
        assert got.shape == (x.shape[0], 3)
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    batches = metric(server, "onnxport_batch_size_count", "TinyMLP") - before_batches
    rows = metric(server, "onnxport_batch_size_sum", "TinyMLP") - before_rows
    assert rows == sum(x.shape[0] for x in xs)
    assert batches < 64, f"64 concurrent requests ran in {batches} batches: nothing was batched"
    assert metric(server, "onnxport_inference_requests_total", "TinyMLP") >= 64
    assert metric(server, "onnxport_queue_seconds_count", "TinyMLP") >= 64
    assert metric(server, "onnxport_compute_seconds_count", "TinyMLP") >= batches


# ---------------------------------------------------------------- bad requests


def _tensor(**overrides) -> dict:
    return {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8, **overrides}


BAD = {
    "wrong dtype": ({"inputs": [_tensor(datatype="INT64", data=[1] * 8)]}, 400, "datatype"),
    "unknown dtype": ({"inputs": [_tensor(datatype="FLOAT")]}, 400, "datatype"),
    "wrong dim": ({"inputs": [_tensor(shape=[1, 9], data=[0.5] * 9)]}, 400, "shape"),
    "wrong rank": ({"inputs": [_tensor(shape=[8], data=[0.5] * 8)]}, 400, "shape"),
    "count mismatch": ({"inputs": [_tensor(shape=[2, 8])]}, 400, "needs 16 values"),
    "strings as data": ({"inputs": [_tensor(data=["a"] * 8)]}, 400, "data"),
    "ragged data": ({"inputs": [_tensor(shape=[2, 8], data=[[0.5] * 8, [1.0]])]}, 400, "ragged"),
    "nested rows mismatch": ({"inputs": [_tensor(data=[[0.5] * 8, [1.0]])]}, 400, "needs 8 values"),
    "missing input": ({"inputs": []}, 400, "inputs"),
    "unknown input": ({"inputs": [_tensor(name="y")]}, 400, "unknown input"),
    "duplicate input": ({"inputs": [_tensor(), _tensor()]}, 400, "twice"),
    "no data": ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8]}]}, 400, "no 'data'"),
    "batch too large": ({"inputs": [_tensor(shape=[17, 8], data=[0.5] * 136)]}, 400, "batch size 17"),
    "batch zero": ({"inputs": [_tensor(shape=[0, 8], data=[])]}, 400, "batch size 0"),
    "negative dim": ({"inputs": [_tensor(shape=[-1, 8])]}, 400, "shape"),
    "unknown output": ({"inputs": [_tensor()], "outputs": [{"name": "zzz"}]}, 400, "unknown output"),
    "output asked twice": ({"inputs": [_tensor()], "outputs": [{"name": "output"}] * 1000}, 400, "asked twice"),
    "null data": ({"inputs": [_tensor(data=[None] * 8)]}, 400, "holds nulls"),
    "not an object": ([1, 2, 3], 400, "JSON object"),
    "NaN data": ({"inputs": [_tensor(data=[float("nan")] * 8)]}, 400, "holds NaN"),
    "infinite data": ({"inputs": [_tensor(data=[0.5] * 7 + [float("-inf")])]}, 400, "holds -Infinity"),
    "lone surrogate": ({"inputs": [_tensor()], "id": "a\udc00"}, 400, "not valid Unicode"),
    "binary size too big": ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                         "parameters": {"binary_data_size": 10_000}}]}, 400, "binary_data_size"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_gets_4xx_and_server_stays_healthy(server, case):
    body, status, words = BAD[case]
    got, headers, raw = post(server, "/v2/models/TinyMLP/infer", json.dumps(body).encode())
    assert got == status, raw
    assert words in json.loads(raw)["error"]
    assert ready(server) == 200


def test_malformed_json_oversize_body_and_unknown_model(server):
    status, _, raw = post(server, "/v2/models/TinyMLP/infer", b'{"inputs": [')
    assert status == 400 and "not valid JSON" in json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/TinyMLP/infer", b"[" * 100_000)  # deep nesting
    assert status == 400 and json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/TinyMLP/infer", json.dumps({"inputs": [_tensor()]}).replace(
        "0.5]", "1e400]").encode())
    assert status == 400 and "past the largest float64" in json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/TinyMLP/infer", b" " * (MAX_BODY + 1))
    assert status == 413 and "limit" in json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/nope/infer", json.dumps({"inputs": [_tensor()]}).encode())
    assert status == 404 and "unknown model" in json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/TinyMLP/infer", b"{}", {"Inference-Header-Content-Length": "99"})
    assert status == 400 and "Inference-Header-Content-Length" in json.loads(raw)["error"]
    status, body = get(server, "/v2/no/such/route")
    assert status == 404 and json.loads(body)["error"]
    assert ready(server) == 200


def test_tritonclient_sees_the_error_status(client):
    x = np.zeros((1, 8), np.int64)
    inp = th.InferInput("x", [1, 8], "INT64")
    inp.set_data_from_numpy(x, binary_data=True)
    with pytest.raises(InferenceServerException, match="datatype") as err:
        client.infer("TinyMLP", [inp])
    assert err.value.status() == "400"
    assert client.is_server_ready()


def test_fuzzed_infer_bodies_never_get_a_5xx(server):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                        st.text(max_size=5))
    junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=5), inner, max_size=4), max_leaves=12)
    shapes = st.one_of(st.lists(st.integers(-2, 20), max_size=4), junk)
    tensors = st.fixed_dictionaries({}, optional={
        "name": st.one_of(st.just("x"), st.just("y"), junk), "datatype": st.sampled_from(
            ["FP32", "FP16", "INT64", "BOOL", "BYTES", "fp32", 7]), "shape": shapes,
        "data": st.one_of(st.lists(st.floats(-1e3, 1e3), max_size=40), st.lists(st.lists(st.integers(), max_size=9),
                                                                               max_size=5), junk),
        "parameters": st.one_of(st.fixed_dictionaries({"binary_data_size": st.integers(-5, 50)}), junk)})
    bodies = st.one_of(junk, st.fixed_dictionaries({}, optional={
        "inputs": st.one_of(st.lists(tensors, max_size=3), junk), "outputs": st.one_of(
            st.lists(st.fixed_dictionaries({"name": st.sampled_from(["output", "zz"])}, optional={
                "parameters": junk}), max_size=2), junk),
        "id": junk, "parameters": junk}))

    seen = set()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=bodies, binary=st.binary(max_size=40), header_length=st.one_of(st.none(), st.integers(-3, 200)))
    def fuzz(body, binary, header_length):
        raw = json.dumps(body).encode()
        headers = {}
        if header_length is not None:
            headers["Inference-Header-Content-Length"] = str(min(header_length, len(raw)) if header_length > 0
                                                              else header_length)
            raw += binary
        status, _, answer = post(server, "/v2/models/TinyMLP/infer", raw, headers)
        seen.add(status)
        assert status < 500, answer
        if status >= 400:
            assert isinstance(json.loads(answer)["error"], str)

    fuzz()
    assert 400 in seen
    assert ready(server) == 200


# ---------------------------------------------------------------- model kinds and loading


def test_fixed_shape_model_is_served_without_batching(tmp_path):
    path = fixed_shape_model(tmp_path / "fixed.onnx")
    with running(serve_app(path, max_delay_ms=50)) as url:
        c = th.InferenceServerClient(url, concurrency=16)
        meta = c.get_model_metadata("fixed")
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3]}]
        assert c.get_model_config("fixed")["max_batch_size"] == 0
        xs = [np.full((2, 3), i - 8, np.float32) for i in range(16)]
        pending = []
        for x in xs:
            inp = th.InferInput("x", [2, 3], "FP32")
            inp.set_data_from_numpy(x)
            pending.append(c.async_infer("fixed", [inp]))
        for x, p in zip(xs, pending):
            np.testing.assert_array_equal(p.get_result().as_numpy("y"), np.maximum(x, 0) * 2)
        c.close()
        assert metric(url, "onnxport_batch_size_count", "fixed") == 16
        assert metric(url, "onnxport_batch_size_sum", "fixed") == 16  # each run held one request
        status, _, raw = post(url, "/v2/models/fixed/infer",
                              json.dumps({"inputs": [_tensor(shape=[4, 3], data=[1.0] * 12)]}).encode())
        assert status == 400 and "expects [2, 3]" in json.loads(raw)["error"]


def test_a_model_that_fails_to_load_stops_start_up(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx file")
    with pytest.raises(UsageError, match="broken.onnx"):
        serve_app(broken)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no model to serve"):
        serve_app(tmp_path / "empty")
    with pytest.raises(UsageError, match="does not exist"):
        serve_app(tmp_path / "missing")
    with pytest.raises(UsageError, match="cannot listen"), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        listen("127.0.0.1", taken.getsockname()[1])


def test_tuned_session_options_come_from_report_json(tmp_path, mlp_out):
    from onnxport.serve import discover

    out = tmp_path / "tuned"
    out.mkdir()
    (out / "model.onnx").write_bytes((mlp_out / "model.onnx").read_bytes())
    report = json.loads((mlp_out / "report.json").read_text())
    report["benchmark"] = {"tuned": {"intra_op_num_threads": 1, "inter_op_num_threads": 1,
                                     "execution_mode": "sequential", "graph_optimization_level": "basic",
                                     "enable_mem_pattern": False, "enable_cpu_mem_arena": True}}
    (out / "report.json").write_text(json.dumps(report))
    (source,) = discover(out)
    assert source.name == "tuned"  # named after the folder, whatever the model's class
    assert discover(out, "renamed")[0].name == "renamed"
    assert source.tuned == OrtOptions(intra_op_num_threads=1, inter_op_num_threads=1, execution_mode="sequential",
                                      graph_optimization_level="basic", enable_mem_pattern=False,
                                      enable_cpu_mem_arena=True)
    app = serve_app(out)
    session = app.state.models["tuned"].session
    assert session.get_session_options().intra_op_num_threads == 1
    assert session.get_session_options().enable_mem_pattern is False
    report["benchmark"]["tuned"]["execution_mode"] = "sideways"
    (out / "report.json").write_text(json.dumps(report))
    with pytest.raises(UsageError, match="execution_mode"):
        serve_app(out)


def test_run_shuts_down_gracefully_finishing_the_request_in_flight(mlp_out):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"from onnxport.serve import ServeOptions, run; "
            f"run({str(mlp_out)!r}, ServeOptions(port={port}, log_level='warning'))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            with contextlib.suppress(OSError):
                if ready(f"127.0.0.1:{port}") == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = json.dumps({"inputs": [_tensor()]}).encode()
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        head = (f"POST /v2/models/TinyMLP/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        conn.sendall(head + body[:10])  # the request is in flight ...
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)  # ... when the server is told to stop
        time.sleep(0.5)
        conn.sendall(body[10:])
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        conn.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert b'"model_name":"TinyMLP"' in answer
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
