"""The files a SOURCE names, checked before anything is imported from them (no torch here: the command line
refuses a missing file before torch loads)."""

from __future__ import annotations

from pathlib import Path

from onnxport.core.errors import SourceError


def python_file(path_text: str, what: str = "model file") -> Path:
    """``path_text``, a Python file that exists (SourceError naming ``what`` it is otherwise)."""
    path = Path(path_text)
    if not path.is_file():
        raise SourceError(f"{what} not found: {path}", "check the path before the ':'")
    return path
