"""Exported encoder-decoders shared by the seq2seq, serve, speech and Triton tests, each exported once per test
run (under pytest-xdist the workers share one copy, made by the first under a file lock): the tiny T5 with a tiny
local tokenizer, exported through the command line, and the tiny Whisper with a feature extractor made for its 16
mel bins and 64 frames (1 s of 16 kHz audio)."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.seq2seq.tiny import tiny

MAX_LENGTH = 24


def feature_extractor():
    """A WhisperFeatureExtractor for the tiny Whisper: 16 mel bins, 64 frames of 250 samples (1 s at 16 kHz)."""
    import transformers

    return transformers.WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=250,
                                                chunk_length=1, n_fft=400)


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """ROOT/``name`` after ``build(ROOT)`` ran once in this test run: in the run's base temporary folder, shared
    by the xdist workers (the first builds it under a lock, the others wait and reuse it)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/, above each worker's popen-gwK/
    root = base / f"once-{name}"
    with open(base / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (root / "done").is_file():
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir()
                build(root)
                (root / "done").touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root / name


def _t5(root: Path) -> None:
    from tests.conftest import run_cli
    from tests.serve.test_generate import _tokenizer

    tiny("t5").save_pretrained(root / "hf")
    _tokenizer(None).save_pretrained(root / "hf")
    proc = run_cli("export", f"hf:{root / 'hf'}", "-o", str(root / "t5"), "--max-length", str(MAX_LENGTH))
    (root / "t5.stderr").write_text(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / "t5" / "tokenizer").is_dir()


def _whisper(root: Path) -> None:
    from onnxport import api

    tiny("whisper").save_pretrained(root / "hf")
    feature_extractor().save_pretrained(root / "hf")
    rep = api.export(f"hf:{root / 'hf'}", root / "whisper", max_length=MAX_LENGTH)
    assert rep["status"] == "ok" and (root / "whisper" / "preprocessor_config.json").is_file()
    assert rep["seq2seq"]["layout"]["eos_token_id"] == 2


@pytest.fixture(scope="session")
def t5_out(tmp_path_factory) -> Path:
    """The tiny T5 (with a tokenizer) exported by ``onnxport export hf:DIR -o OUT --max-length 24`` in a
    subprocess: three files, report.json, tokenizer/; the command's stderr is ``OUT/../t5.stderr``."""
    return once_per_run(tmp_path_factory, "t5", _t5)


@pytest.fixture(scope="session")
def whisper_out(tmp_path_factory) -> Path:
    """The tiny Whisper exported by ``api.export`` from a folder with its preprocessor_config.json."""
    return once_per_run(tmp_path_factory, "whisper", _whisper)
