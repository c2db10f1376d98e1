"""``--samples PATH``: the user's own inputs, read into a :class:`SampleSet` for the proof and the int8 calibration.

* ``.npz`` / ``.npy``: named arrays (the names are the model's input names; a ``.npy`` for a single-input model)
  with a leading sample axis;
* ``.txt`` (one text per line) or ``.jsonl`` (a ``text`` field, and ``text_pair`` for pairs): tokenized with the
  ``hf:DIR`` model's tokenizer or ``--tokenizer DIR``, truncated to the longest sequence the model declares
  (padded per batch later, by the proof);
* a folder of images: decoded with Pillow and preprocessed the way the source's weights expect, or by
  ``--preprocess file.py:function`` (:mod:`onnxport.sources.images`).

Everything is read and checked at once, before any slow work: a bad file is a one-line UsageError naming the
file and the line, sample index or image.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import BadSamples, OnnxportError, UsageError, missing_dependency, one_line
from onnxport.core.spec import InputSpec
from onnxport.sources.base import LoadedModel
from onnxport.sources.images import read_images
from onnxport.sources.tokenizer_files import load_tokenizer

ARRAY_SUFFIXES = (".npz", ".npy")
TEXT_SUFFIXES = (".txt", ".jsonl")
KIND_OF_DTYPE = {"f": "float", "i": "integer", "u": "integer", "b": "bool"}
FORMATS = "a .npz/.npy of arrays, a .txt/.jsonl of texts, or a folder of images"


@dataclass(frozen=True)
class SampleSet:
    """The user's samples: per sample, one array per model input (spec order), without the batch axis when the
    inputs have one (``batched``), else each sample is a whole input."""

    file: str
    kind: str  # "arrays" | "text" | "images"
    names: tuple[str, ...]
    rows: tuple[tuple[np.ndarray, ...], ...]
    where: tuple[str, ...]  # per sample, how the user finds it: "line 3", "sample 3", "cat.png"
    pad: tuple[float, ...]  # per input: what a shorter row is padded with (a tokenizer's pad id, 0)
    batched: bool = True
    detail: dict[str, Any] = field(default_factory=dict)  # how they were read (tokenizer, transform, ...)

    @property
    def count(self) -> int:
        return len(self.rows)

    def subset(self, indices: Sequence[int]) -> SampleSet:
        """The samples at ``indices`` (their ``where`` kept)."""
        return replace(self, rows=tuple(self.rows[i] for i in indices), where=tuple(self.where[i] for i in indices))

    def split(self, fraction: float = 0.7, seed: int = 0) -> tuple[SampleSet, SampleSet]:
        """(``fraction`` of the samples, the rest), drawn by a seeded permutation (the same on every run)."""
        order = np.random.default_rng(seed).permutation(self.count)
        cut = min(max(1, round(self.count * fraction)), self.count - 1)
        return self.subset(sorted(order[:cut].tolist())), self.subset(sorted(order[cut:].tolist()))

    def to_dict(self) -> dict:
        return {"file": self.file, "kind": self.kind, "count": self.count, **self.detail}


MAX_SAMPLES_BYTES = 2 * 2**30  # a --samples file larger than this is refused before it is read


def check_options(path: str | Path, tokenizer: str | Path | None = None, preprocess: str | None = None) -> None:
    """What can be checked before the model is loaded: the files exist and have a known form."""
    p = Path(path)
    if not p.exists():
        raise BadSamples(p, "not found", "give an existing file or folder")
    if not (p.is_file() or p.is_dir()):
        raise BadSamples(p, "is not a regular file or a folder (a device, a pipe or a socket)",
                         "save the samples to a file first")
    if p.is_file() and p.stat().st_size > MAX_SAMPLES_BYTES:
        raise BadSamples(p, f"holds {p.stat().st_size / 2**30:.1f} GiB, more than the {MAX_SAMPLES_BYTES // 2**30} GiB "
                            "a proof reads", "give a sample of the data: a few hundred rows prove as much")
    if p.is_file() and p.suffix.lower() not in ARRAY_SUFFIXES + TEXT_SUFFIXES:
        raise BadSamples(p, f"unknown kind of file '{p.suffix or p.name}'", f"give {FORMATS}")
    if p.is_file() and not os.access(p, os.R_OK):
        raise BadSamples(p, "cannot be read (permission denied)", "make the file readable")
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise UsageError(f"--tokenizer {tokenizer}: not a folder", "give the folder of a Hugging Face tokenizer "
                         "(tokenizer.json / vocab.txt and tokenizer_config.json)")
    if preprocess is not None and (":" not in preprocess or not preprocess.rsplit(":", 1)[1].isidentifier()):
        raise UsageError(f"malformed --preprocess '{preprocess}'", "write file.py:function")


def read_samples(path: str | Path, loaded: LoadedModel, *, tokenizer: str | Path | None = None,
                 preprocess: str | None = None) -> SampleSet:
    """Read and check the samples at ``path`` for ``loaded`` (UsageError naming the file and line or index)."""
    check_options(path, tokenizer, preprocess)
    p = Path(path)
    batched = leading_axis(loaded)
    if p.is_dir():
        rows, where, detail = read_images(p, loaded, preprocess, batched)
        kind, pad = "images", (0.0,) * len(loaded.inputs)
    elif p.suffix.lower() in ARRAY_SUFFIXES:
        rows, where, detail = _read_arrays(p, loaded, batched), None, {}
        kind, pad = "arrays", (0.0,) * len(loaded.inputs)
    else:
        rows, where, pad, detail = _read_texts(p, loaded, tokenizer, batched)
        kind = "text"
    if not rows:
        raise BadSamples(p, "holds no samples", f"give {FORMATS}")
    where = where or tuple(f"sample {i}" for i in range(len(rows)))
    for row, at in zip(rows, where):
        check_row(p, at, loaded, row, batched, padded=kind == "text")
    return SampleSet(str(path), kind, tuple(s.name for s in loaded.inputs), tuple(rows), tuple(where), pad,
                     batched, detail)


def leading_axis(loaded: LoadedModel) -> bool:
    """Whether every input has a batch axis first (a dynamic dim they share, or a fixed size 1): samples are then
    rows stacked along it; else each sample is one whole input."""
    firsts = {s.shape[0] if s.shape else None for s in loaded.inputs}
    first = next(iter(firsts)) if len(firsts) == 1 else None
    return first == 1 or (isinstance(first, str) and first in loaded.dims)


def row_dims(spec: InputSpec, batched: bool) -> tuple[int | str, ...]:
    """The dims of one sample of ``spec`` (its shape without the batch axis when ``batched``)."""
    return tuple(spec.shape[1:]) if batched else tuple(spec.shape)


# --------------------------------------------------------------------------- checking one sample


def check_row(file: Path, where: str, loaded: LoadedModel, row: Sequence[np.ndarray], batched: bool,
              padded: bool = False) -> None:
    """Every array of one sample fits its input: rank, fixed sizes, dynamic sizes inside the declared ranges
    (``padded``: shorter rows are padded up to a dim's min later), one size per symbol, integer values in range."""
    sizes: dict[str, int] = {}
    for spec, arr in zip(loaded.inputs, row):
        dims = row_dims(spec, batched)
        if arr.ndim != len(dims):
            raise BadSamples(file, f"{where}: '{spec.name}' has shape {list(arr.shape)}, the input takes "
                                   f"[{', '.join(map(str, dims))}] per sample", _shape_hint(batched))
        for axis, (d, n) in enumerate(zip(dims, arr.shape)):
            _check_size(file, where, loaded, spec, axis + int(batched), d, int(n), sizes, padded)
    for spec, arr in zip(loaded.inputs, row):
        _check_values(file, where, spec, arr, sizes)


def _shape_hint(batched: bool) -> str:
    return ("arrays carry a leading sample axis, then the input's shape without its batch axis" if batched
            else "arrays carry a leading sample axis, then the input's whole shape")


def _check_size(file: Path, where: str, loaded: LoadedModel, spec: InputSpec, axis: int, d: int | str, n: int,
                sizes: dict[str, int], padded: bool) -> None:
    if isinstance(d, int):
        if n != d and not (padded and n < d):
            raise BadSamples(file, f"{where}: '{spec.name}' axis {axis} is {n}, the model takes {d}",
                             "give samples of the input's fixed sizes")
        return
    dim = loaded.dims.get(d)
    if dim is not None:
        fits = n <= dim.max if padded else dim.allows(n)
        if not fits:
            allowed = str(dim).split("=", 1)[1]
            raise BadSamples(file, f"{where}: '{spec.name}' axis {axis} ('{d}') is {n}, outside the declared {allowed}",
                             f"give samples inside the range, or declare a wider one with -d {d}=MIN..MAX")
    if not padded and sizes.setdefault(d, n) != n:
        raise BadSamples(file, f"{where}: '{spec.name}' axis {axis} ('{d}') is {n}, another input has {d}={sizes[d]}",
                         f"every input sharing '{d}' needs the same size in one sample")


def _check_values(file: Path, where: str, spec: InputSpec, arr: np.ndarray, sizes: dict[str, int]) -> None:
    if spec.value_range is None or not arr.size or spec.dtype == "bool":
        return
    lo, hi = spec.value_range
    if isinstance(hi, str):
        if hi not in sizes:
            return
        hi = sizes[hi]
    outside = (arr < lo) | (arr > hi)
    if outside.any():
        at = tuple(int(i) for i in np.argwhere(outside)[0])
        raise BadSamples(file, f"{where}: '{spec.name}' holds {arr[at].item()} at {list(at)}, outside its range {lo}..{hi}",
                         f"give values the model takes, or declare the range with -i '{spec}'")


# --------------------------------------------------------------------------- arrays


def _listed(names: list[str], most: int = 8) -> str:
    """``names`` joined by commas, the first ``most`` only (each cut to 40 characters), then how many in all."""
    shown = ", ".join(n if len(n) <= 40 else n[:39] + "…" for n in names[:most])
    return shown if len(names) <= most else f"{shown}, … ({len(names):,} in all)"


def _read_arrays(path: Path, loaded: LoadedModel, batched: bool) -> list[tuple[np.ndarray, ...]]:
    names = [s.name for s in loaded.inputs]
    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.ndarray):
            arrays = {"": data}
        else:
            with data:
                if len(data.files) > len(names):  # names only: the arrays of a file that cannot fit stay unread
                    arrays = dict.fromkeys(data.files)
                else:
                    arrays = {k: data[k] for k in data.files}
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise BadSamples(path, f"cannot be read as {path.suffix} ({one_line(e, 200, typed=True)})",
                         "write it with numpy.savez(path, NAME=array, ...) or numpy.save") from None
    if "" in arrays:
        if len(names) != 1:
            raise BadSamples(path, f"a .npy holds one array, the model has {len(names)} inputs ({', '.join(names)})",
                             "write a .npz with one array per input: numpy.savez(path, " + "=..., ".join(names) + "=...)")
        arrays = {names[0]: arrays[""]}
    missing = [n for n in names if n not in arrays]
    extra = [k for k in arrays if k not in names]
    if missing or extra:
        lacking = f" (missing: {_listed(missing)})" if missing else ""
        raise BadSamples(path, f"holds arrays {_listed(list(arrays)) or 'none'}; the model's inputs are "
                               f"{_listed(names)}{lacking}", "name the arrays after the inputs: numpy.savez(path, "
                               + _listed([f"{n}=..." for n in names]) + ")")
    counts = {n: (arrays[n].shape[0] if arrays[n].ndim else None) for n in names}
    if len(set(counts.values())) != 1 or None in counts.values():
        shown = ", ".join(f"'{n}' {list(arrays[n].shape)}" for n in names)
        raise BadSamples(path, f"the arrays need one leading sample axis of one length: {shown}", _shape_hint(batched))
    ordered = [_cast(path, s, arrays[s.name]) for s in loaded.inputs]
    for spec, arr in zip(loaded.inputs, ordered):
        if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
            bad = np.flatnonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1))
            raise BadSamples(path, f"array '{spec.name}' holds NaN or infinite values ({len(bad)} of {len(arr)} "
                                   f"samples, first: sample {bad[0]})",
                             "a proof on non-finite inputs checks nothing: give finite samples")
    return [tuple(a[i] for a in ordered) for i in range(counts[names[0]])]


