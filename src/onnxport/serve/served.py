"""What one server process serves, shared by its HTTP and gRPC fronts: the loaded models with their sessions
and batchers (and the extensions the families bind to them), the Prometheus metrics, Triton-style statistics and
the gate that drains requests on shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from onnxport.core.errors import UsageError
from onnxport.core.options import RuntimeOptions
from onnxport.families.serving import Bound, Extension, Outcome, bind, extensions
from onnxport.runtime.sessions import CPU, runtime_providers, session
from onnxport.runtime.variant_sessions import is_openvino, open_for, providers_for, without_cuda_graph
from onnxport.serve.batcher import Batcher, BatchStats, InferenceError, Outputs
from onnxport.serve.device_run import PIPELINE, DeviceRunner, runs_on_cuda
from onnxport.serve.models import DEFAULT_MAX_BATCH, DEFAULT_MAX_DELAY_MS, ModelSource, Signature, signature
from onnxport.serve.protocol import BadRequest, InferRequest, decode, parse_body
from onnxport.serve.triton import model_config

SERVER_NAME = "onnxport"
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration"]
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TIME_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

T = TypeVar("T")

# Request bodies and answers larger than this are parsed and encoded in a thread pool, not on the event loop
# (smaller ones cost less than the hop to a thread: a 64 KiB JSON body parses in about half a millisecond).
INLINE_BYTES = 64 * 1024
PARSE_THREADS = 2
_parse_pool: ThreadPoolExecutor | None = None


async def offload(size: int, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)``: on the event loop when ``size`` (the bytes it reads or writes) is at most
    INLINE_BYTES, else in the parse pool, so that the loop keeps answering (health checks, other requests).
    What releases the interpreter lock (inflating, copying arrays) runs beside the loop; the JSON parser holds it
    (orjson: a fraction of the json module's time),
    so the loop waits for one such call at most, instead of for every large body in turn."""
    global _parse_pool
    if size <= INLINE_BYTES:
        return fn(*args, **kwargs)
    if _parse_pool is None:
        _parse_pool = ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="onnxport-parse")
    return await asyncio.get_running_loop().run_in_executor(_parse_pool, lambda: fn(*args, **kwargs))


class Metrics:
    """The Prometheus metrics of one server (both fronts update the same ones)."""

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
        self.extensions = {ext.name: ExtensionCounters(ext, self.registry) for ext in extensions()}


class ExtensionCounters:
    """The Prometheus metrics of one server extension (:attr:`Extension.metrics`): requests by model and
    outcome, their seconds, the units they produced."""

    def __init__(self, ext: Extension, registry: CollectorRegistry) -> None:
        m = ext.metrics
        self.requests = Counter(*m.requests, ["model", "outcome"], registry=registry)
        self.seconds = Histogram(*m.seconds, ["model"], buckets=TIME_BUCKETS, registry=registry)
        self.units = Counter(*m.units, ["model"], registry=registry)

    def count(self, model: str, outcome: Outcome) -> None:
        self.requests.labels(model, "failure" if outcome.error else "success").inc()
        self.seconds.labels(model).observe(outcome.seconds)
        self.units.labels(model).inc(outcome.count)


