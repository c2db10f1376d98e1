"""Hostile or careless clients: slow or silent connections are closed within the timeouts, large bodies are
parsed off the event loop (health checks keep answering), cheap checks run before values are parsed, and every
serve / triton option is checked before any model loads (exit 2, one line)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnxport.serve import Timeouts, listen, serve_app
from onnxport.serve.runner import Server
from tests.serve.test_serve import get, post

FAST = Timeouts(header_s=0.6, body_s=0.6, idle_s=0.6)
SLACK_S = 2.0  # how much later than its timeout a connection may close on a busy machine


def relu_model(path: Path) -> Path:
    """y = relu(x) on float32[batch, 8]."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@contextlib.contextmanager
def serving(app, timeouts: Timeouts = FAST):
    """``app`` under the real server (runner.Server) in a thread; yields 'host:port'."""
    server = Server(app, listen("127.0.0.1", 0), log_level="warning", timeouts=timeouts)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.started.wait(30), "the server did not start"
    try:
        yield f"127.0.0.1:{server.sock.getsockname()[1]}"
    finally:
        server.stop()
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return relu_model(tmp_path_factory.mktemp("hardening") / "relu.onnx")


@pytest.fixture(scope="module")
def url(model):
    with serving(serve_app(model, max_batch=16, max_delay_ms=1, max_body_bytes=8 * 2**20)) as address:
        yield address


def _connect(url: str) -> socket.socket:
    host, port = url.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _closed_after(conn: socket.socket, trickle: bytes = b"", every_s: float = 0.1) -> tuple[float, bytes]:
    """Send ``trickle`` a byte every ``every_s`` seconds (nothing when empty) until the server closes the
    connection; returns (seconds until it closed, what it answered)."""
    start, answer = time.monotonic(), b""
    conn.settimeout(every_s)
    for i in range(10_000):
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            if trickle:
                with contextlib.suppress(OSError):
                    conn.send(trickle[i % len(trickle):i % len(trickle) + 1])
            assert time.monotonic() - start < 30, "the server never closed the connection"
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        answer += chunk
    return time.monotonic() - start, answer


# ---------------------------------------------------------------- timeouts


