"""Open Inference Protocol v2 (KServe v2 / Triton HTTP, and Triton gRPC) server with dynamic batching and
Prometheus metrics.

``serve_app(PATH)`` builds the app; ``run(PATH)`` serves it with uvicorn (and gRPC with ``grpc_port``). PATH is
an onnxport output folder, a single .onnx file or a Triton-style model repository (``DIR/<name>/config.pbtxt``,
``DIR/<name>/1/model.onnx``). FastAPI, uvicorn and grpcio are imported only when a server is built.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from onnxport.core.options import RuntimeOptions
from onnxport.serve.models import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    discover,
    signature,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["serve_app", "run", "listen", "require_grpc", "discover", "signature", "DEFAULT_MAX_BATCH",
           "DEFAULT_MAX_DELAY_MS", "DEFAULT_MAX_BODY_BYTES"]


def _require(package: str) -> None:
    import importlib.util

    from onnxport.core.errors import EnvironmentProblem

    if importlib.util.find_spec(package) is None:
        raise EnvironmentProblem(f"the Python package '{package}' is not installed (the server needs it)",
                                 "pip install fastapi uvicorn prometheus-client", code="missing-dependency")


def serve_app(path: str | Path, *, max_batch: int | None = None, max_delay_ms: float | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, name: str | None = None,
              runtime: RuntimeOptions | None = None) -> FastAPI:
    """Build the OIP v2 app for PATH, loading every model now (a model that fails to load raises UsageError).

    ``max_batch``: largest batch per ONNX Runtime run and per request (None: the repository config, else
    32; 1 turns batching off). ``max_delay_ms``: how long the first queued request waits for others
    (None: the repository config, else 2 ms). ``max_body_bytes``: larger request bodies get 413. ``name``:
    the served name of the one model of a folder or file (default: the folder's or file's name).
    ``runtime``: the device the sessions run on (default: the CPU).
    """
    for package in ("fastapi", "uvicorn", "prometheus_client"):
        _require(package)
    from onnxport.serve.app import serve_app as _serve_app

    return _serve_app(path, max_batch=max_batch, max_delay_ms=max_delay_ms, max_body_bytes=max_body_bytes,
                      name=name, runtime=runtime or RuntimeOptions())


def run(path: str | Path, host: str = "127.0.0.1", port: int = 8000, *, max_batch: int | None = None,
        max_delay_ms: float | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        graceful_timeout_s: float = 30.0, log_level: str = "info", name: str | None = None,
        sock: socket.socket | None = None, grpc_port: int | None = None, runtime: RuntimeOptions | None = None) -> None:
    """Serve PATH over HTTP (and gRPC on ``grpc_port``, same host, when given) until SIGINT/SIGTERM, then
    drain: new requests get 503 / UNAVAILABLE, the ones already accepted are answered (up to
    ``graceful_timeout_s``) and it returns. ``sock``: a socket already listening on host:port (see
    :func:`listen`); ``runtime``: the device (default: the CPU) and custom-op libraries. Both fronts share the models, their batchers, the metrics and the request size limit."""
    if grpc_port is not None:
        require_grpc()
    sock = sock if sock is not None else listen(host, port)
    app = serve_app(path, max_batch=max_batch, max_delay_ms=max_delay_ms, max_body_bytes=max_body_bytes, name=name,
                    runtime=runtime)
    from onnxport.serve.runner import Server

    server = Server(app, sock, host=host, grpc_port=grpc_port, drain_timeout_s=graceful_timeout_s,
                    log_level=log_level)
    server.run()


def require_grpc() -> None:
    """EnvironmentProblem (one line, with the install command) when the gRPC front's packages are missing."""
    from onnxport.core.errors import missing_dependency

    try:
        import grpc  # noqa: F401
    except ImportError:
        raise missing_dependency("grpcio", "grpc") from None
    try:
        from tritonclient.grpc import service_pb2  # noqa: F401
    except ImportError:
        raise missing_dependency("tritonclient[grpc]", "grpc") from None


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (UsageError when the address is taken or invalid)."""
    from onnxport.core.errors import UsageError

    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit TCP_NODELAY: without it a response written in two parts waits for the
        # client's delayed ACK (~40 ms per request on Linux loopback, measured)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(info[4])
        sock.listen(2048)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                         "pick a free port with --port, or stop the process that holds it") from None
    return sock
