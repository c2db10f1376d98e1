"""What a served speech encoder-decoder (Whisper) transcribes: a generate request's ``input_features`` (log-mel,
[mel_bins, frames] or [1, mel_bins, frames], a JSON list of numbers) or its ``audio`` (16 kHz samples, a JSON
list of numbers; turned into features by the ``WhisperFeatureExtractor`` saved as ``preprocessor_config.json``
beside the model), checked before anything runs (BadRequest, 400, one line)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from onnxport.families.serving import BadRequest
from onnxport.seq2seq.records import FEATURE_EXTRACTOR_FILE

SPEECH_FIELDS = ("input_features", "audio")


class SpeechLayout(Protocol):
    """What a speech encoder takes (an encoder-decoder's layout: :class:`onnxport.seq2seq.Seq2SeqLayout`)."""

    mel_bins: int
    frames: int


def _numbers(value: object, name: str) -> np.ndarray:
    """``value`` (nested JSON lists of numbers) as a float32 array; BadRequest for anything else."""
    if not isinstance(value, list):
        raise BadRequest(f"'{name}' must be a JSON list of numbers")
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"'{name}' must be a rectangular JSON list of numbers") from None
    if array.size and not np.isfinite(array).all():
        raise BadRequest(f"'{name}' holds a value that is not a finite number (NaN or infinity)")
    return array.astype(np.float32)


def _features(value: object, layout: SpeechLayout) -> np.ndarray:
    features = _numbers(value, "input_features")
    if features.ndim == 3 and features.shape[0] == 1:
        features = features[0]
    if features.ndim != 2:
        raise BadRequest(f"'input_features' has shape {list(features.shape)}: send [{layout.mel_bins}, "
                         f"{layout.frames}] (mel bins, frames) or [1, {layout.mel_bins}, {layout.frames}]")
    bins, frames = features.shape
    if bins != layout.mel_bins:
        raise BadRequest(f"'input_features' has {bins} mel bins; the model takes {layout.mel_bins}")
    if frames != layout.frames:
        more = "more than" if frames > layout.frames else "fewer than"
        raise BadRequest(f"'input_features' has {frames} frames, {more} the {layout.frames} the encoder takes "
                         "(30 s for Whisper): pad or cut the audio to that length, as WhisperFeatureExtractor does, "
                         "or send 'audio'")
    return features[None]


def _audio(value: object, extractor, model: str) -> np.ndarray:
    if extractor is None:
        raise BadRequest(f"model '{model}' has no feature extractor to turn 'audio' into log-mel features: add "
                         f"the model's {FEATURE_EXTRACTOR_FILE} to its folder (export copies it from the Hugging "
                         "Face folder when there is one), or send 'input_features'")
    audio = _numbers(value, "audio")
    if audio.ndim != 1 or audio.size < 1:
        raise BadRequest(f"'audio' must be a flat, non-empty list of samples at {extractor.sampling_rate} Hz")
    limit = int(extractor.n_samples)
    if audio.size > limit:
        rate = extractor.sampling_rate
        raise BadRequest(f"'audio' holds {audio.size} samples ({audio.size / rate:.2f} s at {rate} Hz), more than "
                         f"the {limit / rate:g} s ({limit} samples) the model takes at once: split it")
    return audio


def speech_source(body: dict, layout: SpeechLayout, extractor, model: str) -> np.ndarray:
    """The source of a speech generate request: log-mel features [1, mel_bins, frames] from ``input_features``,
    or the samples [n] of ``audio`` (turned into features by :func:`log_mel` when generation runs)."""
    given = [name for name in SPEECH_FIELDS if name in body]
    if len(given) != 1:
        also = " ('text_input' and 'input_ids' do not apply)" if {"text_input", "input_ids"} & set(body) else ""
        raise BadRequest(f"model '{model}' transcribes speech: send either 'input_features' (log-mel "
                         f"[{layout.mel_bins}, {layout.frames}]) or 'audio' (samples), not both{also}")
    if given[0] == "audio":
        return _audio(body["audio"], extractor, model)
    return _features(body["input_features"], layout)
