"""One server process: the HTTP app under uvicorn and, when asked, the gRPC front, in one event loop over one
set of models, with a drain on SIGTERM/SIGINT.

The drain: the gate closes (new requests get HTTP 503 / gRPC UNAVAILABLE, readiness turns 503), every
request already admitted is answered, the listeners stay until clients stop sending (a short quiet period,
so that a request sent right after the last answer is refused, not dropped: gRPC would cancel it), then
both close and the process returns normally (exit 0), all within the drain timeout. A second signal stops
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING

from onnxport.serve.connections import Timeouts, protocol_class

if TYPE_CHECKING:
    from fastapi import FastAPI

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
QUIET_S = 0.5  # once drained, the listeners stay until no request was refused for this long ...
MAX_LINGER_S = 3.0  # ... or this long at most
log = logging.getLogger("uvicorn.error")  # uvicorn configures it at the server's log level


def _loop_factory():
    """uvloop when installed (what uvicorn would pick), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class Server:
    """Serve ``app`` (from :func:`onnxport.serve.serve_app`) on the listening ``sock`` and, with ``grpc_port``,
    the Triton gRPC service on ``host:grpc_port`` (0: any free port; :attr:`grpc_port` says which after
    :attr:`started`). :meth:`run` blocks until a signal or :meth:`stop`, then drains. ``timeouts``: how long an
    HTTP client may take to send a request's headers and body, and to stay idle (:mod:`.connections`)."""

    def __init__(self, app: FastAPI, sock: socket.socket, *, host: str = "127.0.0.1", grpc_port: int | None = None,
                 drain_timeout_s: float = 30.0, log_level: str = "info", timeouts: Timeouts = Timeouts()) -> None:
        self.app = app
        self.sock = sock
        self.host = host
        self.grpc_port = grpc_port
        self.drain_timeout_s = drain_timeout_s
        self.log_level = log_level
        self.timeouts = timeouts.checked()
        self.started = threading.Event()
        self.drained: bool | None = None  # after run: whether every admitted request was answered in time
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._forced = False
        self._http = None

    def run(self) -> None:
        """Serve until stopped; installs the signal handlers when called in the main thread."""
        loop = _loop_factory()()
        try:
            loop.run_until_complete(self.serve())
        finally:
            left = asyncio.all_tasks(loop)  # what a forced stop left running
            for task in left:
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        """Ask the server to drain and stop, as SIGTERM does (from any thread; once is enough)."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                self._loop.call_soon_threadsafe(self._stop.set)

    def _signalled(self) -> None:
        assert self._stop is not None
        if self._stop.is_set():  # the second signal: stop now
            self._forced = True
            if self._http is not None:
                self._http.force_exit = True
        self._stop.set()

    async def serve(self) -> None:
        import uvicorn

        class _Uvicorn(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the drain below handles the signals
                yield

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        state = self.app.state
        grpc = None
        if self.grpc_port is not None:
            from onnxport.serve.grpc_service import grpc_server

            grpc, self.grpc_port = grpc_server(state.models, state.gate, host=self.host, port=self.grpc_port,
                                               max_message_bytes=state.max_body_bytes)
        http = _Uvicorn(uvicorn.Config(self.app, log_level=self.log_level, access_log=False, lifespan="on",
                                       timeout_graceful_shutdown=self.drain_timeout_s,
                                       http=protocol_class(self.timeouts), timeout_keep_alive=self.timeouts.idle_s))
        self._http = http
        installed = self._install_signals()
        try:
            serving = asyncio.ensure_future(http.serve(sockets=[self.sock]))
            if grpc is not None:
                await grpc.start()
            while not http.started and not serving.done():
                await asyncio.sleep(0.01)
            if serving.done():  # uvicorn did not start
                if grpc is not None:
                    await grpc.stop(0)
                await serving  # raises why
                return
            self.started.set()
            stopping = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            await self._drain(http, grpc, serving)
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)

    async def _drain(self, http, grpc, serving: asyncio.Future) -> None:
        """Close the gate, wait for the admitted requests, then close both listeners."""
        gate = self.app.state.gate
        gate.close()
        start = time.monotonic()
        deadline = start + self.drain_timeout_s
        log.info("Draining: %d accepted request(s) in flight; new requests get 503 / UNAVAILABLE", gate.in_flight)
        self.drained = await gate.drained(deadline, lambda: self._forced)
        if self.drained:
            log.info("Drained in %.2f s: every accepted request was answered", time.monotonic() - start)
        else:
            log.error("Drain stopped after %.2f s with %d request(s) unanswered", time.monotonic() - start,
                      gate.in_flight)
        if not self._forced:  # refuse, rather than drop, what clients send right after the last answer
            await gate.quiet(QUIET_S, min(deadline, time.monotonic() + MAX_LINGER_S))
        if grpc is not None:
            await grpc.stop(0 if self._forced else max(0.0, deadline - time.monotonic()))
        http.config.timeout_graceful_shutdown = max(0.1, deadline - time.monotonic())
        http.should_exit = True
        http.force_exit = http.force_exit or self._forced
        await serving

    def _install_signals(self) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        installed = []
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self._loop.add_signal_handler(sig, self._signalled)
                installed.append(sig)
        return installed
