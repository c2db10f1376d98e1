"""Example inputs for export and the test-case matrix for parity (docs/architecture.md, "Policies")."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from onnxport.core.spec import Dim, InputSpec

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "float64": torch.float64, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}


@dataclass(frozen=True)
class Case:
    """One validation case: a size for every dynamic dim and a value profile."""

    label: str
    sizes: dict[str, int]
    values: str = "random"  # "random" | "edge" | "scaled:FACTOR" (floats times FACTOR)
    seed: int = 0


def shape_of(spec: InputSpec, sizes: dict[str, int]) -> list[int]:
    return [sizes[d] if isinstance(d, str) else d for d in spec.shape]


def shapes_for(specs: tuple[InputSpec, ...], sizes: dict[str, int]) -> dict[str, list[int]]:
    return {s.name: shape_of(s, sizes) for s in specs}


def export_sizes(dims: dict[str, Dim]) -> dict[str, int]:
    return {sym: d.example if d.example is not None else d.min for sym, d in dims.items()}


def make_inputs(specs: tuple[InputSpec, ...], sizes: dict[str, int], values: str = "random",
                seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Tensors for ``specs`` at ``sizes``. Integer values stay inside each input's value range."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        shape = shape_of(s, sizes)
        dtype = TORCH_DTYPES[s.dtype]
        if s.dtype == "bool" or (dtype in (torch.int64, torch.int32) and "mask" in s.name.lower()
                                 and (s.value_range or (0, 1)) == (0, 1)):
            t = _mask(shape, values, g).to(dtype)
        elif not dtype.is_floating_point:
            lo, hi = s.value_range or (0, 9)
            hi = sizes[hi] if isinstance(hi, str) else hi  # {1..seq}: at most the size of seq in this case
            t = torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64)
            if values == "edge" and t.numel():
                t = _edge_ints(t, lo, hi)
            if s.name == "bbox" and len(shape) and shape[-1] == 4:  # boxes: x0 <= x1, y0 <= y1 (LayoutLM)
                t = torch.cat([torch.minimum(t[..., :2], t[..., 2:]), torch.maximum(t[..., :2], t[..., 2:])], -1)
            t = t.to(dtype)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float32)
            if values.startswith("scaled:"):  # e.g. "scaled:-10": to reach the other side of a value test
                t = t * float(values.split(":", 1)[1])
            if values == "edge" and t.dim() and t.shape[0] > 0:
                t = t * 3.0
                t[0] = 0.0
            t = t.to(dtype)
        out.append(t)
    return tuple(out)


def _mask(shape: list[int], values: str, g: torch.Generator) -> torch.Tensor:
    """Attention-style masks (1: attend): every row keeps at least one valid token, as every real input does.

    'random': every other row padded at the end (right padding) at a random length. 'edge': the first row full,
    the last row left-padded down to its final token (how batched generation pads), the rows between
    alternately right-padded down to their first token and left-padded to half their length. A row that
    attends to nothing is never made: PyTorch and onnxruntime legitimately differ on it (softmax over no
    position), and no real input has it."""
    t = torch.ones(shape, dtype=torch.int64)
    if len(shape) < 2 or not t.numel():
        return t
    n, length = shape[0], shape[-1]
    for row in range(n):
        if values == "edge":
            if row == 0:
                continue
            if row == n - 1 or row % 2 == 0:  # left padding: the valid tokens at the end
                t[row, ..., : length - (1 if row == n - 1 else max(1, length // 2))] = 0
            else:  # right padding: the first token alone
                t[row, ..., 1:] = 0
        elif row % 2:  # every other row padded at a random length
            keep = int(torch.randint(1, length + 1, (1,), generator=g))
            t[row, ..., keep:] = 0
    return t


def _edge_ints(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Repeated tokens at the top of the range in the first row, alternating lo/hi in the last."""
    t = t.clone()
    if t.dim() == 0:
        return torch.full_like(t, hi)
    t[0] = hi
    if t.shape[0] > 1:
        flat = t[-1].reshape(-1)
        flat[0::2] = lo
        flat[1::2] = hi
    return t


SWEEP_MAX = 16  # a dim with at most this many sizes is proven at every one of them (the others at min/max/odd/export)


def sweep_cases(dims: dict[str, Dim], cases: list[Case], limit: int = SWEEP_MAX) -> list[Case]:
    """For each dim with at most ``limit`` allowed sizes, a case at each size no case of ``cases`` has (the other
    dims at their minimum, so each costs little): a model wrong at batch 7 alone is caught where batch is 1..16.
    A longer range is proven at its min, max, odd and export sizes (and each max alone)."""
    out: list[Case] = []
    for s, dim in dims.items():
        allowed = sorted(dim.sizes) if dim.sizes is not None else range(dim.min, dim.max + 1)
        if len(allowed) > limit:
            continue
        covered = {c.sizes.get(s) for c in cases + out}
        base = {o: dims[o].min for o in dims}
        for n in allowed:
            if n not in covered:
                out.append(Case(f"{s}={n}", {**base, s: n}, "random", 100 + len(cases) + len(out)))
    return out


def validation_cases(dims: dict[str, Dim], max_cases: int = 8) -> list[Case]:
    """The parity matrix: export size, all-min, all-max, small odd sizes, mixed extremes, edge values."""
    syms = list(dims)
    export = export_sizes(dims)
    cases: list[Case] = [Case("export", export, "random", 1)]
    if not syms:
        cases.append(Case("edge values", export, "edge", 2))
        cases.append(Case("random values", export, "random", 3))
        return cases
    cases.append(Case("min", {s: dims[s].min for s in syms}, "random", 2))
    cases.append(Case("max", {s: dims[s].max for s in syms}, "random", 3))
    cases.append(Case("odd", _odd_sizes(dims), "random", 4))
    cases.append(Case("edge values", export, "edge", 5))
    if len(syms) > 1:
        for s in syms:
            mixed = {o: (dims[o].max if o == s else dims[o].min) for o in syms}
            cases.append(Case(f"max {s} only", mixed, "random", 6 + len(cases)))
    unique: list[Case] = []
    seen: set[tuple] = set()
    cases = [Case(c.label, {k: dims[k].snap(v) for k, v in c.sizes.items()}, c.values, c.seed) for c in cases]
    for c in cases:
        key = (tuple(sorted(c.sizes.items())), c.values)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique[:max_cases]


def _odd_sizes(dims: dict[str, Dim]) -> dict[str, int]:
    """Odd sizes near the geometric middle of each range, distinct across dims."""
    taken: set[int] = set()
    out = {}
    for sym, d in dims.items():
        want = int(round(math.sqrt(max(d.min, 1) * d.max)))
        want |= 1
        cand = want
        for delta in range(0, d.max - d.min + 2):
            for c in (want + 2 * delta, want - 2 * delta):
                if d.min <= c <= d.max and c not in taken:
                    cand = c
                    break
            else:
                continue
            break
        cand = min(max(cand, d.min), d.max)
        taken.add(cand)
        out[sym] = cand
    return out
