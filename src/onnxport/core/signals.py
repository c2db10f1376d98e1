"""SIGINT and SIGTERM during a run: a :class:`Stopped` raised in the main thread, so that every ``finally`` on
the way out runs (the staging folder removed, the user's earlier results untouched), then one line and exit
130 / 143.

A library that swallows the exception (some exporter paths catch everything) cannot hide the signal: it stays
:func:`pending`, and :func:`check` raises it again at the next stage boundary."""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
import time
from collections.abc import Iterator

_pending: int | None = None
_LIMIT_SIGNAL = getattr(signal, "SIGXCPU", None)  # only ever raised from Python (interrupt_main), never sent
_POLL = 0.1  # seconds between two readings of the CPU time
_AGAIN = 5.0  # CPU seconds before the limit is raised again, should a library have swallowed it


class Stopped(BaseException):
    """The run was stopped by a signal (a BaseException: ``except Exception`` does not catch it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum

    @property
    def word(self) -> str:
        return "interrupted" if self.signum == signal.SIGINT else "terminated"


def _handler(signum: int, frame: object) -> None:
    global _pending
    _pending = signum
    raise Stopped(signum)


def install() -> None:
    """Handle SIGINT and SIGTERM by raising :class:`Stopped` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def pending() -> int | None:
    """The signal received during this run, if any (even when the exception it raised was swallowed)."""
    return _pending


def check() -> None:
    """Raise :class:`Stopped` again when a signal came and its exception was swallowed."""
    if _pending is not None:
        raise Stopped(_pending)


def reset() -> None:
    global _pending
    _pending = None


def settle() -> None:
    """The work is done and its result printed (OUT committed): SIGINT and SIGTERM are ignored from here on,
    so that the exit status stays the run's; a signal while the interpreter shuts down would otherwise end the
    process with a raw signal status after its summary (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


class OverCpuLimit(BaseException):
    """A step passed its CPU-time limit (:func:`cpu_limit`); a BaseException, so that a library's ``except
    Exception`` (torch.onnx wraps every failure of torch.export) lets it through to the caller of the limit."""


@contextlib.contextmanager
def cpu_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`OverCpuLimit` in the main thread once the process has spent ``seconds`` of CPU time inside
    the block (again every 5 CPU seconds after, should a library swallow it); no limit off the main thread or
    where the platform has no SIGXCPU.

    A watchdog thread reads the process's CPU time and interrupts the main thread through Python alone
    (:func:`_thread.interrupt_main`): no signal is ever sent to the process, so no thread of a native library
    sees an interrupted call, and nothing can reach a default action that ends the process."""
    if threading.current_thread() is not threading.main_thread() or _LIMIT_SIGNAL is None:
        yield
        return
    start = time.process_time()

    def over(signum: int, frame: object) -> None:
        if not done.is_set():
            raise OverCpuLimit(f"stopped after {seconds:.0f} CPU seconds")

    def watch() -> None:
        limit = seconds
        while not done.wait(_POLL):
            if time.process_time() - start >= limit:
                _thread.interrupt_main(_LIMIT_SIGNAL)
                limit += _AGAIN

    done = threading.Event()
    previous = signal.signal(_LIMIT_SIGNAL, over)
    watchdog = threading.Thread(target=watch, name="onnxport-cpu-limit", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()
        signal.signal(_LIMIT_SIGNAL, previous if previous is not None else signal.SIG_DFL)
