"""Inputs of the three files: the encoder's (tokens or features with right padding, fixed-size features or
pixels), the first decoder step's and a step on a random cache, in the order of
:class:`~onnxport.seq2seq.records.Seq2SeqLayout`'s names."""

from __future__ import annotations

import torch

from onnxport.seq2seq.records import Seq2SeqLayout


def source_mask(lengths: list[int] | tuple[int, ...], source: int) -> torch.Tensor:
    """[batch, source] int64: 1 for each row's first ``lengths[r]`` tokens, 0 for its right padding."""
    return torch.tensor([[1] * n + [0] * (source - n) for n in lengths], dtype=torch.long)


def padded_lengths(batch: int, source: int) -> list[int]:
    """Row lengths of a padded batch: the first row full, the others shorter (at least 1)."""
    return [source] + [max(1, source - 2 * r - 1) for r in range(1, batch)]


def encoder_inputs(layout: Seq2SeqLayout, batch: int, source: int, *, padded: bool = False, seed: int = 0
                   ) -> list[torch.Tensor]:
    """The encoder's inputs in :attr:`Seq2SeqLayout.encoder_inputs` order: ``batch`` rows of ``source`` random
    tokens, or of random features or pixels (a fixed-size input: its size); a dynamic source's rows after the
    first shorter and right-padded when ``padded`` (zeros, as tokenizers and feature extractors pad), with their
    mask; LED's global attention on each row's first token."""
    gen = torch.Generator().manual_seed(seed + 11)
    source = source if layout.dynamic else 0
    shape = layout.source_shape(batch, source)
    if layout.source_input == "input_ids":
        main = torch.randint(2, max(layout.vocab, 3), shape, generator=gen)
    else:
        main = torch.randn(shape, generator=gen) * 0.5
    if not layout.dynamic:
        return [main]
    mask = source_mask(padded_lengths(batch, source) if padded else [source] * batch, source)
    spread = [batch] + [source if d == "source" else 1 for d in layout.source_dims]
    out = [main * mask.view(spread).to(main.dtype)] + ([mask] if layout.source_mask else [])
    if layout.global_attention:
        marks = torch.zeros(batch, source, dtype=torch.long)
        marks[:, 0] = 1
        out.append(marks)
    return out


def decoder_ids(layout: Seq2SeqLayout, batch: int, new: int, seed: int = 0) -> torch.Tensor:
    """Decoder tokens: the start token first, then random ones."""
    gen = torch.Generator().manual_seed(seed + 13)
    ids = torch.randint(0, max(layout.vocab, 1), (batch, new), generator=gen)
    ids[:, 0] = layout.start_token
    return ids


def first_inputs(layout: Seq2SeqLayout, ids: torch.Tensor, states: torch.Tensor,
                 mask: torch.Tensor | None) -> list[torch.Tensor]:
    """``decoder_model``'s inputs in :attr:`Seq2SeqLayout.decoder_inputs` order."""
    return [ids, states] + ([mask] if layout.encoder_mask else [])


def random_cache(layout: Seq2SeqLayout, batch: int, past: int, source: int, seed: int = 0) -> list[torch.Tensor]:
    """A random cache: per layer decoder key, value ([batch, heads, past, head_dim]) and encoder key, value
    ([batch, heads, source, head_dim])."""
    gen = torch.Generator().manual_seed(seed + 17)
    out: list[torch.Tensor] = []
    for _ in range(layout.layers):
        out += [torch.randn(layout.past_shape(batch, past), generator=gen) for _ in range(2)]
        out += [torch.randn(layout.past_shape(batch, source), generator=gen) for _ in range(2)]
    return out


def with_past_inputs(layout: Seq2SeqLayout, ids: torch.Tensor, mask: torch.Tensor | None,
                     cache: list[torch.Tensor]) -> list[torch.Tensor]:
    """``decoder_with_past_model``'s inputs in :attr:`Seq2SeqLayout.with_past_inputs` order."""
    return [ids] + ([mask] if layout.encoder_mask else []) + list(cache)
