"""The output folder of a run: created before any slow work, earlier results kept unless ``--force``, one run
at a time (a lock), the results written into a private staging folder and moved in only when the run ends
normally; removed again when a run this folder was made for fails."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from onnxport.core import signals
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
    """A private staging folder for one run into ``out``, its results moved into ``out`` only when the run
    ends normally (report.json last), earlier results replaced then (with ``force``) and not before.

    Checked before any slow work: earlier results without ``force`` are refused, a folder that cannot be made
    fails at once, and a lock on ``out`` refuses a second run into it (naming the holder). On any failure or
    signal the staging folder is removed, ``out`` keeps what it held, and an ``out`` this run created is
    removed again."""
    out = Path(out)
    check_out(out, force)
    created = make_out(out)
    try:
        with _locked(out):
            remove_stale_stages(out)
            try:
                stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=out))
            except OSError as e:
                raise UsageError(f"cannot write into {out}: {e.strerror or type(e).__name__}",
                                 "choose an --out folder you can write to") from None
            try:
                yield stage
                signals.check()  # a signal whose exception a library swallowed still stops the run here
                publish(stage, out)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def check_out(out: Path, force: bool) -> None:
    """What can be said of ``out`` without touching it, before any slow work: a dangling link, a file, a folder
    this user cannot write into, earlier results without ``force`` (UsageError)."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise UsageError(f"--out {out} is a link to {os.readlink(out)}, which does not exist",
                         "remove the link or point it at a folder, or choose another --out")
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out {out} is a file", "name a directory for the results")
        if not os.access(out, os.W_OK | os.X_OK):
            raise UsageError(f"cannot write into {out} (permission denied)", "choose an --out folder you can write to")
        if not force:
            prepare_out(out, force=False)  # earlier results: refused
        return
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is not None and not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        raise UsageError(f"cannot create the output folder {out}: {parent} is not a folder this user can write to",
                         "choose an --out folder in a place you can write to")


STAGE_PREFIX = ".onnxport-run-"
LOCK_NAME = ".onnxport.lock"


def remove_stale_stages(out: Path) -> list[str]:
    """Remove the staging folders of runs into ``out`` that ended without cleaning up (killed with SIGKILL, a
    power cut); called holding ``out``'s lock, so no live run owns one. Returns the names removed."""
    removed = []
    for entry in out.glob(f"{STAGE_PREFIX}*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """An exclusive lock on ``out`` for one run (a second run is a UsageError naming the holder)."""
    lock = out / LOCK_NAME
    try:
        handle = open(lock, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole run
    except OSError as e:
        raise UsageError(f"cannot write into {out}: {e.strerror or type(e).__name__}",
                         "choose an --out folder you can write to") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = " ".join(handle.read().split())[:200] or "another process"
            raise UsageError(f"{out} is in use by another onnxport run ({holder})",
                             "wait for it to finish, or choose another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}: {' '.join(sys.argv[:6])[:160]}")
        handle.flush()
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
    finally:
        handle.close()


def publish(stage: Path, out: Path) -> None:
    """Move a finished run's results from ``stage`` into ``out``: earlier results there removed first, report.json
    moved last (a folder with a report.json holds a whole run)."""
    for name in RESULT_FILES + RESULT_DIRS:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    entries = sorted(stage.iterdir(), key=lambda p: p.name == "report.json")
    for entry in entries:
        if entry.name.startswith("."):
            continue  # scratch
        os.replace(entry, out / entry.name)


VARIANTS_DIR = "variants"  # OUT/variants/<name>/: convert's optimized variants


def served_output_folder(path: str | Path) -> Path:
    """The output folder a served file belongs to (where its tokenizer and report are): its own folder, or
    ``OUT`` for a variant's file in ``OUT/variants/<name>/``."""
    parent = Path(path).parent
    return parent.parent.parent if parent.parent.name == VARIANTS_DIR else parent
