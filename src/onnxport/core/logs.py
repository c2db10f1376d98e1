"""What the libraries print, kept off the terminal; the progress callback type."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


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


class LibraryLog:
    """While active, everything written to file descriptors 1 and 2 — the libraries' prints, C++ logs,
    Python warnings and logging — goes to a log file; onnxport's own lines go to :attr:`terminal` (the
    original stderr) and machine output to :attr:`stdout` (the original stdout).

    The log starts in a temporary file; :meth:`keep` moves it where it belongs (``OUT/onnxport.log``),
    :meth:`discard` deletes it."""

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="onnxport-", suffix=".log")
        os.close(fd)
        self.path = Path(name)
        self._saved: dict[int, int] = {}
        self.terminal = sys.stderr
        self.stdout = sys.stdout

    def __enter__(self) -> LibraryLog:
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.stdout = os.fdopen(os.dup(self._saved[1]), "w", buffering=1, encoding="utf-8")
        self.terminal = os.fdopen(os.dup(self._saved[2]), "w", buffering=1, encoding="utf-8")
        with open(self.path, "ab", buffering=0) as log:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, dup in self._saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        self._saved = {}
        for stream in (self.stdout, self.terminal):
            stream.flush()
            stream.close()
        self.stdout, self.terminal = sys.stdout, sys.stderr

    def keep(self, dest: Path) -> Path | None:
        """Move the log to ``dest`` (None when it cannot be written there: the log is then discarded)."""
        try:
            shutil.move(str(self.path), str(dest))
            return Path(dest)
        except OSError:
            self.discard()
            return None

    def discard(self) -> None:
        """Delete the log."""
        self.path.unlink(missing_ok=True)
