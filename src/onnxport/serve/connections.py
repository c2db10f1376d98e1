"""HTTP connection deadlines: how long a client may take to send a request's headers, to send its body, and
how long a connection may sit idle, so that slow or silent clients (slowloris) cannot hold the server's
connections and file descriptors.

uvicorn alone times out only a connection that is idle after an answer (``timeout_keep_alive``): a fresh
connection that sends nothing, or headers or a body sent a byte at a time, stay open for ever. The protocol
class made here (uvicorn's httptools protocol with deadlines) closes such a connection: with a 408 answer
when the headers or the body came too slowly, silently when it was idle.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from onnxport.core.errors import UsageError

log = logging.getLogger("uvicorn.error")

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_IDLE_TIMEOUT_S = 5.0  # uvicorn's keep-alive default
MAX_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Timeouts:
    """``header_s``: from a request's first byte to the end of its headers. ``body_s``: from the end of the
    headers to the end of the body (a 64 MB body at 1 MB/s needs 64 s). ``idle_s``: a connection with no
    request under way (just opened, or after its last answer) that receives nothing."""

    header_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_s: float = DEFAULT_IDLE_TIMEOUT_S

    def checked(self) -> Timeouts:
        """Itself, or UsageError naming the first timeout that is not a finite number of seconds in range."""
        for option, value in (("--header-timeout-s", self.header_s), ("--body-timeout-s", self.body_s),
                              ("--idle-timeout-s", self.idle_s)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
                raise UsageError(f"{option} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {value}",
                                 f"pass e.g. {option} 10")
        return self


_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
              b"connection: close\r\n\r\n%s")


def protocol_class(timeouts: Timeouts) -> type[asyncio.Protocol]:
    """uvicorn's httptools HTTP protocol with ``timeouts`` (pass it as ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(HttpToolsProtocol):
        """One connection. Its phase decides its deadline: ``idle`` (nothing received since it opened or since
        its last answer), ``headers`` (a request has begun), ``body`` (headers in, body still coming) and
        ``app`` (the request is complete and the app answers it: no deadline here)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._phase = "idle"
            self._deadline: asyncio.TimerHandle | None = None

        def _enter(self, phase: str) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._phase = phase
            seconds = {"idle": timeouts.idle_s, "headers": timeouts.header_s, "body": timeouts.body_s}.get(phase)
            if seconds is not None:
                self._deadline = self.loop.call_later(seconds, self._expired, phase)

        def _expired(self, phase: str) -> None:
            self._deadline = None
            if self._phase != phase or self.transport is None or self.transport.is_closing():
                return
            log.debug("closing a connection from %s: its %s took longer than allowed", self.client, phase)
            cycle = self.cycle if phase == "body" else None
            if cycle is not None:  # the app reading the body sees the client gone, and answers nothing
                cycle.disconnected = True
                cycle.keep_alive = False
                cycle.message_event.set()
            if phase != "idle" and (cycle is None or not cycle.response_started):
                what = "request headers" if phase == "headers" else "request body"
                seconds = timeouts.header_s if phase == "headers" else timeouts.body_s
                body = b'{"error":"the %s did not arrive within %g s"}' % (what.encode(), seconds)
                self.transport.write(_TIMED_OUT % (len(body), body))
            self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._enter("idle")

        def connection_lost(self, exc: Exception | None) -> None:
            self._enter("closed")
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._phase == "idle":
                self._enter("headers")  # counted from the request's first byte, however slowly the rest comes
            super().data_received(data)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            if self._phase == "headers":
                # a pipelined request waits, not reading, until the one before it is answered
                queued = bool(self.pipeline) and self.pipeline[0][0] is self.cycle
                self._enter("queued" if queued else "body")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if self._phase == "body":
                self._enter("app")

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._phase == "closed" or self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:  # a pipelined request has started
                self._enter("body" if cycle.more_body else "app")
            else:
                self._enter("idle")

    return TimedHttpToolsProtocol
