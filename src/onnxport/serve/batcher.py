"""Dynamic batching: concurrent requests with compatible shapes share one ONNX Runtime run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

Feeds = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]


class InferenceError(Exception):
    """ONNX Runtime rejected a request's tensors (reported to the client as a 400)."""


class ShuttingDown(InferenceError):
    """The server stopped before the request ran (HTTP 503, gRPC UNAVAILABLE)."""


@dataclass(frozen=True)
class BatchStats:
    """What one finished request learned about its batch (for metrics and statistics)."""

    queue_s: float
    compute_s: float
    batch_rows: int


@dataclass(eq=False)
class _Item:
    feeds: Feeds
    rows: int
    key: tuple
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


def batch_key(feeds: Feeds, batched: bool) -> tuple:
    """Requests can share a run when their dtypes and non-batch dims agree."""
    return tuple((name, a.dtype.str, a.shape[1:] if batched else a.shape) for name, a in sorted(feeds.items()))


class Batcher:
    """One worker per model: takes queued requests, concatenates compatible ones along axis 0 (up to
    ``max_batch`` rows, waiting at most ``max_delay_ms`` for requests that have arrived but are still being
    decoded), runs them in a thread and splits the outputs back. Requests queue up while a batch runs, so
    batches grow with load. With ``batched=False`` every request runs alone (one at a time, in order).
    ``pipeline``: batches in flight at once, each in its own thread (2 on a GPU: one computes while the next is
    formed and copied in; ``run`` must then be thread-safe, as an ONNX Runtime session is)."""

    def __init__(self, run: Callable[[Feeds], Outputs], *, batched: bool, max_batch: int, max_delay_ms: float,
                 on_batch: Callable[[int, float], None] | None = None, pipeline: int = 1) -> None:
        self._run = run
        self.batched = batched and max_batch > 1
        self.max_batch = max(1, max_batch)
        self.max_delay = max(0.0, max_delay_ms) / 1000
        self._on_batch = on_batch
        self._pending: deque[_Item] = deque()
        self._incoming = 0  # announced requests not queued yet
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.pipeline = max(1, pipeline)
        self._free = asyncio.Semaphore(self.pipeline)  # batches that may start now
        self._running: set[asyncio.Task] = set()
        self._executor = ThreadPoolExecutor(max_workers=self.pipeline, thread_name_prefix="onnxport-infer")

    def announce(self) -> None:
        """A request arrived and is being decoded: a forming batch may wait for it (up to max_delay_ms)."""
        self._incoming += 1

    def withdraw(self) -> None:
        """An announced request will not be queued after all (bad request, client gone)."""
        self._incoming = max(0, self._incoming - 1)
        if self._wakeup is not None:
            self._wakeup.set()

    async def infer(self, feeds: Feeds, rows: int, *, announced: bool = False) -> tuple[Outputs, BatchStats]:
        """Queue one request (``rows`` = its batch size) and wait for its outputs."""
        loop = asyncio.get_running_loop()
        if announced:
            self._incoming = max(0, self._incoming - 1)
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = loop.create_task(self._worker())
        item = _Item(feeds, rows, batch_key(feeds, self.batched), loop.create_future())
        self._pending.append(item)
        self._wakeup.set()
        return await item.future

    async def close(self) -> None:
        """Stop the worker; requests still queued fail."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._running:  # batches already running are answered
            await asyncio.gather(*self._running, return_exceptions=True)
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(ShuttingDown("the server is shutting down"))
        self._executor.shutdown(wait=False)

    def _take(self, first: _Item) -> list[_Item]:
        """The queued items that can join ``first``'s batch (``first`` included), in arrival order."""
        if not self.batched:
            return [first]
        chosen, rows = [], 0
        for item in self._pending:
            if item.key == first.key and rows + item.rows <= self.max_batch:
                chosen.append(item)
                rows += item.rows
                if rows == self.max_batch:
                    break
        return chosen

    async def _worker(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._free.acquire()  # at most ``pipeline`` batches in flight; requests queue meanwhile
            first = self._pending[0]
            chosen = self._take(first)
            deadline = first.enqueued + self.max_delay
            # wait for more rows only while requests are known to be on their way: no delay at low load
            while self.batched and self._incoming > 0 and sum(i.rows for i in chosen) < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wakeup.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), left)
                chosen = self._take(first)
            taken = {id(i) for i in chosen}
            self._pending = deque(i for i in self._pending if id(i) not in taken)
            chosen = [i for i in chosen if not i.future.done()]  # the client went away
            task = loop.create_task(self._batch(loop, chosen))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            if self.pipeline == 1:
                await task

    async def _batch(self, loop: asyncio.AbstractEventLoop, chosen: list[_Item]) -> None:
        """Run one batch and answer its requests; frees its place in the pipeline."""
        try:
            if chosen:
                await self._execute(loop, chosen)
        except Exception as e:  # noqa: BLE001 - the worker must survive anything a batch does
            for item in chosen:
                if not item.future.done():
                    item.future.set_exception(InferenceError(f"inference failed: {type(e).__name__}: {e}"))
        finally:
            self._free.release()

    async def _execute(self, loop: asyncio.AbstractEventLoop, items: list[_Item]) -> None:
        start = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._executor, self._run_batch, items)
        except Exception as e:  # noqa: BLE001 - delivered to the waiting requests
            results = [e] * len(items)
        compute = time.perf_counter() - start
        rows = sum(i.rows for i in items)
        if self._on_batch is not None:
            self._on_batch(rows, compute)
        for item, result in zip(items, results):
            if item.future.done():
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result((result, BatchStats(start - item.enqueued, compute, rows)))

    def _run_one(self, feeds: Feeds) -> Outputs | Exception:
        try:
            return self._run(feeds)
        except Exception as e:  # noqa: BLE001 - ONNX Runtime raises several unrelated types
            message = str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__
            return InferenceError(f"inference failed: {message}")

    def _run_batch(self, items: list[_Item]) -> list[Outputs | Exception]:
        """Run in the worker thread: one run for the whole batch, or each alone if the batch fails."""
        if len(items) == 1:
            return [self._run_one(items[0].feeds)]
        feeds = {name: np.concatenate([i.feeds[name] for i in items], axis=0) for name in items[0].feeds}
        total = sum(i.rows for i in items)
        outputs = self._run_one(feeds)
        if isinstance(outputs, Exception) or any(o.ndim == 0 or o.shape[0] != total for o in outputs.values()):
            return [self._run_one(i.feeds) for i in items]  # one bad request must not fail its neighbours
        results: list[Outputs | Exception] = []
        offset = 0
        for item in items:
            results.append({k: v[offset:offset + item.rows] for k, v in outputs.items()})
            offset += item.rows
        return results
