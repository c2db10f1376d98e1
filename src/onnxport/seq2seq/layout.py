"""Which models are encoder-decoders onnxport exports with their cache, their layout, and the three wrapper
modules (encoder; decoder's first step; decoder with past) that turn flat tensors into the transformers
``EncoderDecoderCache`` and the returned cache back into flat presents."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.greedy import rules_from_config
from onnxport.seq2seq.records import Seq2SeqLayout

NO_CACHE_HINT = "export its plain forward without a cache instead: give its inputs with --input (docs/seq2seq.md)"


def _config(model_dir: str | Path) -> dict:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def seq2seq_architectures() -> set[str]:
    """The classes transformers maps to AutoModelForSeq2SeqLM and AutoModelForSpeechSeq2Seq."""
    from transformers.models.auto import modeling_auto as auto

    return (set(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values())
            | set(auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.values()))


def is_seq2seq(model_dir: str | Path) -> bool:
    """Whether the local Hugging Face directory holds an encoder-decoder that generates (its ``config.json``
    sets ``is_encoder_decoder`` and names a class of AutoModelForSeq2SeqLM or AutoModelForSpeechSeq2Seq)."""
    config = _config(model_dir)
    if not config.get("is_encoder_decoder"):
        return False
    names = [str(a) for a in config.get("architectures") or []]
    try:
        known = seq2seq_architectures()
    except ImportError:
        return False
    return any(a in known for a in names)


def _positions(config, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fitted_max_length(model: nn.Module, default: int) -> tuple[int, int | None]:
    """(the maximum decoder length to export when none was asked for, the decoder's positions when they are
    fewer than ``default``): a model built for fewer positions is exported at all of them, not refused."""
    limit = _positions(getattr(model, "config", None), "max_target_positions", "max_position_embeddings")
    if limit is not None and 2 <= limit < default:
        return limit, limit
    return default, None


def seq2seq_layout(model: nn.Module, max_length: int, max_source: int) -> Seq2SeqLayout:
    """The layout of ``model`` (a transformers encoder-decoder) for up to ``max_length`` decoder tokens and
    sources up to ``max_source`` tokens, read from the cache it returns on a short first step; what it cannot
    take is a UsageError."""
    arch, config = type(model).__name__, getattr(model, "config", None)
    if config is None or not getattr(config, "is_encoder_decoder", False) or not hasattr(model, "get_encoder"):
        raise UsageError(f"{arch} is not an encoder-decoder: no encoder and decoder cache to export", NO_CACHE_HINT)
    if max_length < 2:
        raise UsageError(f"--max-length {max_length} is too short for a cache", "give at least 2 tokens")
    limit = _positions(config, "max_target_positions", "max_position_embeddings")
    if limit is not None and max_length > limit:
        raise UsageError(f"--max-length {max_length} exceeds the {limit} decoder positions {arch} was built for",
                         f"give --max-length {limit} or less")
    speech = getattr(model, "main_input_name", "input_ids") == "input_features"
    mel_bins = int(getattr(config, "num_mel_bins", 0) or 0)
    frames = 2 * int(getattr(config, "max_source_positions", 0) or 0) if speech else 0
    if speech and (not mel_bins or not frames or getattr(config, "model_type", "") != "whisper"):
        raise UsageError(f"{arch} takes speech features onnxport cannot lay out (Whisper's log-mel input only)",
                         NO_CACHE_HINT)
    if not speech:
        source_limit = _positions(config, "max_source_positions", "max_position_embeddings")
        max_source = min(max_source, source_limit) if source_limit else max_source
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise UsageError(f"{arch} names no decoder_start_token_id: the first decoder token is unknown",
                         "set decoder_start_token_id in config.json")
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    hidden = int(getattr(config, "d_model", 0) or getattr(config, "hidden_size", 0) or 0)
    layers, heads, head_dim = _probe(model, arch, speech, mel_bins, frames, hidden, start)
    return Seq2SeqLayout(arch, str(getattr(config, "model_type", "")), layers, heads, head_dim, hidden, vocab, start,
                         max_length, frames // 2 if speech else max_source, speech, mel_bins, frames,
                         _eos(model, config),
                         rules_from_config(getattr(model, "generation_config", None) or config, encoder_decoder=True))


def _eos(model: nn.Module, config) -> int | None:
    """The end-of-sequence token ``model.generate`` stops at (the generation config's, else the config's; the
    first of several)."""
    for owner in (getattr(model, "generation_config", None), config):
        eos = getattr(owner, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        if isinstance(eos, int) and not isinstance(eos, bool):
            return eos
    return None


def _probe(model, arch, speech, mel_bins, frames, hidden, start) -> tuple[int, int, int]:
    """(layers, heads, head width) of the cache ``model`` returns for a 3-token decoder prompt on a 4-token
    source: self-attention and cross-attention keys and values of one shape, [1, heads, tokens, width]."""
    from transformers import DynamicCache, EncoderDecoderCache

    source = frames // 2 if speech else 4
    with torch.inference_mode():
        if speech:
            states = model.get_encoder()(input_features=torch.zeros(1, mel_bins, frames)).last_hidden_state
        else:
            states = model.get_encoder()(input_ids=torch.ones(1, 4, dtype=torch.long)).last_hidden_state
        try:
            out = model(encoder_outputs=_encoded(states), decoder_input_ids=torch.full((1, 3), start),
                        past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()), use_cache=True,
                        return_dict=True)
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
    if (b, t, bx, tx) != (1, 3, 1, source) or (h, d) != (hx, dx) or states.shape[-1] != hidden:
        raise UsageError(f"{arch} keeps self-attention keys {[b, h, t, d]} and cross-attention keys "
                         f"{[bx, hx, tx, dx]} for 3 tokens on a {source}-token source: not one layout",
                         NO_CACHE_HINT)
    return len(own), h, d


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


class Encoder(nn.Module):
    """forward(input_ids, attention_mask) or forward(input_features) -> last_hidden_state."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout) -> None:
        super().__init__()
        self.encoder = model.get_encoder()
        self.speech = layout.speech

    def forward(self, *inputs):
        if self.speech:
            return self.encoder(input_features=inputs[0], return_dict=True).last_hidden_state
        return self.encoder(input_ids=inputs[0], attention_mask=inputs[1], return_dict=True).last_hidden_state


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
        out = self.model(encoder_outputs=_encoded(encoder_hidden_states), attention_mask=encoder_attention_mask,
                         decoder_input_ids=input_ids, past_key_values=cache, use_cache=True, return_dict=True)
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
        out = self.model(encoder_outputs=_encoded(states), attention_mask=mask, decoder_input_ids=input_ids,
                         past_key_values=EncoderDecoderCache(own, cross), use_cache=True, return_dict=True)
        return (out.logits, *_presents(out.past_key_values, ("decoder",)))