def _cast(path: Path, spec: InputSpec, arr: np.ndarray) -> np.ndarray:
    """``arr`` in the input's dtype, when it is of the same kind (float, integer, bool)."""
    want = "bool" if spec.dtype == "bool" else "float" if spec.dtype.startswith(("float", "bfloat")) else "integer"
    have = KIND_OF_DTYPE.get(arr.dtype.kind)
    if have != want:
        raise BadSamples(path, f"array '{spec.name}' is {arr.dtype}, the input is {spec.dtype}",
                         f"save it as a {want} array")
    return arr if spec.dtype == "bfloat16" else arr.astype(spec.dtype, copy=False)


# --------------------------------------------------------------------------- texts


def _text_lines(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(where, the texts of one sample) per non-blank line of a .txt or .jsonl file."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadSamples(path, f"cannot be read ({e.strerror or type(e).__name__})", "give a readable file") from None
    out = []
    for no, line in enumerate(raw.splitlines(), 1):
        try:
            text = line.decode("utf-8-sig" if no == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise BadSamples(path, f"line {no} is not UTF-8 text (byte {e.start + 1})", "save the file as UTF-8") from None
        if not text.strip():
            continue
        out.append((f"line {no}", _jsonl_texts(path, no, text) if path.suffix.lower() == ".jsonl" else (text,)))
    return out


def _jsonl_texts(path: Path, no: int, line: str) -> tuple[str, ...]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadSamples(path, f"line {no} is not valid JSON ({e.msg} at column {e.colno})",
                         'write one object per line, e.g. {"text": "...", "text_pair": "..."}') from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise BadSamples(path, f"line {no} has no string field 'text'",
                         'write one object per line, e.g. {"text": "..."} (and "text_pair" for pairs)')
    pair = record.get("text_pair")
    if pair is not None and not isinstance(pair, str):
        raise BadSamples(path, f"line {no}: 'text_pair' is a {type(pair).__name__}, not a string", "make it a string")
    return (record["text"],) if pair is None else (record["text"], pair)


def _tokenizer(path: Path, loaded: LoadedModel, given: str | Path | None):
    where = str(given) if given is not None else (loaded.source.split(":", 1)[1] if loaded.kind == "hf" else None)
    if where is None:
        raise BadSamples(path, f"holds texts, and {loaded.source} brings no tokenizer",
                         "pass --tokenizer DIR (a folder holding a Hugging Face tokenizer)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers  # noqa: F401 - a missing dependency named before the tokenizer is read
    except ImportError:
        raise missing_dependency("transformers", "hf") from None
    try:
        tok = load_tokenizer(where)
    except OnnxportError as e:  # a folder without a usable tokenizer
        raise UsageError(f"cannot load a tokenizer from {where} ({one_line(e.message, 200)})",
                         "pass --tokenizer DIR: a folder with tokenizer.json or vocab.txt and tokenizer_config.json",
                         code="samples-unreadable") from None
    return tok, where


def _token_inputs(path: Path, loaded: LoadedModel, produced: Sequence[str]) -> list[str]:
    """For each model input, the tokenizer output feeding it."""
    ints = [s for s in loaded.inputs if not s.dtype.startswith(("float", "bfloat"))]
    keys = []
    for s in loaded.inputs:
        if s.name in produced:
            keys.append(s.name)
        elif len(loaded.inputs) == 1 and ints and "input_ids" in produced:
            keys.append("input_ids")  # one token input under another name
        else:
            raise BadSamples(path, f"the tokenizer gives {', '.join(produced)}; the model's input '{s.name}' is none of them",
                             "name the model's inputs after the tokenizer's outputs, or give the inputs as a .npz")
    return keys


def _read_texts(path: Path, loaded: LoadedModel, tokenizer: str | Path | None, batched: bool):
    lines = _text_lines(path)
    if not lines:
        raise BadSamples(path, "holds no texts", "write one text per line (.txt) or one JSON object per line (.jsonl)")
    tok, where = _tokenizer(path, loaded, tokenizer)
    if not batched or any(len(s.shape) != 2 for s in loaded.inputs):
        raise BadSamples(path, "texts feed models whose inputs are [batch, seq]; this one takes "
                               + ", ".join(str(s) for s in loaded.inputs), "give the inputs as a .npz")
    seq = loaded.inputs[0].shape[1]
    limit = seq if isinstance(seq, int) else loaded.dims[seq].max
    limit = min(limit, int(getattr(tok, "model_max_length", limit) or limit))
    rows, wheres, keys = [], [], None
    for at, texts in lines:
        try:
            enc = tok(*texts, truncation=True, max_length=limit)
        except Exception as e:  # noqa: BLE001 - the tokenizer refuses this text
            raise BadSamples(path, f"{at}: the tokenizer fails ({one_line(e, 200, typed=True)})", "check the text on that line") from None
        keys = keys or _token_inputs(path, loaded, list(enc.keys()))
        rows.append(tuple(np.asarray(enc[k], dtype=s.dtype) for k, s in zip(keys, loaded.inputs)))
        wheres.append(at)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    pad = tuple(float(pad_id) if k == "input_ids" else 0.0 for k in keys)
    pairs = sum(len(t) == 2 for _, t in lines)
    detail = {"tokenizer": where, "max_length": limit, "pairs": pairs}
    return rows, tuple(wheres), pad, detail
