"""The tokenizer beside an exported decoder: copied from the local Hugging Face model directory into
``OUT/tokenizer`` (so a server can take and give text), and loaded back from there, offline."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from onnxport.core.errors import OnnxportError, UsageError, one_line
from onnxport.sources import tokenizer_files

TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")


def has_tokenizer(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds any of the files a Hugging Face tokenizer is loaded from."""
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def save_tokenizer(model_dir: str | Path, out_dir: str | Path) -> Path | None:
    """Copy the tokenizer of the local model in ``model_dir`` to ``out_dir/tokenizer`` (written in a temporary
    folder, then renamed); None when ``model_dir`` has none. One whose files do not load offline is a SourceError
    in one line (the caller decides whether that stops the run). Never runs remote code and never downloads."""
    if not has_tokenizer(model_dir):
        return None
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    tok = tokenizer_files.load_tokenizer(model_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / TOKENIZER_DIR
    work = Path(tempfile.mkdtemp(prefix=".onnxport-tokenizer-", dir=out))
    try:
        tok.save_pretrained(str(work))
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    return final


def load_tokenizer(out_dir: str | Path):
    """The tokenizer saved by :func:`save_tokenizer` in ``out_dir/tokenizer`` (or ``out_dir`` itself when it
    is the tokenizer folder); None when there is none. One that is there but does not load is a UsageError."""
    folder = Path(out_dir)
    if folder.name != TOKENIZER_DIR or not has_tokenizer(folder):
        folder = folder / TOKENIZER_DIR
    if not folder.is_dir() or not has_tokenizer(folder):
        return None
    try:
        return tokenizer_files.load_tokenizer(folder)
    except OnnxportError as e:  # any failure to load is the user's folder to fix
        raise UsageError(f"the tokenizer in {folder} does not load: {one_line(e.message, 200)}",
                         "export the model again, or remove the tokenizer folder to serve token ids") from None
