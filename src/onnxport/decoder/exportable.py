"""What a transformers causal LM is switched to for its export with the cache, each switch recorded and undone
after the export, so the proof compares the file with the model as it was given:

- a checkpoint saved in bfloat16 / float16 is upcast to float32 (exact) and exported and proven in float32;
- mixture-of-experts layers run transformers' ``batched_mm`` experts (``grouped_mm`` has no ONNX translation);
- a dynamic-NTK rope, which recomputes its frequencies only past the positions it was trained for, keeps its
  original frequencies when ``max_length`` stays within them (its update is a data-dependent branch);
- multi-query attention that hands SDPA one key/value head to broadcast over the query heads (Falcon) gets the
  head expanded (the same numbers; the exporter's SDPA translation takes equal head counts or ``enable_gqa``);
- Falcon's ALiBi multiplies in bfloat16 whatever the model's dtype, and onnxruntime has no bfloat16 ``Mul`` on
  the CPU: the product is taken in float32 of the bfloat16-rounded factors and rounded to bfloat16 (the same
  bits: the product of two bfloat16 numbers is exact in float32)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from onnxport.core.errors import UsageError

HALF = (torch.float16, torch.bfloat16)
EXPERTS = "batched_mm"  # dense per-token expert matmuls: exportable, and fused by onnxruntime's MoE where it can


def upcast(model: nn.Module) -> str | None:
    """Upcast a half-precision model (bfloat16 / float16 weights) to float32 in place; returns the dtype it had
    (None: already float32 or wider, left as it is)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    half = sorted(str(d).removeprefix("torch.") for d in dtypes if d in HALF)
    if not half:
        return None
    model.float()
    return "/".join(half)


def _experts(model: nn.Module) -> dict | None:
    """The model's own experts implementation when it has MoE layers that do not run ``batched_mm`` already."""
    can = getattr(model, "_can_set_experts_implementation", None)
    if not callable(can) or not can() or not hasattr(model, "get_experts_implementation"):
        return None
    own = model.get_experts_implementation()
    return own if any(v != EXPERTS for v in own.values()) else None


def _dynamic_ropes(model: nn.Module) -> list[nn.Module]:
    """The rotary embedding modules whose rope type recomputes frequencies from the positions seen."""
    def dynamic(kind) -> bool:
        kinds = kind.values() if isinstance(kind, dict) else [kind]
        return any(isinstance(k, str) and "dynamic" in k for k in kinds)

    return [m for m in model.modules() if dynamic(getattr(m, "rope_type", None))]


def _static_rope_type(kind):
    if isinstance(kind, dict):
        return {k: _static_rope_type(v) for k, v in kind.items()}
    return "default" if isinstance(kind, str) and "dynamic" in kind else kind


@contextmanager
def _broadcast_heads(fired: list[int]) -> Iterator[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` with a single key/value head expanded to the query's
    heads (what broadcasting does in eager mode); each expansion appends the query's head count to ``fired``."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def sdpa(query, key, value, *args, **kwargs):
        heads = query.shape[-3] if query.dim() == 4 else 1
        if not kwargs.get("enable_gqa") and key.dim() == 4 and key.shape[-3] == 1 != heads:
            fired.append(heads)
            key, value = key.expand(-1, heads, -1, -1), value.expand(-1, heads, -1, -1)
        return original(query, key, value, *args, **kwargs)

    functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def _falcon_alibi(attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """transformers' Falcon ``build_alibi_tensor`` with its bfloat16 multiply done as Casts around a float32 one."""
    batch_size, seq_length = attention_mask.shape
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), device=attention_mask.device, dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, device=attention_mask.device, dtype=torch.int32))
    if closest != num_heads:
        extra_base = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), device=attention_mask.device,
                                dtype=torch.float32)
        remaining = min(closest, num_heads - closest)
        extra = torch.arange(1, 1 + 2 * remaining, 2, device=attention_mask.device, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra)], dim=0)
    positions = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    half = torch.bfloat16
    alibi = (slopes[..., None].to(half).float() * positions.to(half).float()).to(half)
    return alibi.reshape(batch_size * num_heads, 1, seq_length).to(dtype)


REWRITES = {("transformers.models.falcon.modeling_falcon", "build_alibi_tensor"): _falcon_alibi}


@contextmanager
def _rewritten(model: nn.Module, done: list[str]) -> Iterator[None]:
    """The module-level functions of ``REWRITES`` the model's own module calls, replaced inside the block."""
    import sys

    saved = []
    for (name, attr), replacement in REWRITES.items():
        module = sys.modules.get(name)
        if module is not None and type(model).__module__ == name and hasattr(module, attr):
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, replacement)
            done.append(f"{name.rsplit('.', 1)[-1]}.{attr}")
    try:
        yield
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


@contextmanager
def exportable(model: nn.Module, max_length: int) -> Iterator[tuple[str | None, tuple[str, ...]]]:
    """Inside the block ``model`` runs what the dynamo exporter can translate; yields (the experts
    implementation used, or None; the list of notes on what else was set, complete when the block ends). A
    dynamic rope ``max_length`` would make grow is a UsageError."""
    notes: list[str] = []
    own_experts = _experts(model)
    ropes = _dynamic_ropes(model)
    for rope in ropes:
        limit = min(int(getattr(rope, "original_max_seq_len", 0) or 0), int(getattr(rope, "max_seq_len_cached", 0) or 0))
        if max_length > limit:
            raise UsageError(f"the dynamic rope of {type(model).__name__} recomputes its frequencies past {limit} "
                             f"positions, a data-dependent update one exported graph cannot hold (--max-length "
                             f"{max_length})", f"give --max-length {limit} or less")
    saved = [(rope, rope.rope_type) for rope in ropes]
    if ropes:
        notes.append(f"dynamic rope: its update cannot fire within --max-length {max_length} (it recomputes "
                     "frequencies only past the original positions), so the original frequencies are exported")
    fired: list[int] = []
    try:
        if own_experts is not None:
            model.set_experts_implementation(EXPERTS)
        for rope, kind in saved:
            rope.rope_type = _static_rope_type(kind)
        rewritten: list[str] = []
        with _broadcast_heads(fired), _rewritten(model, rewritten):
            yield (EXPERTS if own_experts is not None else None), notes
        notes += [f"{name}: its bfloat16 multiply exported as float32 between Casts (the same bits; onnxruntime "
                  "has no bfloat16 Mul on the CPU)" for name in rewritten]
        if fired:
            notes.append(f"multi-query attention: its one key/value head was expanded to the {max(fired)} query "
                         "heads inside the graph (the cache keeps one head)")
    finally:
        for rope, kind in saved:
            rope.rope_type = kind
        if own_experts is not None:
            model.set_experts_implementation(own_experts)
