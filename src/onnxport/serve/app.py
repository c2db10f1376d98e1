"""The FastAPI app: OIP v2 / Triton HTTP routes, Prometheus metrics and Triton-style statistics."""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from onnxport.core.errors import UsageError
from onnxport.core.version import __version__ as ONNXPORT_VERSION
from onnxport.runtime.sessions import session
from onnxport.serve.batcher import Batcher, InferenceError
from onnxport.serve.models import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    ModelSource,
    Signature,
    discover,
    signature,
)
from onnxport.serve.protocol import BadRequest, decode, encode
from onnxport.serve.triton import model_config

EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration"]
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TIME_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class _Stats:
    """Counters for Triton's statistics extension (nanoseconds)."""

    success: int = 0
    success_ns: int = 0
    failure: int = 0
    failure_ns: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    executions: int = 0
    last_inference_ms: int = 0


@dataclass
class ServedModel:
    """A loaded model: its source, signature, ONNX Runtime session and batcher."""

    source: ModelSource
    signature: Signature
    session: object
    max_batch: int          # largest batch a request may carry (Triton max_batch_size; 0 = no batch dim)
    max_delay_ms: float
    batcher: Batcher
    stats: _Stats

    @property
    def name(self) -> str:
        return self.source.name

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.source.version], "platform": "onnxruntime_onnx",
                "inputs": [t.to_dict() for t in self.signature.inputs],
                "outputs": [t.to_dict() for t in self.signature.outputs]}

    def config(self) -> dict:
        config = model_config(self.signature, self.name, max_batch=self.max_batch,
                              max_delay_us=int(self.max_delay_ms * 1000), session_options=self.source.session_options)
        if self.source.batching_off:
            config.setdefault("parameters", {})["onnxport_batching"] = {"string_value": f"off: {self.source.batching_off}"}
        return config


