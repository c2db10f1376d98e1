"""Library code the dynamo exporter cannot trace in an encoder-decoder, replaced for the export only by code
that computes the same numbers (docs/seq2seq.md, "Long inputs"). Each patch names the class whose presence in
the model makes it apply; the patches applied are recorded in ``report.json`` (``seq2seq.export.patches``).

Longformer-style sliding-window attention with global tokens (LED's encoder) decides on the data whether any
token is global (``.any().item()``), divides sizes with ``torch.div`` into tensors and pads the source to a
multiple of the attention window: each is a guard on the data under ``torch.export``. Its export computes the
same attention as a masked dense attention: every token sees the tokens within half a window of it (padding
and global tokens left out) and every global token; a global token sees every token through its global
projections. Padding the source to the window changes nothing then, and is left out."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Patch:
    """``cls.attr`` of module ``module`` replaced by ``make(original)`` while exporting a model holding a
    ``target`` (``module:Class``) instance."""

    name: str
    fixes: str
    module: str
    cls: str
    attr: str
    make: Callable[[Callable], Callable]

    def targets(self, model: nn.Module) -> bool:
        found = getattr(sys.modules.get(self.module), self.cls, None)
        return isinstance(found, type) and any(isinstance(m, found) for m in model.modules())


def _window_attention(original: Callable) -> Callable:
    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None, output_attentions=False):
        if output_attentions:  # attention probabilities are laid out per window: the library's own code
            return original(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                            is_global_attn, output_attentions)
        return (dense_window_attention(self, hidden_states, is_index_masked, is_index_global_attn),)

    forward.__wrapped__ = original
    return forward


def dense_window_attention(attn: nn.Module, hidden: torch.Tensor, masked: torch.Tensor,
                           is_global: torch.Tensor) -> torch.Tensor:
    """Longformer self-attention as a masked dense attention: ``hidden`` [batch, seq, embed], ``masked`` and
    ``is_global`` [batch, seq] bool; returns [batch, seq, embed] (a padded token's output is 0, as the
    library's)."""
    batch, seq, _ = hidden.shape
    heads, width, half = attn.num_heads, attn.head_dim, attn.one_sided_attn_window_size

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, seq, heads, width).transpose(1, 2)

    low = torch.finfo(hidden.dtype).min
    pos = torch.arange(seq, device=hidden.device)
    near = (pos[:, None] - pos[None, :]).abs() <= half  # [seq, seq]
    local = ~masked & ~is_global  # keys seen inside the window
    sees = (near[None] & local[:, None, :]) | is_global[:, None, :]  # [batch, query, key]
    q, k, v = split(attn.query(hidden) / math.sqrt(width)), split(attn.key(hidden)), split(attn.value(hidden))
    scores = (q @ k.transpose(-1, -2)).masked_fill(~sees[:, None], low)
    out = torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(scores) @ v
    out = out.masked_fill(masked[:, None, :, None], 0.0)
    gq = split(attn.query_global(hidden) / math.sqrt(width))
    gk, gv = split(attn.key_global(hidden)), split(attn.value_global(hidden))
    g_scores = (gq @ gk.transpose(-1, -2)).masked_fill(masked[:, None, None, :], low)
    g_out = torch.softmax(g_scores, dim=-1, dtype=torch.float32).type_as(g_scores) @ gv
    out = torch.where(is_global[:, None, :, None], g_out, out)
    return out.transpose(1, 2).reshape(batch, seq, heads * width)


def _unpadded(original: Callable) -> Callable:
    def pad(self, input_ids, attention_mask, inputs_embeds, pad_token_id):
        return 0, input_ids, attention_mask, inputs_embeds

    pad.__wrapped__ = original
    return pad


LED = "transformers.models.led.modeling_led"
PATCHES = (
    Patch("longformer-dense-attention", "sliding-window attention with global tokens computed as a masked dense "
          "attention (the windowed code guards on the data)", LED, "LEDEncoderSelfAttention", "forward",
          _window_attention),
    Patch("longformer-no-window-padding", "the source is not padded to the attention window (the dense attention "
          "takes any length)", LED, "LEDEncoder", "_pad_to_window_size", _unpadded),
)


@contextlib.contextmanager
def export_patches(model: nn.Module) -> Iterator[tuple[str, ...]]:
    """The patches whose class is in ``model`` applied; yields their names."""
    with contextlib.ExitStack() as stack:
        names = []
        for patch in PATCHES:
            if patch.targets(model):
                stack.enter_context(_replaced(patch))
                names.append(patch.name)
        yield tuple(names)


@contextlib.contextmanager
def _replaced(patch: Patch) -> Iterator[None]:
    owner = getattr(sys.modules[patch.module], patch.cls)
    original = owner.__dict__[patch.attr]
    setattr(owner, patch.attr, patch.make(original))
    try:
        yield
    finally:
        setattr(owner, patch.attr, original)
