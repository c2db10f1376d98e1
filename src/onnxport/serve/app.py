"""The FastAPI app: OIP v2 / Triton HTTP routes (with those of the extensions the families add), Prometheus
metrics and Triton-style statistics."""

from __future__ import annotations

import contextlib
import json
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client import generate_latest as exposition
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from onnxport.core.errors import UsageError
from onnxport.core.options import RuntimeOptions
from onnxport.core.version import __version__ as ONNXPORT_VERSION
from onnxport.families.serving import Extension, Verb, extensions
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
    """The body of a JSON-only route (an extension's), inflated and parsed (in the parse pool when large)."""
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


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _error(str(exc.detail), exc.status_code)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _error(f"invalid request: {exc.errors()}", 400)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return _error(f"internal server error: {type(exc).__name__}: {str(exc)[:300]}", 500)


async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
    return _error(exc.message, exc.status)


# Every error answers {"error": message}: (exception class, handler).
ERROR_HANDLERS: tuple[tuple[type[Exception], Callable[..., Awaitable[JSONResponse]]], ...] = (
    (StarletteHTTPException, _http_error), (RequestValidationError, _validation_error), (Exception, _server_error),
    (BadRequest, _bad_request))


class Handlers:
    """The route handlers of one app, over its ``app.state`` (the models by name, the metrics, the drain gate,
    the body limit, whether it is ready) and its ``models`` in order."""

    def __init__(self, state: State, models: list[ServedModel]) -> None:
        self.state = state
        self.models = models

    def _find(self, name: str | None, version: str | None) -> ServedModel:
        return find(self.state.models, name, version)

    def _is_ready(self) -> bool:
        return bool(self.state.ready and self.state.gate.open)

    async def server_metadata(self) -> dict:
        return {"name": SERVER_NAME, "version": ONNXPORT_VERSION,
                "extensions": [*EXTENSIONS, *(ext.name for ext in extensions())]}

    async def live(self) -> Response:
        return Response(status_code=200)

    async def ready(self) -> Response:
        return Response(status_code=200 if self._is_ready() else 503)

    async def model_stats(self, name: str | None = None, version: str | None = None) -> dict:
        chosen = [self._find(name, version)] if name else list(self.state.models.values())
        return {"model_stats": [m.statistics() for m in chosen]}

    async def model_metadata(self, name: str, version: str | None = None) -> dict:
        return self._find(name, version).metadata()

    async def model_ready(self, name: str, version: str | None = None) -> Response:
        self._find(name, version)
        return Response(status_code=200 if self._is_ready() else 503)

    async def model_config(self, name: str, version: str | None = None) -> dict:
        return self._find(name, version).config()

    async def repository_index(self) -> list:
        return [{"name": m.name, "version": m.source.version, "state": "READY"} for m in self.models]

    async def infer(self, name: str, request: Request, version: str | None = None) -> Response:
        m = self._find(name, version)
        limit = self.state.max_body_bytes

        async def parsed() -> InferRequest:
            body = await _read_body(request, limit)
            encoding = request.headers.get("content-encoding", "identity")
            # a compressed body inflates many times over: from 1 KiB on the wire, it is parsed in the pool
            size = len(body) * (1 if encoding.strip().lower() in ("", "identity") else 64)
            return await offload(size, m.parse, body, encoding=encoding,
                                 header_length=request.headers.get("inference-header-content-length"), limit=limit)

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

    async def extension(self, ext: Extension, verb: Verb, name: str, request: Request,
                        version: str | None = None) -> Response:
        """A verb of an extension: the request checked (a bad request is a 4xx here, before any stream starts),
        then one JSON answer or server-sent events."""
        m = self._find(name, version)
        body = await _json_body(request, self.state.max_body_bytes) if ext.name in m.extensions else None
        req, outcome = m.extension_request(ext, body)
        if not verb.stream:
            return JSONResponse(await m.answer(ext, req, outcome))
        return StreamingResponse(m.events(ext, req, outcome), media_type="text/event-stream; charset=utf-8",
                                 headers={"Cache-Control": "no-cache"})

    def verb(self, ext: Extension, verb: Verb) -> Callable[..., Awaitable[Response]]:
        """The route handler of ``verb`` of ``ext``."""

        async def handler(name: str, request: Request, version: str | None = None) -> Response:
            return await self.extension(ext, verb, name, request, version)

        return handler

    async def prometheus(self) -> Response:
        return Response(exposition(self.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@dataclass(frozen=True)
class Route:
    """One row of the route table: an HTTP method, a path and the name of its :class:`Handlers` method (or, for
    an extension's verb, the extension and the verb)."""

    method: str
    path: str
    handler: str
    extension: tuple[Extension, Verb] | None = None


_MODEL = "/v2/models/{name}"
_VERSION = "/v2/models/{name}/versions/{version}"

# The OIP v2 / Triton HTTP routes, in the order they are matched (the extensions' after infer: :func:`routes`).
ROUTES: tuple[Route, ...] = (
    Route("GET", "/v2", "server_metadata"),
    Route("GET", "/v2/health/live", "live"),
    Route("GET", "/v2/health/ready", "ready"),
    Route("GET", f"{_VERSION}/stats", "model_stats"),
    Route("GET", f"{_MODEL}/stats", "model_stats"),
    Route("GET", "/v2/models/stats", "model_stats"),
    Route("GET", _VERSION, "model_metadata"),
    Route("GET", _MODEL, "model_metadata"),
    Route("GET", f"{_VERSION}/ready", "model_ready"),
    Route("GET", f"{_MODEL}/ready", "model_ready"),
    Route("GET", f"{_VERSION}/config", "model_config"),
    Route("GET", f"{_MODEL}/config", "model_config"),
    Route("POST", "/v2/repository/index", "repository_index"),
    Route("POST", f"{_VERSION}/infer", "infer"),
    Route("POST", f"{_MODEL}/infer", "infer"),
    Route("GET", "/metrics", "prometheus"),
)


def routes() -> tuple[Route, ...]:
    """:data:`ROUTES` with every verb of the families' extensions after infer: ``POST
    /v2/models/{name}[/versions/{version}]/{verb}``."""
    added = tuple(Route("POST", f"{path}/{verb.name}", "extension", (ext, verb))
                  for ext in extensions() for verb in ext.verbs for path in (_VERSION, _MODEL))
    return (*ROUTES[:-1], *added, ROUTES[-1])


def _lifespan(models: list[ServedModel]):
    """The app's lifespan: ready while it runs; the models' batchers closed at its end."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.ready = True
        yield
        app.state.ready = False
        for m in models:
            await m.batcher.close()

    return lifespan


def build_app(models: list[ServedModel], metrics: Metrics, *, max_body_bytes: int,
              gate: Gate | None = None) -> FastAPI:
    """The FastAPI app serving ``models``: :func:`routes` on a :class:`Handlers`, :data:`ERROR_HANDLERS`, the
    drain middleware. ``app.state`` keeps what a gRPC front shares with it: ``models`` (by name), ``metrics``,
    ``gate`` (closed on shutdown: new requests get 503) and ``max_body_bytes``."""
    gate = gate if gate is not None else Gate()
    app = FastAPI(title="onnxport", version=ONNXPORT_VERSION, lifespan=_lifespan(models), docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.add_middleware(_Drain, gate=gate)
    app.state.ready = True
    app.state.models = {m.name: m for m in models}
    app.state.metrics = metrics
    app.state.gate = gate
    app.state.max_body_bytes = max_body_bytes
    for exc, on_error in ERROR_HANDLERS:
        app.add_exception_handler(exc, on_error)
    handlers = Handlers(app.state, models)
    for route in routes():
        endpoint = handlers.verb(*route.extension) if route.extension else getattr(handlers, route.handler)
        app.add_api_route(route.path, endpoint, methods=[route.method])
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
