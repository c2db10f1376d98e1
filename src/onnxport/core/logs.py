"""What the libraries print, kept off the terminal; the progress callback type."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def captured_fds(sink: list[str] | None, fds: tuple[int, ...] = (1, 2)) -> Iterator[None]:
    """Send what is written to the file descriptors ``fds`` (C++ logs, subprocess output) into ``sink``; the
    one place that redirects them. Nothing is redirected without a sink."""
    if sink is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in fds}
    with tempfile.TemporaryFile() as tmp:
        for fd in fds:
            os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


@contextlib.contextmanager
def captured_output(sink: list[str] | None = None) -> Iterator[None]:
    """Keep exporter chatter (Python prints, logging and C++ logs on fd 1 and 2) off the terminal.

    stdout belongs to ``--json`` and stderr to onnxport's own messages; what the exporters print is
    appended to ``sink`` (it holds, e.g., the TorchScript graph at the point of failure).
    """
    raw: list[str] = []
    out, err = io.StringIO(), io.StringIO()
    try:
        with captured_fds(raw), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        if sink is not None:
            sink.append("".join(raw) + out.getvalue() + err.getvalue())


Progress = Callable[[str], None]
"""A progress callback: receives one short line per stage or step (the CLI shows it; the API drops it)."""


def noop(_: str) -> None:
    """The progress callback that shows nothing."""
    return None
