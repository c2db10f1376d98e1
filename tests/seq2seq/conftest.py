"""Exported encoder-decoders shared by the serve, speech and Triton tests (each exported once per session): the
tiny T5 with a tiny local tokenizer, and the tiny Whisper with a feature extractor made for its 16 mel bins and
64 frames (1 s of 16 kHz audio)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.seq2seq.tiny import tiny

MAX_LENGTH = 24


def feature_extractor():
    """A WhisperFeatureExtractor for the tiny Whisper: 16 mel bins, 64 frames of 250 samples (1 s at 16 kHz)."""
    import transformers

    return transformers.WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=250,
                                                chunk_length=1, n_fft=400)


@pytest.fixture(scope="session")
def t5_out(tmp_path_factory) -> Path:
    """The tiny T5 exported by ``api.export`` (three files, report.json, tokenizer/)."""
    from onnxport import api
    from tests.serve.test_generate import _tokenizer

    root = tmp_path_factory.mktemp("t5-serve")
    tiny("t5").save_pretrained(root / "hf")
    _tokenizer(None).save_pretrained(root / "hf")
    out = root / "t5"
    rep = api.export(f"hf:{root / 'hf'}", out, max_length=MAX_LENGTH)
    assert rep["status"] == "ok" and (out / "tokenizer").is_dir()
    return out


@pytest.fixture(scope="session")
def whisper_out(tmp_path_factory) -> Path:
    """The tiny Whisper exported by ``api.export`` from a folder with its preprocessor_config.json."""
    from onnxport import api

    root = tmp_path_factory.mktemp("whisper-serve")
    tiny("whisper").save_pretrained(root / "hf")
    feature_extractor().save_pretrained(root / "hf")
    out = root / "whisper"
    rep = api.export(f"hf:{root / 'hf'}", out, max_length=MAX_LENGTH)
    assert rep["status"] == "ok" and (out / "preprocessor_config.json").is_file()
    assert rep["seq2seq"]["layout"]["eos_token_id"] == 2
    return out
