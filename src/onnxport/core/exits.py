"""A model's code that ends the process (``os._exit(0)`` at import or in ``forward``) would end onnxport with
that status and no word said: no ``finally``, no exit handler runs. While :func:`trapped` is active, ``os._exit``
called in this process raises :class:`ProcessExit` instead (a ``SystemExit``, so the caller answers it as it
answers ``sys.exit``); a forked child (multiprocessing) still exits as it asked."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class ProcessExit(SystemExit):
    """``os._exit(code)`` was called in the process onnxport runs in."""


@contextlib.contextmanager
def trapped() -> Iterator[None]:
    """``os._exit`` raises :class:`ProcessExit` in this process until the block ends (then restored)."""
    real, pid = os._exit, os.getpid()

    def _exit(code: int = 0) -> None:
        if os.getpid() != pid:  # a forked child ends as it asked
            real(code)
        raise ProcessExit(code)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real
