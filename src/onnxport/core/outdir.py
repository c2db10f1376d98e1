"""The output folder of a run: created before any slow work, earlier results kept unless ``--force``, and
removed again when a run fails before writing anything into it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from onnxport.core.errors import UsageError

RESULT_FILES = ("model.onnx", "model.onnx.data", "model.unverified.onnx", "model.unverified.onnx.data", "onnxport.log",
                "best.onnx", "report.json", "report.html", "report.md")
RESULT_DIRS = ("variants", "tokenizer")


def prepare_out(out: str | Path, force: bool) -> Path:
    """Create ``out``; refuse to overwrite earlier results unless ``force``; clear them with ``force``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file", "name a directory for the results")
    existing = [n for n in RESULT_FILES if (out / n).exists()] + [f"{d}/" for d in RESULT_DIRS if (out / d).exists()]
    if existing and not force:
        raise UsageError(f"{out} already holds results ({', '.join(existing[:3])})",
                         "pass --force to overwrite them, or choose another --out")
    make_out(out)
    for name in existing:
        target = out / name.rstrip("/")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    return out


def make_out(out: Path) -> bool:
    """Create the output folder (and its parents); True when it did not exist. A folder that cannot be
    created is a UsageError naming the reason."""
    out = Path(out)
    if out.is_dir():
        return False
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the output folder {out}: {e.strerror or type(e).__name__}",
                         "choose an --out folder in a place you can write to") from None
    return True


@contextlib.contextmanager
def output_folder(out: str | Path, force: bool) -> Iterator[Path]:
    """The output folder, checked before any slow work (earlier results kept unless ``force``; created, so
    a folder that cannot be made fails at once); removed again when the run fails before writing anything."""
    out = Path(out)
    if out.exists() and not force:
        prepare_out(out, force=False)  # earlier results: refused before the (slow) load
    created = make_out(out)
    try:
        yield out
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
