"""What an encoder-decoder's encoder takes, read from the model: its main input (``main_input_name``), the dims
after the batch from its config, and the masks its forward takes beside it. One description for every modality:

| main input | dims after batch | from the config | masks |
|---|---|---|---|
| ``input_ids`` (T5, BART, LED, ...) | ``source`` | positions: ``max_source_positions``, ``max_encoder_position_embeddings``, ``max_position_embeddings`` | ``attention_mask``; LED's ``global_attention_mask`` |
| ``input_features``, channels first (Whisper) | ``num_mel_bins``, 2 x ``max_source_positions`` frames | fixed | none |
| ``input_features``, frames first (Speech2Text) | ``source`` frames, ``input_feat_per_channel`` x ``input_channels`` | frames: the positions times what the encoder subsamples | ``attention_mask`` over the frames |
| ``pixel_values`` (VisionEncoderDecoder) | the encoder tower's ``num_channels``, ``image_size`` | fixed | none |

A dim named ``source`` is the dynamic length; a source of one size needs no mask (its rows are never padded)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from onnxport.core.errors import UsageError

NO_CACHE_HINT = "export its plain forward without a cache instead: give its inputs with --input (docs/seq2seq.md)"
SOURCE_POSITIONS = ("max_source_positions", "max_encoder_position_embeddings", "max_position_embeddings")
DECODER_POSITIONS = ("max_target_positions", "max_decoder_position_embeddings", "max_position_embeddings")
PROBE_SOURCE = 16  # the probe's source length (tokens or frames)
MASK, GLOBAL = "attention_mask", "global_attention_mask"


@dataclass(frozen=True)
class Source:
    """The encoder's input: ``name`` [batch, *dims] (``source``: the dynamic length), ``attention_mask``
    [batch, source] beside it when ``mask``, ``global_attention_mask`` when ``global_attention``; ``positions``:
    the most encoder positions (None: unbounded)."""

    name: str
    dims: tuple
    mask: bool
    global_attention: bool
    positions: int | None

    @property
    def dynamic(self) -> bool:
        return "source" in self.dims

    def example(self, length: int) -> dict[str, torch.Tensor]:
        """One row of ``length`` (a fixed-size input: its size): ones for token ids, zeros for features or
        pixels, a full mask, no global token."""
        shape = (1, *(length if d == "source" else int(d) for d in self.dims))
        main = torch.ones(shape, dtype=torch.long) if self.name == "input_ids" else torch.zeros(shape)
        out = {self.name: main}
        if self.mask:
            out[MASK] = torch.ones(1, length, dtype=torch.long)
        if self.global_attention:
            out[GLOBAL] = torch.zeros(1, length, dtype=torch.long)
        return out

    @property
    def masks_named(self) -> tuple[str, ...]:
        """The masks beside the main input, in the encoder's input order."""
        return ((MASK,) if self.mask else ()) + ((GLOBAL,) if self.global_attention else ())

    @staticmethod
    def masks(inputs: dict) -> dict:
        """The mask the decoder takes of ``inputs`` (its ``attention_mask``, when there is one)."""
        return {MASK: inputs[MASK]} if MASK in inputs else {}

    def longest(self, ratio: float, most: int) -> int:
        """The longest source: ``most``, or fewer where the encoder's positions end (``ratio``: source
        positions per encoder position, 4 for Speech2Text's frames)."""
        if self.positions is None:
            return most
        whole = ratio == int(ratio)
        return max(1, min(most, int(self.positions * ratio) if whole else int((self.positions - 1) * ratio)))


def _params(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _tower(config):
    """The encoder tower's config (VisionEncoderDecoder's ``encoder``), else the config itself."""
    sub = getattr(config, "encoder", None)
    return sub if hasattr(sub, "to_dict") else config


def _first(config, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _dims(name: str, config, arch: str) -> tuple:
    if name == "input_ids":
        return ("source",)
    if name == "input_features":
        mel_bins, frames = _first(config, ("num_mel_bins",)), _first(config, ("max_source_positions",))
        if mel_bins and frames:  # channels first, one length: 2 x positions (Whisper)
            return (mel_bins, 2 * frames)
        per_channel = _first(config, ("input_feat_per_channel",))
        if per_channel:  # frames first, any length (Speech2Text)
            return ("source", per_channel * (_first(config, ("input_channels",)) or 1))
    if name == "pixel_values":
        tower = _tower(config)
        size = getattr(tower, "image_size", None)
        size = (size, size) if isinstance(size, int) else tuple(size or ())
        if len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size):
            return (_first(tower, ("num_channels",)) or 3, *size)
    raise UsageError(f"{arch} takes {name} in a layout onnxport cannot read from its config (token ids; log-mel "
                     "features with num_mel_bins or input_feat_per_channel; pixels with image_size)", NO_CACHE_HINT)


def describe(model: nn.Module) -> Source:
    """The encoder input of ``model`` (a transformers encoder-decoder), from ``main_input_name``, its config and
    the forward signatures; an input onnxport cannot lay out is a UsageError."""
    config, arch = model.config, type(model).__name__
    name = str(getattr(model, "main_input_name", "input_ids"))
    dims = _dims(name, config, arch)
    forward, encoder = _params(model.forward), _params(model.get_encoder().forward)
    positions = _first(_tower(config), SOURCE_POSITIONS) if "source" in dims else None
    return Source(name, dims, "source" in dims and MASK in forward, GLOBAL in forward and GLOBAL in encoder,
                  positions)
