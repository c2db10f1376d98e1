"""The FastAPI app: OIP v2 / Triton HTTP routes, Prometheus metrics and Triton-style statistics."""

from __future__ import annotations

import contextlib
import json
import logging
import zlib
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from onnxport.core.errors import UsageError
from onnxport.core.options import RuntimeOptions
from onnxport.core.version import __version__ as ONNXPORT_VERSION
from onnxport.serve.batcher import InferenceError, ShuttingDown
from onnxport.serve.models import DEFAULT_MAX_BODY_BYTES, discover
from onnxport.serve.protocol import BadRequest, InferRequest, encode, inflate, split_body
from onnxport.serve.served import EXTENSIONS, SERVER_NAME, Gate, Metrics, ServedModel, find, load, offload


class _Drain:
    """ASGI middleware: while the server drains (its gate closed), new requests get 503 and every answer
    closes its connection; the health routes and /metrics keep answering."""

    OPEN_PATHS = ("/v2/health/live", "/v2/health/ready", "/metrics")

    def __init__(self, app, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if not self.gate.enter():
            body = json.dumps({"error": "the server is shutting down"}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return

        async def closing_send(message: dict) -> None:
            if message["type"] == "http.response.start" and not self.gate.open:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, closing_send)
        finally:
            self.gate.leave()


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body (before its Content-Encoding): 413 at once when its Content-Length is over ``limit``,
    and as soon as more than ``limit`` bytes arrive when it has none."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadRequest("invalid Content-Length header")
        if int(length) > limit:
            raise BadRequest(f"the request body is {int(length)} bytes; the limit is {limit}", 413)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadRequest(f"the request body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
    except ClientDisconnect:  # went away mid-body, or its body timed out (answered 408): one line, no traceback
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        logging.getLogger("uvicorn.error").info("%s went away before its request body arrived (%d bytes of it)",
                                                client, size)
        raise BadRequest("the client went away before its request body arrived", 400) from None
    return b"".join(chunks)


async def _json_body(request: Request, limit: int) -> object:
    """The body of a JSON-only route (generate), inflated and parsed (in the parse pool when large)."""
    body = await _read_body(request, limit)
    encoding = request.headers.get("content-encoding", "identity")
    return await offload(len(body), lambda: split_body(inflate(body, encoding, limit), None)[0])


def _compress(body: bytes, accept: str) -> tuple[bytes, str | None]:
    accept = accept.lower()
    if "gzip" in accept:
        c = zlib.compressobj(wbits=31)
        return c.compress(body) + c.flush(), "gzip"
    if "deflate" in accept:
        return zlib.compress(body), "deflate"
    return body, None


def build_app(models: list[ServedModel], metrics: Metrics, *, max_body_bytes: int,
              gate: Gate | None = None) -> FastAPI:
    """The FastAPI app serving ``models``. ``app.state`` keeps what a gRPC front shares with it: ``models``
    (by name), ``metrics``, ``gate`` (closed on shutdown: new requests get 503) and ``max_body_bytes``."""
    by_name = {m.name: m for m in models}
    gate = gate if gate is not None else Gate()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.ready = True
        yield
        app.state.ready = False
        for m in models:
            await m.batcher.close()

    app = FastAPI(title="onnxport", version=ONNXPORT_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(_Drain, gate=gate)
    app.state.ready = True
    app.state.models = by_name
    app.state.metrics = metrics
    app.state.gate = gate
    app.state.max_body_bytes = max_body_bytes

    def is_ready() -> bool:
        return bool(app.state.ready and gate.open)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(str(exc.detail), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(f"invalid request: {exc.errors()}", 400)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return _error(f"internal server error: {type(exc).__name__}: {str(exc)[:300]}", 500)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(exc.message, exc.status)

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {"name": SERVER_NAME, "version": ONNXPORT_VERSION, "extensions": [*EXTENSIONS, "generate"]}

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if is_ready() else 503)

    @app.get("/v2/models/stats")
    @app.get("/v2/models/{name}/stats")
    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def model_stats(name: str | None = None, version: str | None = None) -> dict:
        chosen = [find(by_name, name, version)] if name else list(by_name.values())
        return {"model_stats": [m.statistics() for m in chosen]}

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict:
        return find(by_name, name, version).metadata()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        find(by_name, name, version)
        return Response(status_code=200 if is_ready() else 503)

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str | None = None) -> dict:
        return find(by_name, name, version).config()

    @app.post("/v2/repository/index")
    async def repository_index() -> list:
        return [{"name": m.name, "version": m.source.version, "state": "READY"} for m in models]

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        m = find(by_name, name, version)

        async def parsed() -> InferRequest:
            body = await _read_body(request, max_body_bytes)
            encoding = request.headers.get("content-encoding", "identity")
            # a compressed body inflates many times over: from 1 KiB on the wire, it is parsed in the pool
            size = len(body) * (1 if encoding.strip().lower() in ("", "identity") else 64)
            return await offload(size, m.parse, body, encoding=encoding,
                                 header_length=request.headers.get("inference-header-content-length"),
                                 limit=max_body_bytes)

        try:
            payload, header_length = await m.infer(
                parsed(), lambda req, outputs: encode(m.name, m.source.version, req, outputs, m.signature))
        except InferenceError as e:
            return _error(str(e), 503 if isinstance(e, ShuttingDown) else 400)
        accept = request.headers.get("accept-encoding", "")
        payload, encoding = await offload(len(payload) if accept else 0, _compress, payload, accept)
        headers = {"Content-Encoding": encoding} if encoding else {}
        if header_length is None:
            return Response(payload, media_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(header_length)
        return Response(payload, media_type="application/octet-stream", headers=headers)

    @app.post("/v2/models/{name}/generate")
    @app.post("/v2/models/{name}/versions/{version}/generate")
    async def generate(name: str, request: Request, version: str | None = None) -> Response:
        m = find(by_name, name, version)
        body = await _json_body(request, max_body_bytes) if m.generator else None
        req, outcome = m.generate_request(body)
        return JSONResponse(await m.generate(req, outcome))

    @app.post("/v2/models/{name}/generate_stream")
    @app.post("/v2/models/{name}/versions/{version}/generate_stream")
    async def generate_stream(name: str, request: Request, version: str | None = None) -> Response:
        m = find(by_name, name, version)
        body = await _json_body(request, max_body_bytes) if m.generator else None
        req, outcome = m.generate_request(body)  # a bad request is a 4xx before the stream starts
        return StreamingResponse(m.generate_stream(req, outcome), media_type="text/event-stream; charset=utf-8",
                                 headers={"Cache-Control": "no-cache"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def serve_app(path: str | Path, *, max_batch: int | None = None, max_delay_ms: float | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, name: str | None = None,
              runtime: RuntimeOptions = RuntimeOptions()) -> FastAPI:
    """An OIP v2 app serving PATH (output folder, .onnx file or Triton repository); loads every model now, on
    ``runtime``'s device. ``name`` renames the one model of a folder or file."""
    if max_body_bytes <= 0:
        raise UsageError(f"max_body_bytes must be positive, got {max_body_bytes}", "pass a size in bytes")
    metrics = Metrics()
    models = [load(source, max_batch, max_delay_ms, metrics, runtime) for source in discover(path, name)]
    return build_app(models, metrics, max_body_bytes=max_body_bytes)
