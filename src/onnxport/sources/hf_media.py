"""The ``hf:DIR`` inputs of video and spectrogram models, made up from the config (and each tower's own config):
video clips (VideoMAE, TimeSformer, ViViT: ``pixel_values`` [batch, frames, channels, height, width]),
spectrograms (AST: ``input_values`` [batch, frames, mel bins]), an audio tower's features beside a text
tower (CLAP: ``input_features`` [batch, channels, frames, mel bins] and, with fusion, ``is_longer``) and images
as patch sequences (SigLIP2's naflex: ``pixel_values`` [1, patches, values per patch], ``pixel_attention_mask``,
``spatial_shapes``)."""

from __future__ import annotations

import math

from onnxport.core.spec import Dim, InputSpec

AUDIO_TOWER = "audio_config"
NAFLEX = ("pixel_attention_mask", "spatial_shapes")  # beside patch-sequence pixel_values


def _tower(config, name: str):
    """The sub-config ``name`` (CLAP's ``audio_config``), else None."""
    return getattr(config, name, None)


def _int(config, *names: str) -> int | None:
    """The first of ``names`` that ``config`` sets to a positive int."""
    for n in names:
        value = getattr(config, n, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _side(config) -> tuple[int, int]:
    size = getattr(config, "image_size", None) or 224
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def is_video(config) -> bool:
    """A video model: its config counts the frames of a clip (VideoMAE, TimeSformer, ViViT)."""
    return _int(config, "num_frames") is not None and getattr(config, "image_size", None) is not None


def is_spectrogram(config) -> bool:
    """``input_values`` that are a spectrogram [batch, frames, mel bins] (AST), not raw samples (wav2vec2)."""
    return (_int(config, "num_mel_bins") is not None and _int(config, "max_length") is not None
            and getattr(config, "conv_kernel", None) is None)


def audio_tower_inputs(config, params) -> list[str]:
    """The audio tower's inputs of a model that also takes token ids (CLAP): ``input_features``, and
    ``is_longer`` where the tower fuses long clips."""
    audio = _tower(config, AUDIO_TOWER)
    if audio is None or "input_features" not in params:
        return []
    return ["input_features", *(["is_longer"] if getattr(audio, "enable_fusion", False) else [])]


def naflex(config) -> tuple[int, int, int] | None:
    """(patches, values per patch, grid side) when the vision tower takes an image as a sequence of patches of
    any aspect (SigLIP2: ``num_patches`` and ``patch_size``, no ``image_size``); else None."""
    vision = _tower(config, "vision_config") or config
    patches, size = _int(vision, "num_patches"), _int(vision, "patch_size")
    if patches is None or size is None or getattr(vision, "image_size", None) is not None:
        return None
    return patches, (_int(vision, "num_channels") or 3) * size * size, math.isqrt(patches)


def media_spec(config, name: str) -> tuple[InputSpec, dict[str, Dim]] | None:
    """The spec of ``name`` and its dims' default ranges when it is a clip, a spectrogram or an audio tower's
    input; None for every other input (made up as before)."""
    if name == "pixel_values" and is_video(config):  # the config's frames and image size, fixed by positions
        height, width = _side(config)
        channels = _int(config, "num_channels") or 3
        return InputSpec(name, "float32", ("batch", _int(config, "num_frames"), channels, height, width)), {}
    flex = naflex(config) if name in ("pixel_values", *NAFLEX) else None
    if flex is not None:  # one image per run: the tower resizes its position grid per image in a Python loop
        patches, values, side = flex  # every patch real, on a square grid (an export keeps the example's grid)
        if name == "pixel_values":
            return InputSpec(name, "float32", (1, patches, values)), {}
        if name == "pixel_attention_mask":
            return InputSpec(name, "int64", (1, patches), (1, 1)), {}
        return InputSpec(name, "int64", (1, 2), (side, side)), {}
    if name == "input_values" and is_spectrogram(config):  # AST: positions fix the frames
        shape = ("batch", _int(config, "max_length"), _int(config, "num_mel_bins"))
        return InputSpec(name, "float32", shape), {}
    audio = _tower(config, AUDIO_TOWER)
    if audio is None:
        return None
    fused = bool(getattr(audio, "enable_fusion", False))
    if name == "is_longer":  # one flag per clip: longer than the window, so fused from four crops
        return InputSpec(name, "bool", ("batch", 1)), {}
    if name == "input_features":  # CLAP: log-mel [batch, 1 (4 fused), frames, mel bins], frames up to the window
        mels = _int(audio, "num_mel_bins") or 64
        spec = _int(audio, "spec_size") or 256
        window = spec * max(spec // mels, 1)  # the tower stretches frames to spec_size x (spec_size // mels)
        most = window - 1  # at the window itself it skips the stretch: a shape test the ONNX graph cannot keep
        dims = {"frames": Dim("frames", 16, most, min(most, 64 + 1))}
        return InputSpec(name, "float32", ("batch", 4 if fused else 1, "frames", mels)), dims
    return None
