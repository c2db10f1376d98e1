"""Open Inference Protocol v2 (KServe v2 / Triton HTTP, and Triton gRPC) server with dynamic batching and
Prometheus metrics.

``serve_app(PATH)`` builds the app; ``run(PATH)`` serves it with uvicorn (and gRPC with ``grpc_port``). PATH is
an onnxport output folder, a single .onnx file or a Triton-style model repository (``DIR/<name>/config.pbtxt``,
``DIR/<name>/1/model.onnx``). FastAPI, uvicorn and grpcio are imported only when a server is built.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onnxport.core.errors import UsageError
from onnxport.core.options import RuntimeOptions
from onnxport.serve.connections import Timeouts
from onnxport.serve.models import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    discover,
    signature,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["serve_app", "run", "ServeOptions", "listen", "require_grpc", "discover", "signature", "check_limits", "Timeouts",
           "DEFAULT_MAX_BATCH", "DEFAULT_MAX_DELAY_MS", "DEFAULT_MAX_BODY_BYTES", "MAX_BODY_BYTES", "MAX_DELAY_MS"]

MAX_BODY_BYTES = 2**31 - 1  # gRPC's largest message
MAX_DELAY_MS = 60_000.0
MAX_BATCH = 2**31 - 1


def check_limits(*, max_batch: int | None = None, max_delay_ms: float | None = None,
                 max_body_bytes: float = DEFAULT_MAX_BODY_BYTES, flags: bool = False) -> None:
    """UsageError (exit 2) for a limit that is not a finite number in range, raised before any model loads:
    ``max_batch`` in 0..2**31-1, ``max_delay_ms`` in [0, 60000], ``max_body_bytes`` in 1..2**31-1 (gRPC's
    largest message). ``flags``: the message names the command-line options (--max-body-mb in MiB), else the
    keywords."""
    def bad(value: object, low: float, high: float) -> bool:
        return (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or not low <= value <= high)

    if max_batch is not None and (bad(max_batch, 0, MAX_BATCH) or not isinstance(max_batch, int)):
        raise UsageError(f"{'--max-batch' if flags else 'max_batch'} must be an integer in 0..{MAX_BATCH}, "
                         f"got {max_batch}", "pass 1 to turn batching off, or the largest batch to run")
    if max_delay_ms is not None and bad(max_delay_ms, 0, MAX_DELAY_MS):
        raise UsageError(f"{'--max-delay-ms' if flags else 'max_delay_ms'} must be a number of milliseconds in "
                         f"[0, {MAX_DELAY_MS:g}], got {max_delay_ms}", "pass e.g. 2 (0: never wait to fill a batch)")
    if bad(max_body_bytes, 1, MAX_BODY_BYTES):
        if flags:
            raise UsageError(f"--max-body-mb must be a size in MiB in (0, {MAX_BODY_BYTES / 2**20:.0f}), got "
                             f"{max_body_bytes / 2**20 if isinstance(max_body_bytes, (int, float)) else max_body_bytes}",
                             "pass the largest request body to accept, e.g. --max-body-mb 64")
        raise UsageError(f"max_body_bytes must be in 1..{MAX_BODY_BYTES}, got {max_body_bytes}", "pass a size in bytes")


def _require(package: str) -> None:
    import importlib.util

    from onnxport.core.errors import EnvironmentProblem

    if importlib.util.find_spec(package) is None:
        raise EnvironmentProblem(f"the Python package '{package}' is not installed (the server needs it)",
                                 "pip install fastapi uvicorn prometheus-client", code="missing-dependency")


def serve_app(path: str | Path, *, max_batch: int | None = None, max_delay_ms: float | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, name: str | None = None,
              runtime: RuntimeOptions | None = None) -> FastAPI:
    """Build the OIP v2 app for PATH, loading every model now (a model that fails to load raises UsageError;
    so does a limit out of range, before any model loads).

    ``max_batch``: largest batch per ONNX Runtime run and per request (None: the repository config, else
    32; 1 turns batching off). ``max_delay_ms``: how long the first queued request waits for others
    (None: the repository config, else 2 ms). ``max_body_bytes``: larger request bodies get 413. ``name``:
    the served name of the one model of a folder or file (default: the folder's or file's name).
    ``runtime``: the device the sessions run on (default: the CPU).
    """
    check_limits(max_batch=max_batch, max_delay_ms=max_delay_ms, max_body_bytes=max_body_bytes, flags=False)
    for package in ("fastapi", "uvicorn", "prometheus_client"):
        _require(package)
    from onnxport.serve.app import serve_app as _serve_app

    return _serve_app(path, max_batch=max_batch, max_delay_ms=max_delay_ms, max_body_bytes=max_body_bytes,
                      name=name, runtime=runtime or RuntimeOptions())


@dataclass(frozen=True)
class ServeOptions:
    """How :func:`run` serves: the address, the batching and size limits, the drain time, the log level, the
    model name for a single file, the gRPC port (None: HTTP only) and the HTTP client timeouts."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int | None = None
    max_delay_ms: float | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    graceful_timeout_s: float = 30.0
    log_level: str = "info"
    name: str | None = None
    grpc_port: int | None = None
    timeouts: Timeouts = Timeouts()


def run(path: str | Path, options: ServeOptions = ServeOptions(), *, sock: socket.socket | None = None,
        runtime: RuntimeOptions | None = None, on_loaded: Callable[[FastAPI], None] | None = None) -> None:
    """Serve PATH over HTTP (and gRPC on ``options.grpc_port``, same host, when given) until SIGINT/SIGTERM,
    then drain: new requests get 503 / UNAVAILABLE, the ones already accepted are answered (up to
    ``graceful_timeout_s``) and it returns. ``sock``: a socket already listening on host:port (see
    :func:`listen`); ``runtime``: the device (default: the CPU) and custom-op libraries; ``on_loaded(app)``:
    called once every model has loaded, before serving. Both fronts share the models, their batchers, the
    metrics and the request size limit."""
    o = options
    check_limits(max_batch=o.max_batch, max_delay_ms=o.max_delay_ms, max_body_bytes=o.max_body_bytes, flags=False)
    o.timeouts.checked()
    if o.grpc_port is not None:
        require_grpc()
    sock = sock if sock is not None else listen(o.host, o.port)
    app = serve_app(path, max_batch=o.max_batch, max_delay_ms=o.max_delay_ms, max_body_bytes=o.max_body_bytes,
                    name=o.name, runtime=runtime)
    from onnxport.serve.runner import Server

    server = Server(app, sock, host=o.host, grpc_port=o.grpc_port, drain_timeout_s=o.graceful_timeout_s,
                    log_level=o.log_level, timeouts=o.timeouts)
    if on_loaded is not None:
        on_loaded(app)
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
