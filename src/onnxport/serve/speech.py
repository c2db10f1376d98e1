"""The file a served speech encoder-decoder's feature extractor is saved in (``WhisperFeatureExtractor``'s, as
transformers saves it beside the model), copied into a Triton repository entry; a speech request is read by the
family's server part."""

from __future__ import annotations

FEATURE_EXTRACTOR_FILE = "preprocessor_config.json"  # the feature extractor's file, as transformers saves it
