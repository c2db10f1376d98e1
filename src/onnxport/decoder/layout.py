"""Which models have a KV cache onnxport can export, its layout, and the wrapper module that turns flat past
tensors into the transformers cache object and the returned cache back into flat presents."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.greedy import rules_from_config
from onnxport.decoder.records import CacheLayout

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
KNOWN_LAYER_TYPES = {"full_attention", "sliding_attention"}


def architectures(model_dir: str | Path) -> list[str]:
    """The ``architectures`` that ``config.json`` in ``model_dir`` names (none when unreadable)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(a) for a in names or []]


def is_causal_lm(model_dir: str | Path) -> bool:
    """Whether the local Hugging Face directory holds a causal language model (``*ForCausalLM``,
    ``*LMHeadModel``): the kind that generates token by token and gets a KV cache."""
    return any(a.endswith(CAUSAL_SUFFIXES) for a in architectures(model_dir))


NO_CACHE_HINT = "export its plain forward without a cache instead: give its inputs with --input (docs/decoders.md)"


def cache_layout(model: nn.Module, max_length: int) -> CacheLayout:
    """The cache layout of ``model`` (a transformers causal LM) for up to ``max_length`` tokens, read from the
    cache the model returns for a short prompt; a model whose cache is not the standard per-layer key/value
    pair, or a ``max_length`` it cannot take, is a UsageError."""
    arch = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or not arch.endswith(CAUSAL_SUFFIXES):
        raise UsageError(f"{arch} is not a causal language model: no KV cache to export", NO_CACHE_HINT)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    params = inspect.signature(model.forward).parameters
    if "past_key_values" not in params:
        state = next((p for p in ("cache_params", "state", "mems") if p in params), None)
        kind = (f"keeps a recurrent state ({state}), not a key/value cache" if state
                else "takes no past_key_values: it has no key/value cache")
        raise UsageError(f"{arch}.forward() {kind}; onnxport exports decoders with a key/value cache only",
                         NO_CACHE_HINT)
    window = _check_length(text, arch, max_length)
    position_ids = "position_ids" in params
    layers, kv_heads, key_dim, value_dim = _probe(model, arch, position_ids)
    heads = getattr(text, "num_attention_heads", None)
    heads = heads if isinstance(heads, int) and heads > 0 else kv_heads
    layout = CacheLayout(arch, str(getattr(text, "model_type", "")), layers, heads, kv_heads, key_dim,
                         int(getattr(text, "vocab_size", 0) or 0), position_ids, max_length,
                         value_dim if value_dim != key_dim else None, window,
                         rules_from_config(getattr(model, "generation_config", None), encoder_decoder=False))
    _dry_run(model, layout)
    return layout


def _probe(model: nn.Module, arch: str, position_ids: bool) -> tuple[int, int, int, int]:
    """(layers, kv heads, key width, value width) of the cache ``model`` returns for a 3-token prompt on an
    empty DynamicCache: the shapes it really keeps (one head under multi-query attention, the latent widths of
    multi-head latent attention), whatever its config names."""
    from transformers import DynamicCache

    ids = torch.zeros(1, 3, dtype=torch.long)
    extra = {"position_ids": torch.arange(3)[None]} if position_ids else {}
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=torch.ones(1, 3, dtype=torch.long),
                        past_key_values=DynamicCache(), use_cache=True, return_dict=True, **extra)
    except Exception as e:  # noqa: BLE001 - any failure means the cache is not the one assumed
        raise UsageError(f"{arch} fails on a 3-token prompt with an empty key/value cache: "
                         f"{one_line(e, 160, typed=True)}", NO_CACHE_HINT) from None
    cache = getattr(out, "past_key_values", None)
    cached = getattr(cache, "layers", None) or ()
    keys = [getattr(layer, "keys", None) for layer in cached]
    values = [getattr(layer, "values", None) for layer in cached]
    if not cached or not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in keys + values):
        raise UsageError(f"{arch} returns a {type(cache).__name__} that is not a per-layer key/value cache",
                         NO_CACHE_HINT)
    key_shapes = {tuple(t.shape) for t in keys}
    value_shapes = {tuple(t.shape) for t in values}
    if len(key_shapes) != 1 or len(value_shapes) != 1:
        raise UsageError(f"{arch} keeps caches of different shapes in different layers (keys "
                         f"{sorted(key_shapes)[:3]}, values {sorted(value_shapes)[:3]}): one exported layout "
                         "cannot hold them", NO_CACHE_HINT)
    (kb, kh, kt, kd), (vb, vh, vt, vd) = key_shapes.pop(), value_shapes.pop()
    if (kb, kt, vb, vt) != (1, 3, 1, 3) or kh != vh:
        raise UsageError(f"{arch} returns keys of shape {[kb, kh, kt, kd]} and values of shape {[vb, vh, vt, vd]} "
                         "for one 3-token prompt, not [batch, kv_heads, tokens, width]", NO_CACHE_HINT)
    return len(cached), kh, kd, vd


