"""The tokenizer files beside a Hugging Face model, checked before the ``tokenizers`` library reads them, and
loaded offline with whatever it raises turned into one line. A ``tokenizer.json`` whose vocabulary names a
token id far past its entries loads, then makes the library build a table up to that id when it is saved beside
an export (4.5 GB and over 20 s for one id of 10^9); a Rust panic surfaces as ``PanicException``, which no
``except Exception`` catches."""

from __future__ import annotations

import os
from pathlib import Path

from onnxport.core.errors import OnnxportError, SourceError, one_line
from onnxport.sources.validate import MAX_VOCAB, read_json

JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "vocab.json")
MAX_BYTES = 1 << 30  # the largest tokenizer.json of a real model is a few tens of MB
ID_SLACK = 1 << 16  # ids past the entries a real vocabulary leaves unused (added tokens after a gap)
FIX = "fix the file, or save the tokenizer again with save_pretrained()"


def tokenizer_problem(folder: str | Path) -> str | None:
    """Why the tokenizer files in ``folder`` cannot be read safely (one line naming the file and what is wrong),
    None where they look sound (or there are none)."""
    folder = Path(folder)
    for name in JSON_FILES:
        file = folder / name
        if not file.is_file():
            continue
        if file.stat().st_size > MAX_BYTES:
            return f"{file} holds {file.stat().st_size:,} bytes, more than a tokenizer has"
        try:
            found = read_json(file)
        except OnnxportError as e:
            return e.message
        if not isinstance(found, dict):
            return f"{file} holds a JSON {type(found).__name__}, not an object"
        said = _ids_problem(found, file) if name in ("tokenizer.json", "vocab.json", "added_tokens.json") else None
        if said:
            return said
    return None


def _ids_problem(data: dict, file: Path) -> str | None:
    """A token id that is no integer, negative or far past the entries (``tokenizer.json``'s model vocabulary and
    added tokens, ``vocab.json`` and ``added_tokens.json`` mapping tokens to ids)."""
    if file.name == "tokenizer.json":
        model = data.get("model")
        vocab = model.get("vocab") if isinstance(model, dict) else None
        added = data.get("added_tokens") or []
        if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
            return f"{file}: added_tokens is not a list of objects"
        ids = [a.get("id") for a in added]
        if isinstance(vocab, dict):
            ids += list(vocab.values())
        count = (len(vocab) if isinstance(vocab, (dict, list)) else 0) + len(added)
    else:
        ids, count = list(data.values()), len(data)
    limit = min(MAX_VOCAB, count + ID_SLACK)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < limit:
            return f"{file}: token id {repr(i)[:40]} is not valid (an integer from 0 below {limit:,})"
    return None


def load_tokenizer(folder: str | Path):
    """The Hugging Face tokenizer in ``folder``, offline, never running remote code; a SourceError (exit 2) in one
    line where its files are unsound or the library refuses them (``ONNXPORT_DEBUG=1`` lets the error through)."""
    problem = tokenizer_problem(folder)
    if problem:
        raise SourceError(f"the tokenizer cannot be read: {problem}", FIX)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except BaseException as e:
        if not _library_error(e) or os.environ.get("ONNXPORT_DEBUG"):
            raise
        raise SourceError(f"the tokenizer in {folder} does not load ({one_line(e, 200, typed=True)})", FIX) from None


def _library_error(e: BaseException) -> bool:
    """An error of the files (any Exception, or the Rust panic ``tokenizers`` raises as a BaseException), not a
    signal or an exit."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"
