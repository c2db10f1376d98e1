"""Which models are encoder-decoders onnxport exports with their cache, their layout, and the three wrapper
modules (encoder; decoder's first step; decoder with past) that turn flat tensors into the transformers
``EncoderDecoderCache`` and the returned cache back into flat presents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.greedy import rules_from_config
from onnxport.seq2seq.records import Seq2SeqLayout
from onnxport.seq2seq.source import DECODER_POSITIONS, NO_CACHE_HINT, PROBE_SOURCE, Source, describe


def _config(model_dir: str | Path, name: str = "config.json") -> dict:
    try:
        config = json.loads((Path(model_dir) / name).read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def seq2seq_architectures() -> set[str]:
    """The classes transformers maps to AutoModelForSeq2SeqLM and AutoModelForSpeechSeq2Seq."""
    from transformers.models.auto import modeling_auto as auto

    return (set(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values())
            | set(auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.values()))


def _image_to_text(arch: str) -> bool:
    """Whether ``arch`` is an image-to-text class (AutoModelForImageTextToText) whose encoder takes the pixels
    alone (VisionEncoderDecoderModel), not one that takes other inputs onnxport does not lay out."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    if arch not in set(auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values()):
        return False
    return getattr(getattr(transformers, arch, None), "main_input_name", None) == "pixel_values"


def is_seq2seq(model_dir: str | Path) -> bool:
    """Whether the local Hugging Face directory holds an encoder-decoder that generates (its ``config.json``
    sets ``is_encoder_decoder`` and names a class of AutoModelForSeq2SeqLM or AutoModelForSpeechSeq2Seq, or an
    image-to-text class whose encoder takes pixels and whose config or generation config names the decoder's start
    token)."""
    config = _config(model_dir)
    if not config.get("is_encoder_decoder"):
        return False
    names = [str(a) for a in config.get("architectures") or []]
    starts = any(c.get("decoder_start_token_id") is not None  # an image-to-text model without: its plain forward
                 for c in (config, _config(model_dir, "generation_config.json")))
    try:
        known = seq2seq_architectures()
        return any(a in known or (starts and _image_to_text(a)) for a in names)
    except ImportError:
        return False


def _positions(config, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _decoder_positions(config) -> int | None:
    """The decoder's positions: the config's, else its decoder tower's (VisionEncoderDecoder)."""
    for owner in (config, getattr(config, "decoder", None)):
        found = _positions(owner, *DECODER_POSITIONS)
        if found is not None:
            return found
    return None


def fitted_max_length(model: nn.Module, default: int) -> tuple[int, int | None]:
    """(the maximum decoder length to export when none was asked for, the decoder's positions when they are
    fewer than ``default``): a model built for fewer positions is exported at all of them, not refused."""
    limit = _decoder_positions(getattr(model, "config", None))
    if limit is not None and 2 <= limit < default:
        return limit, limit
    return default, None


def seq2seq_layout(model: nn.Module, max_length: int, max_source: int) -> Seq2SeqLayout:
    """The layout of ``model`` (a transformers encoder-decoder) for up to ``max_length`` decoder tokens and
    sources up to ``max_source`` tokens (or frames), read from its encoder input (:func:`~.source.describe`)
    and from the cache it returns on a short first step; what it cannot take is a UsageError."""
    arch, config = type(model).__name__, getattr(model, "config", None)
    if config is None or not getattr(config, "is_encoder_decoder", False) or not hasattr(model, "get_encoder"):
        raise UsageError(f"{arch} is not an encoder-decoder: no encoder and decoder cache to export", NO_CACHE_HINT)
    if max_length < 2:
        raise UsageError(f"--max-length {max_length} is too short for a cache", "give at least 2 tokens")
    limit = _decoder_positions(config)
    if limit is not None and max_length > limit:
        raise UsageError(f"--max-length {max_length} exceeds the {limit} decoder positions {arch} was built for",
                         f"give --max-length {limit} or less")
    found = describe(model)
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise UsageError(f"{arch} names no decoder_start_token_id: the first decoder token is unknown",
                         "set decoder_start_token_id in config.json")
    vocab = int(getattr(config, "vocab_size", 0) or getattr(getattr(config, "decoder", None), "vocab_size", 0) or 0)
    probe = _probe(model, arch, found, start)
    longest = found.longest(probe.ratio, max_source) if found.dynamic else probe.encoded
    speech = found.name == "input_features" and not found.dynamic  # Whisper: features, or audio when served
    return Seq2SeqLayout(arch, str(getattr(config, "model_type", "")), probe.layers, probe.heads, probe.head_dim,
                         probe.hidden, vocab, start, max_length, longest, speech,
                         int(found.dims[0]) if speech else 0, int(found.dims[1]) if speech else 0,
                         _eos(model, config),
                         rules_from_config(getattr(model, "generation_config", None) or config, encoder_decoder=True),
                         found.name, found.dims, found.mask, found.global_attention, probe.ratio != 1)


def _eos(model: nn.Module, config) -> int | None:
    """The end-of-sequence token ``model.generate`` stops at (the generation config's, else the config's; the
    first of several)."""
    for owner in (getattr(model, "generation_config", None), config):
        eos = getattr(owner, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        if isinstance(eos, int) and not isinstance(eos, bool):
            return eos
    return None


class _Probe(NamedTuple):
    layers: int
    heads: int
    head_dim: int
    hidden: int  # the encoder output's width
    encoded: int  # the encoder output's length for the probe's source
    ratio: float  # the probe's source length over its encoder output's (1: one position per token)


def _probe(model, arch: str, found: Source, start: int) -> _Probe:
    """The cache ``model`` returns for a 3-token decoder prompt on a short source (a fixed-size input: its one
    size): self-attention and cross-attention keys and values of one shape, [1, heads, tokens, width]."""
    from transformers import DynamicCache, EncoderDecoderCache

    source = found.example(PROBE_SOURCE)
    with torch.inference_mode():
        try:
            states = model.get_encoder()(**source, return_dict=True).last_hidden_state
            out = model(encoder_outputs=_encoded(states), decoder_input_ids=torch.full((1, 3), start),
                        past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()), use_cache=True,
                        return_dict=True, **found.masks(source))
        except Exception as e:  # noqa: BLE001 - any failure means the cache is not the one assumed
            raise UsageError(f"{arch} fails on a 3-token decoder prompt with an empty encoder-decoder cache: "
                             f"{one_line(e, 160, typed=True)}", NO_CACHE_HINT) from None
    cache = getattr(out, "past_key_values", None)
    own = getattr(getattr(cache, "self_attention_cache", None), "layers", None) or ()
    cross = getattr(getattr(cache, "cross_attention_cache", None), "layers", None) or ()
    shapes = {tuple(t.shape) for layer in own for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)}
    shapes_x = {tuple(t.shape) for layer in cross for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)}
    if not own or len(own) != len(cross) or len(shapes) != 1 or len(shapes_x) != 1:
        raise UsageError(f"{arch} returns a {type(cache).__name__} that is not a per-layer self- and "
                         "cross-attention key/value cache", NO_CACHE_HINT)
    (b, h, t, d), (bx, hx, tx, dx) = shapes.pop(), shapes_x.pop()
    encoded = states.shape[1]
    if (b, t, bx, tx) != (1, 3, 1, encoded) or (h, d) != (hx, dx):
        raise UsageError(f"{arch} keeps self-attention keys {[b, h, t, d]} and cross-attention keys "
                         f"{[bx, hx, tx, dx]} for 3 tokens on a {encoded}-long encoder output: not one layout",
                         NO_CACHE_HINT)
    ratio = PROBE_SOURCE / encoded if found.dynamic else 1.0
    return _Probe(len(own), h, d, int(states.shape[-1]), int(encoded), ratio)