def fitted_max_length(model: nn.Module, default: int) -> tuple[int, int | None]:
    """(the maximum length to export when none was asked for, the model's positions when they are fewer than
    ``default``): a model built for fewer positions is exported at all of them, not refused."""
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and 2 <= limit < default:
        return limit, limit
    return default, None


def _check_length(config, arch: str, max_length: int) -> int | None:
    """Refuse a ``max_length`` the model cannot take; returns its sliding window where ``max_length`` passes it
    (the exported cache keeps every token and the mask applies the window; the proof runs past it)."""
    if max_length < 2:
        raise UsageError(f"--max-length {max_length} is too short for a cache", "give at least 2 tokens")
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and max_length > limit:
        raise UsageError(f"--max-length {max_length} exceeds the {limit} positions {arch} was built for",
                         f"give --max-length {limit} or less")
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - KNOWN_LAYER_TYPES:
        raise UsageError(f"{arch} has layers of kind {', '.join(sorted(kinds - KNOWN_LAYER_TYPES))}: its cache "
                         "is not a plain key/value cache", NO_CACHE_HINT)
    window = getattr(config, "sliding_window", None)
    slides = "sliding_attention" in kinds or (not kinds and getattr(config, "use_sliding_window", True))
    if isinstance(window, int) and window > 0 and slides and max_length > window:
        return window
    return None


def random_past(layout: CacheLayout, batch: int, past: int, dtype=torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """Random past tensors (key, value per layer) of ``past`` tokens for ``batch`` rows."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(layout.past_shape(kind, batch, past), generator=gen, dtype=dtype)
            for _ in range(layout.layers) for kind in ("key", "value")]


def _dry_run(model: nn.Module, layout: CacheLayout) -> None:
    """Run one token on a 2-token cache: the returned cache must hold 3 tokens per layer in the same layout."""
    wrapper = CachedDecoder(model, layout)
    feeds = step_inputs(layout, batch=1, past=2, new=1, seed=0)
    try:
        with torch.inference_mode():
            outs = wrapper(*feeds)
    except Exception as e:  # noqa: BLE001 - any failure means the layout is not the one assumed
        raise UsageError(f"{layout.architecture} does not take back the key/value cache it returns "
                         f"({_shapes(layout, 'past')} per layer): {one_line(e, 160, typed=True)}",
                         NO_CACHE_HINT) from None
    want = [layout.past_shape(kind, 1, 3) for _ in range(layout.layers) for kind in ("key", "value")]
    got = [tuple(t.shape) for t in outs[1:]]
    if got != want:
        raise UsageError(f"{layout.architecture} returns a cache of another layout on a 2-token cache "
                         f"({sorted(set(got))[:2]}; expected {_shapes(layout, 3)} per layer)", NO_CACHE_HINT)


def _shapes(layout: CacheLayout, tokens) -> str:
    """The key and value shapes per layer, in words: "keys and values [batch, 2, past, 64]"."""
    key = f"[batch, {layout.kv_heads}, {tokens}, {layout.head_dim}]"
    value = f"[batch, {layout.kv_heads}, {tokens}, {layout.value_head_dim}]"
    return f"keys and values {key}" if key == value else f"keys {key}, values {value}"


def step_inputs(layout: CacheLayout, *, batch: int, past: int, new: int, seed: int = 0) -> list[torch.Tensor]:
    """The wrapper's inputs for one step (all rows unpadded), in :attr:`CacheLayout.input_names` order."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, max(layout.vocab, 1), (batch, new), generator=gen)
    mask = torch.ones(batch, past + new, dtype=torch.long)
    pos = [torch.arange(past, past + new).expand(batch, new).contiguous()] if layout.position_ids else []
    return [ids, mask, *pos, *random_past(layout, batch, past, seed=seed)]


class CachedDecoder(nn.Module):
    """forward(input_ids, attention_mask, [position_ids,] *past) -> (logits, *presents): the flat-tensor face
    of a transformers causal LM with a DynamicCache."""

    def __init__(self, model: nn.Module, layout: CacheLayout) -> None:
        super().__init__()
        self.model = model
        self.layout = layout

    def forward(self, input_ids, attention_mask, *rest):
        from transformers import DynamicCache

        position_ids = rest[0] if self.layout.position_ids else None
        past = rest[1:] if self.layout.position_ids else rest
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layout.layers)])
        extra = {"position_ids": position_ids} if self.layout.position_ids else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                         use_cache=True, return_dict=True, **extra)
        presents: list[torch.Tensor] = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)
