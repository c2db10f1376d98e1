"""A speech encoder-decoder's feature extractor (Whisper's ``WhisperFeatureExtractor``, saved beside the model as
``preprocessor_config.json``): loaded offline and checked against the encoder, and the log-mel features it makes
of audio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError, one_line
from onnxport.seq2seq.records import FEATURE_EXTRACTOR_FILE


def load_feature_extractor(folder: Path, layout: Any):
    """The ``WhisperFeatureExtractor`` in ``folder/preprocessor_config.json``, built offline (None when the folder
    has none). One that does not load, or whose mel bins or frames are not the encoder's, is a UsageError."""
    path = Path(folder) / FEATURE_EXTRACTOR_FILE
    if not path.is_file():
        return None
    from transformers import WhisperFeatureExtractor

    try:
        extractor = WhisperFeatureExtractor.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load is the user's folder to fix
        raise UsageError(f"{path} does not load as a Whisper feature extractor: {one_line(e, 200)}",
                         f"export the model again, or remove {FEATURE_EXTRACTOR_FILE} to take input_features only"
                         ) from None
    got = (extractor.feature_size, extractor.nb_max_frames)
    if got != (layout.mel_bins, layout.frames):
        raise UsageError(f"{path} makes {got[0]} mel bins x {got[1]} frames, and the encoder takes "
                         f"{layout.mel_bins} x {layout.frames}",
                         f"put the model's own {FEATURE_EXTRACTOR_FILE} there, or remove it to take input_features")
    return extractor


def log_mel(extractor, audio: np.ndarray) -> np.ndarray:
    """Whisper's log-mel features [1, mel_bins, frames] of ``audio`` (padded to the extractor's length)."""
    out = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="np")
    return np.asarray(out["input_features"], np.float32)
