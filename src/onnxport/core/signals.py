"""SIGINT and SIGTERM during a run: a :class:`Stopped` raised in the main thread, so that every ``finally`` on
the way out runs (the staging folder removed, the user's earlier results untouched), then one line and exit
130 / 143.

A library that swallows the exception (some exporter paths catch everything) cannot hide the signal: it stays
:func:`pending`, and :func:`check` raises it again at the next stage boundary."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_pending: int | None = None


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


class OverCpuLimit(Exception):
    """A step passed its CPU-time limit (:func:`cpu_limit`)."""


@contextlib.contextmanager
def cpu_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`OverCpuLimit` in the main thread once the process has spent ``seconds`` of CPU time inside
    the block (again every 5 CPU seconds after, should a library swallow it); no limit off the main thread or
    where the platform has no profiling timer."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def over(signum: int, frame: object) -> None:
        raise OverCpuLimit(f"stopped after {seconds:.0f} CPU seconds")

    previous = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, seconds, 5.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        # a profiling signal still on its way must not end the process (SIGPROF's default action terminates it)
        kept = previous if callable(previous) or previous == signal.SIG_IGN else signal.SIG_IGN
        signal.signal(signal.SIGPROF, kept)