def _load(source: ModelSource, max_batch: int | None, max_delay_ms: float | None, metrics: _Metrics) -> ServedModel:
    if not source.onnx_path.is_file():
        raise UsageError(f"model '{source.name}': {source.onnx_path} does not exist", "check the path")
    sig = signature(source.onnx_path)
    sess = session(source.onnx_path, **source.session_options)
    batch_limit = max_batch if max_batch is not None else (source.max_batch if source.max_batch is not None
                                                           else DEFAULT_MAX_BATCH)
    if source.batching_off:
        batch_limit = min(batch_limit, 1)  # a row's answer would depend on its batch neighbours
    if batch_limit < 0:
        raise UsageError(f"max_batch must be >= 0, got {batch_limit}", "pass --max-batch 1 to turn batching off")
    delay = max_delay_ms if max_delay_ms is not None else (source.max_delay_ms if source.max_delay_ms is not None
                                                           else DEFAULT_MAX_DELAY_MS)
    batchable = sig.batchable and batch_limit > 0
    output_names = [o.name for o in sig.outputs]

    def run(feeds: dict) -> dict:
        return dict(zip(output_names, sess.run(output_names, feeds)))

    def on_batch(rows: int, seconds: float) -> None:
        metrics.batch_size.labels(source.name).observe(rows)
        metrics.compute.labels(source.name).observe(seconds)

    batcher = Batcher(run, batched=batchable, max_batch=batch_limit, max_delay_ms=delay, on_batch=on_batch)
    return ServedModel(source, sig, sess, batch_limit if batchable else 0, delay, batcher, _Stats())


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("onnxport_inference_requests", "Inference requests by model and outcome",
                                ["model", "outcome"], registry=self.registry)
        self.queue = Histogram("onnxport_queue_seconds", "Time a request waited for its batch to start",
                               ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.compute = Histogram("onnxport_compute_seconds", "ONNX Runtime time per batch run",
                                 ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.request_time = Histogram("onnxport_request_seconds", "Inference request time, decode to encode",
                                      ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("onnxport_batch_size", "Rows per ONNX Runtime run", ["model"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadRequest("invalid Content-Length header")
        if int(length) > limit:
            raise BadRequest(f"the request body is {int(length)} bytes; the limit is {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the request body exceeds the limit of {limit} bytes", 413)
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("gzip", "deflate"):
        inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
        try:
            body = inflater.decompress(body, limit + 1)
        except zlib.error:
            raise BadRequest(f"the body is not valid {encoding} data") from None
        if len(body) > limit or inflater.unconsumed_tail:
            raise BadRequest(f"the decompressed request body exceeds the limit of {limit} bytes", 413)
    elif encoding != "identity":
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}", 415)
    return body


def _split_body(body: bytes, header_length: str | None) -> tuple[object, bytes]:
    if header_length is not None:
        if not header_length.strip().isdigit() or int(header_length) > len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_length!r} does not fit the "
                             f"{len(body)}-byte body")
        head, binary = body[:int(header_length)], body[int(header_length):]
    else:
        head, binary = body, b""
    try:
        return json.loads(head), binary
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the request is not valid JSON: {str(e)[:200]}") from None


def _compress(body: bytes, accept: str) -> tuple[bytes, str | None]:
    accept = accept.lower()
    if "gzip" in accept:
        c = zlib.compressobj(wbits=31)
        return c.compress(body) + c.flush(), "gzip"
    if "deflate" in accept:
        return zlib.compress(body), "deflate"
    return body, None


def build_app(models: list[ServedModel], metrics: _Metrics, *, max_body_bytes: int) -> FastAPI:
    """The FastAPI app serving ``models``."""
    by_name = {m.name: m for m in models}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.ready = True
        yield
        app.state.ready = False
        for m in models:
            await m.batcher.close()

    app = FastAPI(title="onnxport", version=ONNXPORT_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ready = True
    app.state.models = by_name

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

    def model(name: str, version: str | None = None) -> ServedModel:
        m = by_name.get(name)
        if m is None:
            raise BadRequest(f"unknown model '{name}'; this server serves {sorted(by_name)}", 404)
        if version not in (None, "", m.source.version):
            raise BadRequest(f"model '{name}' has no version '{version}' (served: {m.source.version})", 404)
        return m

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {"name": "onnxport", "version": ONNXPORT_VERSION, "extensions": EXTENSIONS}

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if app.state.ready else 503)

    @app.get("/v2/models/stats")
    @app.get("/v2/models/{name}/stats")
    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def model_stats(name: str | None = None, version: str | None = None) -> dict:
        chosen = [model(name, version)] if name else list(by_name.values())
        return {"model_stats": [_stats(m) for m in chosen]}

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict:
        return model(name, version).metadata()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        model(name, version)
        return Response(status_code=200 if app.state.ready else 503)

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str | None = None) -> dict:
        return model(name, version).config()

    @app.post("/v2/repository/index")
    async def repository_index() -> list:
        return [{"name": m.name, "version": m.source.version, "state": "READY"} for m in models]

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        m = model(name, version)
        start = time.perf_counter()
        m.batcher.announce()
        queued = False
        try:
            body = await _read_body(request, max_body_bytes)
            header, binary = _split_body(body, request.headers.get("inference-header-content-length"))
            req = decode(header, binary, m.signature, batched=m.batcher.batched, max_batch=max(m.max_batch, 1))
            queued = True
            outputs, batch = await m.batcher.infer(req.feeds, req.rows, announced=True)
            payload, header_length = encode(m.name, m.source.version, req, outputs, m.signature)
        except (BadRequest, InferenceError) as e:
            elapsed = time.perf_counter() - start
            metrics.requests.labels(m.name, "failure").inc()
            m.stats.failure += 1
            m.stats.failure_ns += int(elapsed * 1e9)
            if isinstance(e, BadRequest):
                raise
            return _error(str(e), 400)
        finally:
            if not queued:
                m.batcher.withdraw()
        elapsed = time.perf_counter() - start
        metrics.requests.labels(m.name, "success").inc()
        metrics.queue.labels(m.name).observe(batch.queue_s)
        metrics.request_time.labels(m.name).observe(elapsed)
        s = m.stats
        s.success += 1
        s.success_ns += int(elapsed * 1e9)
        s.queue_ns += int(batch.queue_s * 1e9)
        s.compute_ns += int(batch.compute_s * 1e9)
        s.executions += 1
        s.last_inference_ms = int(time.time() * 1000)
        payload, encoding = _compress(payload, request.headers.get("accept-encoding", ""))
        headers = {"Content-Encoding": encoding} if encoding else {}
        if header_length is None:
            return Response(payload, media_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(header_length)
        return Response(payload, media_type="application/octet-stream", headers=headers)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _stats(m: ServedModel) -> dict:
    s = m.stats
    return {
        "name": m.name, "version": m.source.version, "last_inference": s.last_inference_ms,
        "inference_count": s.success, "execution_count": s.executions,
        "inference_stats": {
            "success": {"count": s.success, "ns": s.success_ns}, "fail": {"count": s.failure, "ns": s.failure_ns},
            "queue": {"count": s.success, "ns": s.queue_ns},
            "compute_input": {"count": s.success, "ns": 0},
            "compute_infer": {"count": s.success, "ns": s.compute_ns},
            "compute_output": {"count": s.success, "ns": 0},
        },
        "batch_stats": [],
    }


def serve_app(path: str | Path, *, max_batch: int | None = None, max_delay_ms: float | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, name: str | None = None) -> FastAPI:
    """An OIP v2 app serving PATH (output folder, .onnx file or Triton repository); loads every model now.
    ``name`` renames the one model of a folder or file."""
    if max_body_bytes <= 0:
        raise UsageError(f"max_body_bytes must be positive, got {max_body_bytes}", "pass a size in bytes")
    metrics = _Metrics()
    models = [_load(source, max_batch, max_delay_ms, metrics) for source in discover(path, name)]
    return build_app(models, metrics, max_body_bytes=max_body_bytes)