def _encoded(states: torch.Tensor):
    from transformers.modeling_outputs import BaseModelOutput

    return BaseModelOutput(last_hidden_state=states)


def _presents(cache, kinds: tuple[str, ...]) -> list[torch.Tensor]:
    """The returned cache as flat tensors, per layer: decoder key, value (and encoder key, value)."""
    out: list[torch.Tensor] = []
    pairs = zip(cache.self_attention_cache.layers, cache.cross_attention_cache.layers)
    for own, cross in pairs:
        out += [own.keys, own.values]
        if "encoder" in kinds:
            out += [cross.keys, cross.values]
    return out


def _mask_kw(layout: Seq2SeqLayout, mask) -> dict:
    """The encoder mask as the model's forward takes it (none where the layout has none)."""
    return {"attention_mask": mask} if layout.encoder_mask else {}


class Encoder(nn.Module):
    """forward(*the layout's encoder inputs) -> last_hidden_state."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout) -> None:
        super().__init__()
        self.encoder = model.get_encoder()
        self.names = layout.encoder_inputs

    def forward(self, *inputs):
        return self.encoder(**dict(zip(self.names, inputs)), return_dict=True).last_hidden_state


class FirstStep(nn.Module):
    """forward(input_ids, encoder_hidden_states[, encoder_attention_mask]) -> (logits, *presents): the decoder on
    an empty cache; the presents hold the decoder's and the encoder's keys and values per layer."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout) -> None:
        super().__init__()
        self.model = model
        self.layout = layout

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask=None):
        from transformers import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        out = self.model(encoder_outputs=_encoded(encoder_hidden_states), decoder_input_ids=input_ids,
                         past_key_values=cache, use_cache=True, return_dict=True,
                         **_mask_kw(self.layout, encoder_attention_mask))
        return (out.logits, *_presents(out.past_key_values, ("decoder", "encoder")))


class WithPast(nn.Module):
    """forward(input_ids[, encoder_attention_mask], *past) -> (logits, *decoder presents): one step on the cache
    (decoder key, value, encoder key, value per layer). The encoder's keys and values come from the cache, so
    its hidden states are not an input (zeros of their shape stand in for the model's signature)."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout) -> None:
        super().__init__()
        self.model = model
        self.layout = layout

    def forward(self, input_ids, *rest):
        from transformers import DynamicCache, EncoderDecoderCache

        mask, past = (rest[0], rest[1:]) if self.layout.encoder_mask else (None, rest)
        n = self.layout.layers
        own = DynamicCache(ddp_cache_data=[(past[4 * i], past[4 * i + 1]) for i in range(n)])
        cross = DynamicCache(ddp_cache_data=[(past[4 * i + 2], past[4 * i + 3]) for i in range(n)])
        states = past[2].new_zeros(input_ids.shape[0], past[2].shape[2], self.layout.hidden)
        out = self.model(encoder_outputs=_encoded(states), decoder_input_ids=input_ids,
                         past_key_values=EncoderDecoderCache(own, cross), use_cache=True, return_dict=True,
                         **_mask_kw(self.layout, mask))
        return (out.logits, *_presents(out.past_key_values, ("decoder",)))
