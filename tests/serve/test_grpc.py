"""The Triton gRPC front, started for real beside HTTP in one process and driven by tritonclient.grpc."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from google.protobuf import json_format
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from onnxport.serve import listen, serve_app
from onnxport.serve.runner import Server
from tests.conftest import ROOT
from tests.serve.test_serve import get, metric, mlp_out, post  # noqa: F401 - mlp_out is a fixture

MAX_BODY = 256 * 1024


@contextlib.contextmanager
def serving(app, **kwargs):
    """HTTP and gRPC over ``app``'s models in one event loop, in a thread; yields (server, http, grpc) addresses."""
    server = Server(app, listen("127.0.0.1", 0), grpc_port=0, log_level="warning", **kwargs)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.started.wait(30), "the server did not start"
    try:
        yield server, f"127.0.0.1:{server.sock.getsockname()[1]}", f"127.0.0.1:{server.grpc_port}"
    finally:
        server.stop()
        thread.join(30)
        assert not thread.is_alive()


def two_output_model(path: Path) -> Path:
    """x:float32[batch,4] -> pos = relu(x), neg = -x."""
    nodes = [helper.make_node("Relu", ["x"], ["pos"]), helper.make_node("Neg", ["x"], ["neg"])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("neg", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def run_ort(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def outcome(http: str, model: str, which: str) -> float:
    """onnxport_inference_requests_total{model, outcome} from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = get(http, "/metrics")
    assert status == 200
    return sum(s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
               if s.name == "onnxport_inference_requests_total" and s.labels == {"model": model, "outcome": which})


def grpc_input(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> tg.InferInput:
    inp = tg.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return inp


def rpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def repo(tmp_path_factory, mlp_out):  # noqa: F811
    """A repository serving TinyMLP (x:float32[batch,8] -> output[batch,3]) and 'two' (two outputs)."""
    root = tmp_path_factory.mktemp("grpc") / "repo"
    (root / "TinyMLP" / "1").mkdir(parents=True)
    shutil.copyfile(mlp_out / "model.onnx", root / "TinyMLP" / "1" / "model.onnx")
    two_output_model(root / "two" / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def both(repo):
    app = serve_app(repo, max_batch=16, max_delay_ms=20, max_body_bytes=MAX_BODY)
    with serving(app) as (server, http, grpc_url):
        yield app, http, grpc_url


@pytest.fixture(scope="module")
def client(both):
    c = tg.InferenceServerClient(both[2])
    yield c
    c.close()


# ---------------------------------------------------------------- health, metadata, configuration


def test_health_and_server_metadata(client):
    from onnxport import __version__

    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta == {"name": "onnxport", "version": __version__,
                    "extensions": ["binary_tensor_data", "statistics", "model_configuration"]}
    assert client.is_model_ready("TinyMLP") and client.is_model_ready("TinyMLP", "1")
    assert not client.is_model_ready("nope")  # as Triton answers: not ready, no error
    assert not client.is_model_ready("TinyMLP", "7")
    index = client.get_model_repository_index(as_json=True)["models"]
    assert sorted((m["name"], m["version"], m["state"]) for m in index) == [("TinyMLP", "1", "READY"),
                                                                           ("two", "1", "READY")]


def test_model_metadata_and_config_are_the_http_ones(both, client):
    _, http, _ = both
    hc = th.InferenceServerClient(http)
    for name in ("TinyMLP", "two"):
        meta = client.get_model_metadata(name)  # the HTTP answer, field for field
        assert meta == json_format.ParseDict(hc.get_model_metadata(name), service_pb2.ModelMetadataResponse())
        config = client.get_model_config(name).config
        assert config == json_format.ParseDict(hc.get_model_config(name), model_config_pb2.ModelConfig())
    meta = client.get_model_metadata("TinyMLP", "1")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 8])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [("output", "FP32", [-1, 3])]
    config = client.get_model_config("TinyMLP").config
    assert config.max_batch_size == 16 and config.platform == "onnxruntime_onnx"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("x", model_config_pb2.TYPE_FP32, [8])]
    assert config.dynamic_batching.max_queue_delay_microseconds == 20000
    hc.close()


# ---------------------------------------------------------------- inference


def test_infer_raw_contents_matches_onnxruntime(both, client, repo):
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    result = client.infer("TinyMLP", [grpc_input(x)], request_id="r1")
    got = result.as_numpy("output")
    assert got.shape == (5, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, run_ort(repo / "TinyMLP" / "1" / "model.onnx", x), rtol=1e-6, atol=1e-6)
    response = result.get_response()
    assert response.id == "r1" and response.model_name == "TinyMLP" and response.model_version == "1"
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("output", "FP32", [5, 3])]
    assert len(response.raw_output_contents) == 1 and len(response.raw_output_contents[0]) == 5 * 3 * 4
    again = client.infer("TinyMLP", [grpc_input(x)], model_version="1")
    np.testing.assert_array_equal(again.as_numpy("output"), got)


def test_infer_typed_contents(both, repo):
    _, _, grpc_url = both
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="TinyMLP", id="typed")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 8])
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        response = stub.ModelInfer(request)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["output"]
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(response.outputs[0].shape))
    np.testing.assert_allclose(got, run_ort(repo / "TinyMLP" / "1" / "model.onnx", x), rtol=1e-6, atol=1e-6)


def test_requested_outputs_subset_and_order(client):
    x = np.array([[-1.0, 2.0, -3.0, 4.0], [0.5, -0.5, 0.0, 1.0]], np.float32)
    only_neg = client.infer("two", [grpc_input(x)], outputs=[tg.InferRequestedOutput("neg")])
    assert [o.name for o in only_neg.get_response().outputs] == ["neg"]
    np.testing.assert_array_equal(only_neg.as_numpy("neg"), -x)
    assert only_neg.as_numpy("pos") is None
    both_ways = client.infer("two", [grpc_input(x)], outputs=[tg.InferRequestedOutput("neg"),
                                                              tg.InferRequestedOutput("pos")])
    assert [o.name for o in both_ways.get_response().outputs] == ["neg", "pos"]
    np.testing.assert_array_equal(both_ways.as_numpy("pos"), np.maximum(x, 0))
    everything = client.infer("two", [grpc_input(x)])
    assert [o.name for o in everything.get_response().outputs] == ["pos", "neg"]


def test_concurrent_grpc_and_http_requests_share_the_batcher_and_the_metrics(both, repo):
    app, http, grpc_url = both
    served = app.state.models["TinyMLP"]
    before_ok = outcome(http, "TinyMLP", "success")
    before_runs = served.stats.executions
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1 + i % 3, 8)).astype(np.float32) for i in range(64)]
    barrier = threading.Barrier(64)

    def one(i: int) -> np.ndarray:
        x = xs[i]
        if i % 2:
            c = tg.InferenceServerClient(grpc_url)
            barrier.wait(10)
            answer = c.infer("TinyMLP", [grpc_input(x)]).as_numpy("output")
        else:
            c = th.InferenceServerClient(http)
            inp = th.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            barrier.wait(10)
            answer = c.infer("TinyMLP", [inp]).as_numpy("output")
        c.close()
        return answer

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    session = ort.InferenceSession(str(repo / "TinyMLP" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    for x, got in zip(xs, results):
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert outcome(http, "TinyMLP", "success") - before_ok == 64  # both fronts count in the same metrics
    assert served.stats.executions - before_runs == 64
    stats = tg.InferenceServerClient(grpc_url).get_inference_statistics("TinyMLP", as_json=True)
    assert int(stats["model_stats"][0]["inference_count"]) == served.stats.success


# ---------------------------------------------------------------- errors and their status codes


def _code(e: InferenceServerException) -> str:
    return e.status().removeprefix("StatusCode.")


def test_unknown_model_is_not_found(client):
    x = np.zeros((1, 8), np.float32)
    for call in (lambda: client.infer("nope", [grpc_input(x)]), lambda: client.get_model_metadata("nope"),
                 lambda: client.get_model_config("nope"), lambda: client.infer("TinyMLP", [grpc_input(x)],
                                                                               model_version="7"),
                 lambda: client.get_inference_statistics("nope")):
        e = rpc_error(call)
        assert _code(e) == "NOT_FOUND", e
    assert "unknown model 'nope'" in rpc_error(lambda: client.infer("nope", [grpc_input(x)])).message()


BAD = {
    "wrong input name": (lambda: [grpc_input(np.zeros((1, 8), np.float32), name="y")], "unknown input 'y'"),
    "wrong dtype": (lambda: [grpc_input(np.zeros((1, 8), np.int64), datatype="INT64")], "datatype 'INT64'"),
    "wrong shape": (lambda: [grpc_input(np.zeros((1, 9), np.float32))], "expects [-1, 8]"),
    "wrong rank": (lambda: [grpc_input(np.zeros(8, np.float32))], "expects [-1, 8]"),
    "batch too large": (lambda: [grpc_input(np.zeros((17, 8), np.float32))], "batch size 17"),
    "bytes do not fit the shape": (lambda: [_mislabelled()], "needs 64 bytes, got 32"),
}


def _mislabelled() -> tg.InferInput:
    inp = grpc_input(np.zeros((1, 8), np.float32))
    inp._input.shape[:] = [2, 8]  # the raw bytes still hold one row
    return inp


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_invalid_argument_and_counted(both, client, case):
    _, http, _ = both
    inputs, words = BAD[case]
    before = outcome(http, "TinyMLP", "failure")
    e = rpc_error(lambda: client.infer("TinyMLP", inputs()))
    assert _code(e) == "INVALID_ARGUMENT" and words in e.message(), e
    assert outcome(http, "TinyMLP", "failure") == before + 1
    assert client.is_server_ready()


def test_bad_requested_outputs_are_invalid_argument(client):
    x = np.zeros((1, 4), np.float32)
    e = rpc_error(lambda: client.infer("two", [grpc_input(x)], outputs=[tg.InferRequestedOutput("zzz")]))
    assert _code(e) == "INVALID_ARGUMENT" and "unknown output 'zzz'" in e.message()
    e = rpc_error(lambda: client.infer("two", [grpc_input(x)], outputs=[tg.InferRequestedOutput("pos", 2)]))
    assert _code(e) == "INVALID_ARGUMENT" and "class_count" in e.message()


def _stub_call(grpc_url: str, build) -> grpc.RpcError:
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="TinyMLP")
        build(request)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
    return err.value


def test_malformed_contents_are_invalid_argument(both):
    _, _, grpc_url = both

    def wrong_field(r):
        r.inputs.add(name="x", datatype="FP32", shape=[1, 8]).contents.int64_contents.extend([1] * 8)

    def raw_and_typed(r):
        r.inputs.add(name="x", datatype="FP32", shape=[1, 8]).contents.fp32_contents.extend([1.0] * 8)
        r.raw_input_contents.append(np.zeros(8, np.float32).tobytes())

    def too_few_values(r):
        r.inputs.add(name="x", datatype="FP32", shape=[1, 8]).contents.fp32_contents.extend([1.0] * 7)

    def raw_count(r):
        r.inputs.add(name="x", datatype="FP32", shape=[1, 8])
        r.raw_input_contents.extend([np.zeros(8, np.float32).tobytes()] * 2)

    def negative_dim(r):
        r.inputs.add(name="x", datatype="FP32", shape=[-1, 8])
        r.raw_input_contents.append(np.zeros(8, np.float32).tobytes())

    for build, words in ((wrong_field, "belong in fp32_contents"), (raw_and_typed, "both raw_input_contents"),
                         (too_few_values, "needs 8 values"), (raw_count, "2 entries for 1 inputs"),
                         (negative_dim, "non-negative")):
        e = _stub_call(grpc_url, build)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.details(), (words, e.details())


def test_oversized_message_is_refused_and_the_server_stays_healthy(both, client):
    x = np.zeros((1 + MAX_BODY // 32, 8), np.float32)  # over the 256 KiB request limit
    e = rpc_error(lambda: client.infer("TinyMLP", [grpc_input(x)]))
    assert _code(e) == "RESOURCE_EXHAUSTED" and str(MAX_BODY) in e.message(), e
    assert client.is_server_ready()
    ok = client.infer("TinyMLP", [grpc_input(np.ones((2, 8), np.float32))])
    assert ok.as_numpy("output").shape == (2, 3)


def test_internal_and_unimplemented(both, client, monkeypatch):
    app, _, _ = both
    served = app.state.models["TinyMLP"]
    monkeypatch.setattr(served, "metadata", lambda: 1 / 0)
    e = rpc_error(lambda: client.get_model_metadata("TinyMLP"))
    assert _code(e) == "INTERNAL" and "ZeroDivisionError" in e.message()
    monkeypatch.undo()
    assert client.get_model_metadata("TinyMLP").name == "TinyMLP"
    for call in (lambda: client.load_model("TinyMLP"), lambda: client.get_system_shared_memory_status()):
        e = rpc_error(call)
        assert _code(e) == "UNIMPLEMENTED" and "not supported" in e.message(), e


# ---------------------------------------------------------------- a variant served unbatched


def test_a_non_batch_invariant_variant_runs_unbatched_on_both_fronts(tmp_path, mlp_out):  # noqa: F811
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path / "int8served"
    shutil.copytree(mlp_out, folder)
    quantize_dynamic(str(mlp_out / "model.onnx"), str(folder / "best.onnx"), weight_type=QuantType.QInt8)
    rep = json.loads((mlp_out / "report.json").read_text())
    rep.update(best={"name": "int8", "path": "best.onnx", "speedup": 1.5},
               variants=[{"name": "int8", "batch_invariant": {"rows": 32, "passed": False, "max_abs_diff": 0.04}}])
    (folder / "report.json").write_text(json.dumps(rep))
    app = serve_app(folder, max_batch=16, max_delay_ms=50)
    with serving(app) as (_, http, grpc_url):
        c, hc = tg.InferenceServerClient(grpc_url), th.InferenceServerClient(http)
        config = c.get_model_config("int8served").config
        assert config == json_format.ParseDict(hc.get_model_config("int8served"), model_config_pb2.ModelConfig())
        assert config.max_batch_size == 1 and not config.HasField("dynamic_batching")
        assert "not batch-invariant" in config.parameters["onnxport_batching"].string_value
        rng = np.random.default_rng(3)
        xs = [(rng.standard_normal((1, 8)) * 10 ** (i % 4 - 1)).astype(np.float32) for i in range(16)]
        barrier = threading.Barrier(16)

        def one(x: np.ndarray) -> np.ndarray:
            own = tg.InferenceServerClient(grpc_url)
            barrier.wait(10)
            answer = own.infer("int8served", [grpc_input(x)]).as_numpy("output")
            own.close()
            return answer

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, xs))
        alone = ort.InferenceSession(str(folder / "best.onnx"), providers=["CPUExecutionProvider"])
        for x, got in zip(xs, results):  # each row answered as it is alone, not as inside a batch
            np.testing.assert_allclose(got, alone.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
        assert metric(http, "onnxport_batch_size_count", "int8served") == 16  # 16 runs ...
        assert metric(http, "onnxport_batch_size_sum", "int8served") == 16  # ... of one row each
        two = np.concatenate([xs[0], xs[3]])  # a request of two rows runs as its client sent it, alone
        inp = th.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(two, binary_data=True)
        over_http = hc.infer("int8served", [inp]).as_numpy("output")
        np.testing.assert_array_equal(c.infer("int8served", [grpc_input(two)]).as_numpy("output"), over_http)
        np.testing.assert_allclose(over_http, alone.run(None, {"x": two})[0], rtol=1e-6, atol=1e-6)
        assert metric(http, "onnxport_batch_size_count", "int8served") == 16 + 2  # still one run per request
        c.close()
        hc.close()


# ---------------------------------------------------------------- drain


def test_stop_answers_the_accepted_requests_and_refuses_new_ones(repo):
    app = serve_app(repo, max_batch=16, max_delay_ms=1)
    served = app.state.models["TinyMLP"]
    slow_run = served.batcher._run

    def slow(feeds):
        time.sleep(0.8)  # long enough to be caught in flight
        return slow_run(feeds)

    served.batcher._run = slow
    with serving(app, drain_timeout_s=20) as (server, http, grpc_url):
        c = tg.InferenceServerClient(grpc_url)
        xs = [np.full((1, 8), i, np.float32) for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(lambda x=x: tg.InferenceServerClient(grpc_url).infer("TinyMLP", [grpc_input(x)])
                                   .as_numpy("output")) for x in xs]
            deadline = time.monotonic() + 10
            while app.state.gate.in_flight < 4:
                assert time.monotonic() < deadline, app.state.gate.in_flight
                time.sleep(0.005)
            server.stop()  # what SIGTERM does
            while app.state.gate.open:
                time.sleep(0.005)
            e = rpc_error(lambda: c.infer("TinyMLP", [grpc_input(xs[0])]))
            assert _code(e) == "UNAVAILABLE" and "shutting down" in e.message()
            assert not c.is_server_ready() and not c.is_model_ready("TinyMLP") and c.is_server_live()
            status, _, body = post(http, "/v2/models/TinyMLP/infer", json.dumps(
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}]}).encode())
            assert status == 503 and "shutting down" in json.loads(body)["error"]
            assert get(http, "/v2/health/ready")[0] == 503
            answers = [p.result(30) for p in pending]
        session = ort.InferenceSession(str(repo / "TinyMLP" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        for x, got in zip(xs, answers):
            np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        c.close()
    assert server.drained is True


def test_the_gate_drains_then_waits_for_clients_to_stop_sending():
    import asyncio

    from onnxport.serve.served import Gate

    gate = Gate()
    assert gate.enter()
    gate.close()
    assert not gate.enter() and gate.in_flight == 1

    async def scenario() -> tuple[bool, float, float]:
        async def keep_sending():  # a client refused every 0.1 s for half a second
            for _ in range(5):
                await asyncio.sleep(0.1)
                assert not gate.enter()

        start = time.monotonic()
        sender = asyncio.ensure_future(keep_sending())
        timed_out = await gate.drained(time.monotonic() + 0.05)  # one request still in flight
        gate.leave()
        assert await gate.drained(time.monotonic() + 1)
        await gate.quiet(0.3, time.monotonic() + 5)  # until 0.3 s after the last refusal
        quiet_after = time.monotonic() - start
        await sender
        bounded = time.monotonic()
        await gate.quiet(10, bounded + 0.2)
        return timed_out, quiet_after, time.monotonic() - bounded

    timed_out, quiet_after, bounded = asyncio.run(scenario())
    assert timed_out is False
    assert 0.75 <= quiet_after < 3, quiet_after
    assert 0.15 <= bounded < 1, bounded


def test_cli_serves_grpc_and_exits_0_on_sigterm(mlp_out):  # noqa: F811
    http_port, grpc_port = (listen("127.0.0.1", 0) for _ in range(2))
    ports = [s.getsockname()[1] for s in (http_port, grpc_port)]
    for s in (http_port, grpc_port):
        s.close()
    proc = subprocess.Popen([sys.executable, "-m", "onnxport", "serve", str(mlp_out), "--port", str(ports[0]),
                             "--grpc-port", str(ports[1])], cwd=ROOT, env=dict(os.environ, COLUMNS="200"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        c = tg.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            with contextlib.suppress(InferenceServerException):
                if c.is_server_ready():
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        x = np.ones((3, 8), np.float32)
        np.testing.assert_allclose(c.infer("TinyMLP", [grpc_input(x)]).as_numpy("output"),
                                   run_ort(mlp_out / "model.onnx", x), rtol=1e-6, atol=1e-6)
        c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert f"gRPC (KServe v2 / Triton inference.GRPCInferenceService) on 127.0.0.1:{ports[1]}" in err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_cli_without_grpc_installed_says_what_to_install(mlp_out):  # noqa: F811
    code = ("import sys; sys.modules['grpc'] = None; from onnxport.cli import main; "
            f"sys.argv = ['onnxport', 'serve', {str(mlp_out)!r}, '--grpc-port', '8001']; main()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="200"))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 4 and len(lines) == 1, proc.stderr
    assert "grpcio" in lines[0] and "pip install 'onnxport[grpc]'" in lines[0]