class Gate:
    """The requests a server has accepted. Once closed (on shutdown) it accepts none: they get HTTP 503 or
    gRPC UNAVAILABLE, while every request already inside is answered. One event loop uses it: no locks."""

    def __init__(self) -> None:
        self.open = True
        self.in_flight = 0
        self.refused_at = 0.0  # time.monotonic() of the last request refused

    def enter(self) -> bool:
        """Admit one request (False once closed)."""
        if not self.open:
            self.refused_at = time.monotonic()
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def close(self) -> None:
        self.open = False

    async def drained(self, deadline: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait until no admitted request is left (True) or ``time.monotonic()`` passes ``deadline`` (False)."""
        while self.in_flight > 0 and not stop():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return self.in_flight == 0

    async def quiet(self, period: float, until: float) -> None:
        """Wait until no request has been refused for ``period`` seconds (at most until ``time.monotonic()``
        reaches ``until``): clients still sending learn that the server is going from a 503 / UNAVAILABLE,
        not from a listener that vanished under their request."""
        since = time.monotonic()
        while (now := time.monotonic()) < until:
            left = period - (now - max(self.refused_at, since))
            if left <= 0:
                return
            await asyncio.sleep(min(left, until - now))


@dataclass
class Stats:
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
    """A loaded model: its source, signature, ONNX Runtime session and batcher, and what it counts."""

    source: ModelSource
    signature: Signature
    session: object
    max_batch: int          # largest batch a request may carry (Triton max_batch_size; 0 = no batch dim)
    max_delay_ms: float
    batcher: Batcher
    stats: Stats
    metrics: Metrics
    extensions: dict[str, Bound] = field(default_factory=dict)  # the server extensions it answers, by name

    @property
    def name(self) -> str:
        return self.source.name

    def extension_request(self, ext: Extension, body: object) -> tuple[Any, Outcome]:
        """Check a request to the extension ``ext`` before anything runs (BadRequest, counted as a failure:
        ``ext.absent`` when the model does not answer it)."""
        try:
            bound = self.extensions.get(ext.name)
            if bound is None:
                raise BadRequest(ext.absent.format(model=self.name))
            req = bound.request(body, self.name)
        except BadRequest:
            self.metrics.extensions[ext.name].requests.labels(self.name, "failure").inc()
            raise
        return req, bound.start(req)

    async def answer(self, ext: Extension, req: Any, outcome: Outcome) -> dict:
        """The one answer of a verb of ``ext`` (counted in the metrics)."""
        try:
            return await self.extensions[ext.name].answer(self.session, req, self.name, self.source.version,
                                                          outcome)
        except Exception as e:
            outcome.error = str(e)
            raise
        finally:
            self.metrics.extensions[ext.name].count(self.name, outcome)

    async def events(self, ext: Extension, req: Any, outcome: Outcome) -> AsyncIterator[bytes]:
        """The server-sent events of a streaming verb of ``ext`` (counted in the metrics once the stream ends)."""
        try:
            async for event in self.extensions[ext.name].events(self.session, req, self.name, self.source.version,
                                                                outcome):
                yield event
        finally:
            self.metrics.extensions[ext.name].count(self.name, outcome)

    def usage(self, base: str) -> list[str]:
        """What a server start prints of the extensions this model answers (beside its infer route)."""
        return [ext.usage.format(base=base, model=self.name) for ext in extensions() if ext.name in self.extensions]

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.source.version], "platform": "onnxruntime_onnx",
                "inputs": [t.to_dict() for t in self.signature.inputs],
                "outputs": [t.to_dict() for t in self.signature.outputs]}

    def config(self) -> dict:
        config = model_config(self.signature, self.name, max_batch=self.max_batch,
                              max_delay_us=int(self.max_delay_ms * 1000), tuned=self.source.tuned)
        if self.source.batching_off:
            config.setdefault("parameters", {})["onnxport_batching"] = {"string_value": f"off: {self.source.batching_off}"}
        for sym, rule in (self.source.constrained_dims or {}).items():  # proven at these sizes only
            config.setdefault("parameters", {})[f"onnxport_constrained_dim_{sym}"] = {"string_value": rule}
        for bound in self.extensions.values():  # what an extension says of the model (rules it applies or not)
            for key, text in bound.config_parameters().items():
                config.setdefault("parameters", {})[key] = {"string_value": text}
        return config

    def statistics(self) -> dict:
        """Triton's statistics for this model (the JSON form of ``inference.ModelStatistics``)."""
        s = self.stats
        return {
            "name": self.name, "version": self.source.version, "last_inference": s.last_inference_ms,
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

    def decode(self, header: object, binary: bytes) -> InferRequest:
        """An OIP JSON header (parsed) and its binary tensor data as a request to this model (BadRequest)."""
        return decode(header, binary, self.signature, batched=self.batcher.batched, max_batch=max(self.max_batch, 1))

    def parse(self, body: bytes, *, encoding: str, header_length: str | None, limit: int) -> InferRequest:
        """A whole HTTP infer body (Content-Encoding ``encoding``, Inference-Header-Content-Length
        ``header_length``, at most ``limit`` bytes once inflated) as a request to this model (BadRequest)."""
        return parse_body(body, self.signature, encoding=encoding, header_length=header_length, limit=limit,
                          batched=self.batcher.batched, max_batch=max(self.max_batch, 1))

    async def infer(self, request: Awaitable[InferRequest], reply: Callable[[InferRequest, Outputs], T]) -> T:
        """One inference request, whichever front it came by: ``request`` reads and decodes it (see
        :meth:`parse`, :meth:`decode`), the batcher runs it, ``reply`` encodes the answer (in the parse pool
        when the outputs are large). Counts it in the metrics and statistics; BadRequest and InferenceError
        (counted as failures) go back to the front."""
        start = time.perf_counter()
        self.batcher.announce()
        queued = False
        try:
            req = await request
            queued = True
            outputs, batch = await self.batcher.infer(req.feeds, req.rows, announced=True)
            answer = await offload(sum(getattr(a, "nbytes", 0) for a in outputs.values()), reply, req, outputs)
        except (BadRequest, InferenceError):
            elapsed = time.perf_counter() - start
            self.metrics.requests.labels(self.name, "failure").inc()
            self.stats.failure += 1
            self.stats.failure_ns += int(elapsed * 1e9)
            raise
        finally:
            if not queued:
                self.batcher.withdraw()
        self._succeeded(time.perf_counter() - start, batch)
        return answer

    def _succeeded(self, elapsed: float, batch: BatchStats) -> None:
        self.metrics.requests.labels(self.name, "success").inc()
        self.metrics.queue.labels(self.name).observe(batch.queue_s)
        self.metrics.request_time.labels(self.name).observe(elapsed)
        s = self.stats
        s.success += 1
        s.success_ns += int(elapsed * 1e9)
        s.queue_ns += int(batch.queue_s * 1e9)
        s.compute_ns += int(batch.compute_s * 1e9)
        s.executions += 1
        s.last_inference_ms = int(time.time() * 1000)


def find(models: dict[str, ServedModel], name: str, version: str | None = None) -> ServedModel:
    """The served model ``name`` (at ``version``, when given); BadRequest 404 otherwise."""
    m = models.get(name)
    if m is None:
        raise BadRequest(f"unknown model '{name}'; this server serves {sorted(models)}", 404)
    if version not in (None, "", m.source.version):
        raise BadRequest(f"model '{name}' has no version '{version}' (served: {m.source.version})", 404)
    return m


def device_options(source: ModelSource, device: str = "cpu", chain: list | None = None) -> dict:
    """``runtime.session()`` keywords for ``source`` on ``device``: its tuned options (``threads``,
    ``opt_level`` and ``options`` where :attr:`ModelSource.tuned` sets them; nothing tuned: ONNX Runtime's
    defaults) and, on cuda, the providers best.onnx was proven with (TF32, TensorRT fp16 and its caches) —
    without a CUDA graph, which holds one input shape while served requests change shape — else ``chain``
    (the device's provider chain) when given."""
    kw = dict(source.session_options)
    proven = source.proven_options
    if device == "cuda" and proven is not None and proven.provider != CPU:
        kw["providers"] = providers_for(without_cuda_graph(proven), source.onnx_path.parent)
    elif chain is not None:
        kw["providers"] = chain
    return kw


def load(source: ModelSource, max_batch: int | None, max_delay_ms: float | None, metrics: Metrics,
         runtime: RuntimeOptions = RuntimeOptions(), io_binding: bool | None = None) -> ServedModel:
    """Open ``source``'s session on ``runtime``'s device and its batcher (UsageError when its file is missing or
    the limits are bad). ``io_binding``: batches run through IO binding with buffers kept on the session's
    device, two in flight (serve/device_run.py); None: where the session runs on CUDA."""
    if not source.onnx_path.is_file():
        raise UsageError(f"model '{source.name}': {source.onnx_path} does not exist", "check the path")
    sig = signature(source.onnx_path)
    chain = runtime_providers(runtime) if runtime.device != "cpu" else None
    if is_openvino(source.proven_options):  # best.onnx was proven on OpenVINO: served there, at its precision
        sess = open_for(source.proven_options, threads=source.threads)(source.onnx_path)
    else:
        sess = session(source.onnx_path, **device_options(source, runtime.device, chain))
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
    on_device = runs_on_cuda(sess) if io_binding is None else io_binding and hasattr(sess, "io_binding")
    device = "cuda" if runs_on_cuda(sess) else "cpu"

    def run(feeds: dict) -> dict:
        return dict(zip(output_names, sess.run(output_names, feeds)))

    def on_batch(rows: int, seconds: float) -> None:
        metrics.batch_size.labels(source.name).observe(rows)
        metrics.compute.labels(source.name).observe(seconds)

    runner = (DeviceRunner(sess, output_names, device, runtime.gpu.device_id, buckets=batch_limit * batchable)
              if on_device else run)
    batcher = Batcher(runner, batched=batchable, max_batch=batch_limit, max_delay_ms=delay, on_batch=on_batch,
                      pipeline=PIPELINE if on_device else 1)
    bound = bind(sig, source.onnx_path, source.layout)
    return ServedModel(source, sig, sess, batch_limit if batchable else 0, delay, batcher, Stats(), metrics, bound)
