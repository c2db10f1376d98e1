"""Whisper served by Triton's generate extension: the tiny Whisper export served for real on 127.0.0.1, log-mel
``input_features`` and raw 16 kHz ``audio`` in, the tokens of PyTorch's ``model.generate`` out; bad inputs are
one-line 400s, and a folder without the feature extractor says what to add."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
import transformers

from onnxport.serve import serve_app
from tests.seq2seq.conftest import feature_extractor
from tests.seq2seq.tiny import tiny
from tests.serve.test_generate import _events
from tests.serve.test_serve import post, running

MEL, FRAMES, RATE = 16, 64, 16000
EOS = 2


def _generate(features: np.ndarray, tokens: int) -> tuple[list[int], str]:
    """PyTorch's ``model.generate(input_features, do_sample=False)`` tokens (without the start token) up to its
    end-of-sequence token, and the finish reason the server gives for them."""
    with torch.inference_mode():
        out = tiny("whisper").generate(torch.from_numpy(features), do_sample=False, max_new_tokens=tokens)
    ids = out[0].tolist()
    return (ids[:ids.index(EOS)], "stop") if EOS in ids else (ids, "length")


def _ask(url: str, body: dict, model: str = "whisper") -> tuple[int, dict]:
    status, _, raw = post(url, f"/v2/models/{model}/generate", json.dumps(body).encode())
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def server(whisper_out):
    with running(serve_app(whisper_out)) as url:
        yield url


def _features(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((1, MEL, FRAMES)) * 0.5).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_input_features_give_pytorch_generate_tokens(server, seed):
    features = _features(seed)
    want, reason = _generate(features, 20)
    assert len(set(want)) >= 3  # the tokens vary: the comparison means something
    for sent in (features[0].tolist(), features.tolist()):  # [mel, frames] and [1, mel, frames]
        status, answer = _ask(server, {"input_features": sent, "parameters": {"max_tokens": 20}})
        assert status == 200, answer
        assert answer["output_ids"] == want and answer["finish_reason"] == reason
    events = _events(server, {"input_features": features[0].tolist(), "parameters": {"max_tokens": 20}},
                     model="whisper")
    assert [t for _, e in events for t in e["output_ids"]] == want and events[-1][1]["final"]


@pytest.mark.slow
def test_audio_is_turned_into_features_by_the_exported_feature_extractor(server):
    audio = (np.sin(np.arange(12000) * 2 * math.pi * 440 / RATE) * 0.3
             + np.random.default_rng(5).standard_normal(12000) * 0.05).astype(np.float32)
    features = feature_extractor()(audio, sampling_rate=RATE, return_tensors="np")["input_features"]
    want, reason = _generate(features.astype(np.float32), 16)
    status, answer = _ask(server, {"audio": audio.tolist(), "parameters": {"max_tokens": 16}})
    assert status == 200, answer
    assert answer["output_ids"] == want and answer["finish_reason"] == reason


def _bad_bodies() -> list[tuple[str, dict, str]]:
    ok = np.zeros((MEL, FRAMES)).tolist()
    nan = np.zeros((MEL, FRAMES))
    nan[3, 5] = np.nan
    return [
        ("mel bins", {"input_features": np.zeros((MEL - 1, FRAMES)).tolist()}, "15 mel bins; the model takes 16"),
        ("too many frames", {"input_features": np.zeros((MEL, FRAMES + 1)).tolist()}, "65 frames, more than the 64"),
        ("too few frames", {"input_features": np.zeros((MEL, 10)).tolist()}, "10 frames, fewer than the 64"),
        ("rank", {"input_features": np.zeros((2, MEL, FRAMES)).tolist()}, "has shape [2, 16, 64]"),
        ("ragged", {"input_features": [[0.0, 1.0], [0.0]]}, "rectangular JSON list of numbers"),
        ("strings", {"input_features": [["a"] * FRAMES] * MEL}, "rectangular JSON list of numbers"),
        ("NaN features", {"input_features": nan.tolist()}, "which JSON has no number for"),
        ("infinite audio", {"audio": [0.0, math.inf]}, "which JSON has no number for"),
        ("audio too long", {"audio": [0.0] * (RATE + 1)}, "16001 samples (1.00 s at 16000 Hz), more than the 1 s"),
        ("empty audio", {"audio": []}, "flat, non-empty list"),
        ("both", {"audio": [0.0], "input_features": ok}, "either 'input_features'"),
        ("neither", {"parameters": {"max_tokens": 4}}, "either 'input_features'"),
        ("text", {"text_input": "hello"}, "'text_input' and 'input_ids' do not apply"),
        ("too many tokens", {"input_features": ok, "parameters": {"max_tokens": 40}}, "24 decoder tokens"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "body", "says"), _bad_bodies(), ids=[c[0] for c in _bad_bodies()])
def test_bad_speech_input_is_a_one_line_400(server, case, body, says):
    status, answer = _ask(server, body)
    assert status == 400, answer
    assert says in answer["error"] and "\n" not in answer["error"]


@pytest.mark.slow
def test_a_folder_without_the_feature_extractor_refuses_audio_saying_what_to_add(whisper_out, tmp_path):
    out = tmp_path / "whisper"
    shutil.copytree(whisper_out, out)
    (out / "preprocessor_config.json").unlink()
    features = _features(0)
    with running(serve_app(out)) as url:
        status, answer = _ask(url, {"audio": [0.0] * 100})
        assert status == 400 and "add the model's preprocessor_config.json" in answer["error"]
        status, answer = _ask(url, {"input_features": features[0].tolist(), "parameters": {"max_tokens": 8}})
        assert status == 200 and answer["output_ids"] == _generate(features, 8)[0]


def test_a_feature_extractor_of_another_shape_stops_serve(whisper_out, tmp_path):
    from onnxport.core.errors import UsageError

    out = tmp_path / "whisper"
    shutil.copytree(whisper_out, out)
    transformers.WhisperFeatureExtractor(feature_size=80).save_pretrained(out)  # Whisper's real 80 x 3000
    with pytest.raises(UsageError) as e:
        serve_app(out)
    assert "80 mel bins x 3000 frames" in e.value.message and e.value.exit_code == 2
