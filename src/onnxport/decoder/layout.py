"""Which models have a KV cache onnxport can export, its layout, and the wrapper module that turns flat past
tensors into the transformers cache object and the returned cache back into flat presents."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
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


def cache_layout(model: nn.Module, max_length: int) -> CacheLayout:
    """The cache layout of ``model`` (a transformers causal LM) for up to ``max_length`` tokens; a model whose
    cache is not the standard per-layer key/value pair, or a ``max_length`` it cannot take, is a UsageError."""
    arch = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or not arch.endswith(CAUSAL_SUFFIXES):
        raise UsageError(f"{arch} is not a causal language model: no KV cache to export",
                         "export it without a cache (leave out --task text-generation)")
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = _config_int(text, arch, "num_attention_heads")
    layers = _config_int(text, arch, "num_hidden_layers")
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or _config_int(text, arch, "hidden_size") // heads)
    _check_length(text, arch, max_length)
    params = inspect.signature(model.forward).parameters
    if "past_key_values" not in params:
        raise UsageError(f"{arch}.forward() takes no past_key_values: its cache layout is unknown",
                         "export it without a cache (leave out --task text-generation)")
    layout = CacheLayout(arch, str(getattr(text, "model_type", "")), layers, heads, kv_heads, head_dim,
                         int(getattr(text, "vocab_size", 0) or 0), "position_ids" in params, max_length)
    _dry_run(model, layout)
    return layout


def _config_int(config, arch: str, name: str) -> int:
    value = getattr(config, name, None)
    if not isinstance(value, int) or value <= 0:
        raise UsageError(f"the config of {arch} has no '{name}': its cache layout is unknown",
                         f"set '{name}' in config.json, or export without a cache")
    return value


def _check_length(config, arch: str, max_length: int) -> None:
    if max_length < 2:
        raise UsageError(f"--max-length {max_length} is too short for a cache", "give at least 2 tokens")
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and max_length > limit:
        raise UsageError(f"--max-length {max_length} exceeds the {limit} positions {arch} was built for",
                         f"give --max-length {limit} or less")
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - KNOWN_LAYER_TYPES:
        raise UsageError(f"{arch} has layers of kind {', '.join(sorted(kinds - KNOWN_LAYER_TYPES))}: its cache "
                         "is not a plain key/value cache", "export it without a cache")
    window = getattr(config, "sliding_window", None)
    slides = "sliding_attention" in kinds or (not kinds and getattr(config, "use_sliding_window", True))
    if isinstance(window, int) and window > 0 and slides and max_length > window:
        raise UsageError(f"--max-length {max_length} exceeds the sliding window ({window}) of {arch}; the "
                         "exported cache keeps every token", f"give --max-length {window} or less")


def random_past(layout: CacheLayout, batch: int, past: int, dtype=torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """Random past tensors (key, value per layer) of ``past`` tokens for ``batch`` rows."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, layout.kv_heads, past, layout.head_dim)
    return [torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2 * layout.layers)]


def _dry_run(model: nn.Module, layout: CacheLayout) -> None:
    """Run one token on a 2-token cache: the returned cache must hold 3 tokens per layer in the same layout."""
    wrapper = CachedDecoder(model, layout)
    feeds = step_inputs(layout, batch=1, past=2, new=1, seed=0)
    try:
        with torch.inference_mode():
            outs = wrapper(*feeds)
    except Exception as e:  # noqa: BLE001 - any failure means the layout is not the one assumed
        raise UsageError(f"{layout.architecture} does not take a standard key/value cache "
                         f"([batch, {layout.kv_heads}, past, {layout.head_dim}] per layer): "
                         f"{one_line(e, 160, typed=True)}",
                         "export it without a cache (leave out --task text-generation)") from None
    want = (1, layout.kv_heads, 3, layout.head_dim)
    shapes = {tuple(t.shape) for t in outs[1:]}
    if len(outs) != 1 + 2 * layout.layers or shapes != {want}:
        raise UsageError(f"{layout.architecture} returns a cache of another layout ({sorted(shapes)[:2]}, "
                         f"expected {want} per key and value)", "export it without a cache")


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