@contextlib.contextmanager
def server_log():
    """The records the server logs meanwhile (uvicorn's loggers do not reach the root logger)."""
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def test_a_client_gone_mid_body_is_one_line_not_a_traceback(url):
    """Disconnecting halfway through the body, or a body that times out (408): no ASGI traceback in the log."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}]}).encode()
    head = (b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with server_log() as records:
        with _connect(url) as conn:
            conn.sendall(head + body[:10])
            time.sleep(0.2)
        with _connect(url) as conn:
            conn.sendall(head + body[:5])
            _closed_after(conn, trickle=body[5:])
        time.sleep(0.5)
    assert not [r for r in records if r.exc_info or "Exception in ASGI" in r.getMessage()], \
        [r.getMessage() for r in records]
    assert get(url, "/v2/health/ready")[0] == 200


def test_an_idle_connection_is_closed_within_the_idle_timeout(url):
    with _connect(url) as conn:  # opens and says nothing
        took, answer = _closed_after(conn)
    assert answer == b"" and took < FAST.idle_s + SLACK_S, took
    with _connect(url) as conn:  # one request, then silence: the keep-alive idle time
        conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        took, answer = _closed_after(conn)
    assert answer.startswith(b"HTTP/1.1 200") and took < FAST.idle_s + SLACK_S, (took, answer)


def test_headers_sent_a_byte_at_a_time_are_cut_off_with_408(url):
    with _connect(url) as conn:
        conn.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: x\r\n")
        took, answer = _closed_after(conn, trickle=b"X-Slow: aaaaaaaa\r\n")  # never ends its headers
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"request headers did not arrive" in answer
    assert took < FAST.header_s + SLACK_S, took


def test_a_body_sent_a_byte_at_a_time_is_cut_off_with_408(url):
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}]}).encode()
    with _connect(url) as conn:
        conn.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        took, answer = _closed_after(conn, trickle=body[5:])  # ~10 bytes a second: never done in time
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"request body did not arrive" in answer
    assert took < FAST.body_s + SLACK_S, took
    assert get(url, "/v2/health/ready")[0] == 200


def test_requests_in_time_are_served_and_a_slow_answer_is_not_cut_off(url, monkeypatch):
    """The deadlines cover what the client sends; the time the server takes to answer is not one of them."""
    from onnxport.serve import served

    original = served.ServedModel.parse

    def slow_parse(self, body, **kwargs):
        time.sleep(FAST.body_s * 2)  # in the parse pool: the event loop and its timers run meanwhile
        return original(self, body, **kwargs)

    monkeypatch.setattr(served.ServedModel, "parse", slow_parse)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": [-1.0, 2.0] * 8}]})
    padded = body.replace('"inputs"', " " * (served.INLINE_BYTES + 1) + '"inputs"', 1)
    status, _, raw = post(url, "/v2/models/relu/infer", padded.encode())
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == [0.0, 2.0] * 8


@pytest.mark.parametrize("field,value", [("header_s", 0), ("body_s", float("nan")), ("idle_s", -1.0),
                                         ("idle_s", float("inf"))])
def test_timeouts_must_be_finite_and_positive(field, value):
    from onnxport.core.errors import UsageError

    with pytest.raises(UsageError, match=field.replace("_s", "")):
        Timeouts(**{field: value}).checked()


# ---------------------------------------------------------------- large bodies


def _big_body(rows: int) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 8],
                                   "data": [0.25] * (rows * 8)}]}).encode()


def test_health_checks_answer_while_large_bodies_are_parsed(url, monkeypatch):
    """Three large bodies are held inside their parse; the health check is answered meanwhile, and then every
    large request is answered too. Were the bodies parsed on the event loop, the loop would be stuck in the
    first parse and the health check would wait for it."""
    from onnxport.serve import served

    release, entered, lock = threading.Event(), [], threading.Lock()
    original = served.ServedModel.parse

    def held_parse(self, body, **kwargs):
        with lock:
            entered.append(len(body))
        assert release.wait(30), "never released"
        return original(self, body, **kwargs)

    monkeypatch.setattr(served.ServedModel, "parse", held_parse)
    body = _big_body(16)  # within the batch limit ...
    body = body.replace(b'"data": [', b'"data": [' + b" " * (2 * served.INLINE_BYTES))  # ... and over INLINE_BYTES
    with ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(post, url, "/v2/models/relu/infer", body) for _ in range(3)]
        deadline = time.monotonic() + 30
        while len(entered) < min(3, served.PARSE_THREADS):
            assert time.monotonic() < deadline, "the bodies never reached their parse"
            time.sleep(0.01)
        assert get(url, "/v2/health/live")[0] == 200  # answered while the large requests are in flight
        assert get(url, "/v2/health/ready")[0] == 200
        assert not any(p.done() for p in pending)
        release.set()
        answers = [p.result(60) for p in pending]
    assert [status for status, _, _ in answers] == [200, 200, 200], answers[0][2][:300]


def test_batch_limit_is_checked_before_the_values_are_converted(url, monkeypatch):
    from onnxport.serve import protocol

    def never(*args, **kwargs):
        raise AssertionError("values converted before the cheap checks")

    monkeypatch.setattr(protocol, "_json_tensor", never)
    status, _, raw = post(url, "/v2/models/relu/infer", _big_body(20_000))  # 160,000 values, batch 20,000 > 16
    assert status == 400 and "batch size 20000 is outside 1..16" in json.loads(raw)["error"], raw
    wrong_count = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": [1.0] * 15}]})
    status, _, raw = post(url, "/v2/models/relu/infer", wrong_count.encode())
    assert status == 400 and "needs 16 values" in json.loads(raw)["error"], raw


def test_content_length_over_the_limit_is_refused_before_the_body_is_read(url):
    with _connect(url) as conn:
        conn.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (9 * 2**20))
        conn.settimeout(10)
        answer = conn.recv(65536)  # no byte of the body was sent
    assert answer.startswith(b"HTTP/1.1 413"), answer


# ---------------------------------------------------------------- the command line


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, list[str]]:
    """``onnxport ARGS`` in this process: (exit code, non-empty stderr lines)."""
    from onnxport.cli import main

    monkeypatch.setattr(sys, "argv", ["onnxport", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.fixture
def truncated(tmp_path, model) -> Path:
    """A .onnx file cut short: loading it fails, so an option error proves it came before the load."""
    path = tmp_path / "truncated.onnx"
    path.write_bytes(model.read_bytes()[:40])
    return path


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


SERVE_CASES = [
    (["--max-delay-ms", "-1"], "--max-delay-ms"),
    (["--max-delay-ms", "nan"], "--max-delay-ms"),
    (["--max-delay-ms", "1e9"], "--max-delay-ms"),
    (["--max-body-mb", "nan"], "--max-body-mb"),
    (["--max-body-mb", "inf"], "--max-body-mb"),
    (["--max-body-mb", "0"], "--max-body-mb"),
    (["--max-body-mb", "4096"], "--max-body-mb"),
    (["--max-batch", "-1"], "--max-batch"),
    (["--header-timeout-s", "0"], "--header-timeout-s"),
    (["--body-timeout-s", "nan"], "--body-timeout-s"),
    (["--idle-timeout-s", "-5"], "--idle-timeout-s"),
]


@pytest.mark.parametrize("args,option", SERVE_CASES, ids=[" ".join(c[0]) for c in SERVE_CASES])
def test_serve_options_are_checked_before_any_model_loads(monkeypatch, capsys, truncated, args, option):
    code, lines = _cli(monkeypatch, capsys, "serve", str(truncated), "--port", _free_port(), *args)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error:") and option in lines[0] and "Hint:" in lines[0], lines[0]


def test_serve_prints_its_start_up_lines_only_once_every_model_loaded(monkeypatch, capsys, truncated):
    code, lines = _cli(monkeypatch, capsys, "serve", str(truncated), "--port", _free_port())
    assert code == 2 and len(lines) == 1, lines  # no "serving ... on http://..." before the failure
    assert lines[0].startswith("error:") and "truncated.onnx" in lines[0], lines[0]


def test_triton_options_are_checked_before_the_model_is_read(monkeypatch, capsys, tmp_path, model):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    repo = tmp_path / "repo"
    cases = [
        (["--name", "../../escape"], "--name"),
        (["--name", "a/b"], "--name"),
        (["--max-delay-ms", "-1"], "--max-delay-ms"),
        (["--max-delay-ms", "nan"], "--max-delay-ms"),
        (["--max-batch", "-1"], "--max-batch"),
        (["--instances", "0"], "--instances"),
    ]
    for args, option in cases:
        code, lines = _cli(monkeypatch, capsys, "triton", str(model), "--repo", str(repo), *args)
        assert code == 2 and len(lines) == 1, (args, lines)
        assert lines[0].startswith("error:") and option in lines[0] and "Hint:" in lines[0], lines[0]
        assert not repo.exists()
    for target in (a_file, a_file / "inside"):
        code, lines = _cli(monkeypatch, capsys, "triton", str(model), "--repo", str(target))
        assert code == 2 and len(lines) == 1, lines
        assert "--repo" in lines[0] and "not a folder" in lines[0], lines[0]
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_triton_refuses_a_long_name_a_dangling_link_and_a_repo_inside_out(monkeypatch, capsys, tmp_path, model):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    cases = [(["--repo", str(tmp_path / "repo"), "--name", "n" * 300], "300 characters"),
             (["--repo", str(link)], "a link to nothing"),
             (["--repo", str(link / "inside")], "a link to nothing")]
    for args, words in cases:
        code, lines = _cli(monkeypatch, capsys, "triton", str(model), *args)
        assert code == 2 and len(lines) == 1, (args, lines)
        assert words in lines[0] and "Hint:" in lines[0], lines[0]
    assert not (tmp_path / "repo").exists() and not (tmp_path / "nowhere").exists()
    from onnxport.core.errors import UsageError
    from onnxport.serve.models import check_repository_folder

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UsageError, match="inside the output folder"):
        check_repository_folder(out / "repo", out)


def test_triton_removes_the_folder_it_made_when_it_fails(monkeypatch, capsys, tmp_path, model):
    from onnxport.serve import repository

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(repository, "_copy_onnx", fail)
    repo = tmp_path / "new" / "repo"
    code, lines = _cli(monkeypatch, capsys, "triton", str(model), "--repo", str(repo))
    assert code == 4 and "no space left" in lines[-1], lines
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_triton_refuses_a_read_only_repo(monkeypatch, capsys, tmp_path, model):
    repo = tmp_path / "ro"
    repo.mkdir()
    repo.chmod(0o500)
    try:
        code, lines = _cli(monkeypatch, capsys, "triton", str(model), "--repo", str(repo))
    finally:
        repo.chmod(0o700)
    assert code == 2 and len(lines) == 1 and "cannot be written" in lines[0], lines


def test_triton_names_the_missing_file_of_a_multi_file_output(monkeypatch, capsys, tmp_path, model):
    out = tmp_path / "t5-out"
    out.mkdir()
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        (out / name).write_bytes(model.read_bytes())
    code, lines = _cli(monkeypatch, capsys, "triton", str(out), "--repo", str(tmp_path / "repo"))
    assert code == 2 and len(lines) == 1 and "lacks decoder_with_past_model.onnx" in lines[0], lines
    assert not (tmp_path / "repo").exists()


def test_serve_names_the_missing_file_of_a_multi_file_output(monkeypatch, capsys, tmp_path, model):
    """serve on an encoder-decoder's output without decoder_with_past_model.onnx names it, as triton does."""
    out = tmp_path / "t5-out"
    out.mkdir()
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        (out / name).write_bytes(model.read_bytes())
    code, lines = _cli(monkeypatch, capsys, "serve", str(out), "--port", "1")  # refused before it binds
    assert code == 2 and len(lines) == 1 and "lacks decoder_with_past_model.onnx" in lines[0], lines
