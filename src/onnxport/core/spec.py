"""Input specifications: ``NAME:DTYPE[d0,d1,...]{LO..HI}`` and ``SYMBOL=MIN..MAX``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from onnxport.core.errors import UsageError

_DTYPE_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32", "half": "float16", "fp16": "float16",
    "double": "float64", "long": "int64", "int": "int64", "i64": "int64", "i32": "int32",
    "bfloat16": "bfloat16", "bool_": "bool",
}
_SUPPORTED = {"float32", "float16", "float64", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}

_INPUT_RE = re.compile(
    r"^\s*(?P<name>[^:\s\[\]{}]+)\s*:\s*(?P<dtype>[A-Za-z0-9_]+)\s*\[(?P<dims>[^\]]*)\]\s*"
    r"(?:\{\s*(?P<lo>-?\d+)\s*\.\.\s*(?P<hi>-?\d+|[A-Za-z_][A-Za-z0-9_]*)\s*\})?\s*$"
)
_DIM_RE = re.compile(r"^\s*(?P<sym>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<lo>\d+)\s*\.\.\s*(?P<hi>\d+)\s*$")
_SIZES_RE = re.compile(r"^\s*(?P<sym>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<sizes>\d+(?:\s*,\s*\d+)+)\s*$")
_SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class InputSpec:
    """One model input: ONNX name, dtype, shape (ints or symbols) and optional value range, whose upper end
    may be a dim's symbol (``lengths:int64[batch]{1..seq}``: each value at most the size of seq)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    value_range: tuple[int, int | str] | None = None

    @property
    def symbols(self) -> list[str]:
        return [d for d in self.shape if isinstance(d, str)]

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        rng = f"{{{self.value_range[0]}..{self.value_range[1]}}}" if self.value_range else ""
        return f"{self.name}:{self.dtype}[{dims}]{rng}"


@dataclass(frozen=True)
class Dim:
    """A dynamic dimension: symbol, inclusive range and the size used for export; ``sizes`` lists the only
    sizes it takes when the model accepts some sizes of the range only (``n=4,9,16,64``)."""

    symbol: str
    min: int
    max: int
    example: int | None = field(default=None)
    sizes: tuple[int, ...] | None = None
    rule: str | None = None  # what ``sizes`` follow, when found by probing the model: "multiples of 32"

    def __str__(self) -> str:
        if self.sizes:
            return f"{self.symbol}={','.join(map(str, self.sizes))}"
        return f"{self.symbol}={self.min}..{self.max}"

    def allows(self, n: int) -> bool:
        return self.min <= n <= self.max and (self.sizes is None or n in self.sizes)

    def snap(self, n: int) -> int:
        """The allowed size nearest ``n`` (ties to the larger)."""
        if self.sizes is None:
            return min(max(n, self.min), self.max)
        return min(self.sizes, key=lambda s: (abs(s - n), -s))


def normalize_dtype(text: str) -> str:
    """Return the canonical numpy-style dtype name, or raise UsageError."""
    name = text.strip().lower()
    name = name.removeprefix("torch.").removeprefix("np.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _SUPPORTED:
        raise UsageError(
            f"unknown dtype '{text}'",
            f"use one of: {', '.join(sorted(_SUPPORTED))}",
        )
    return name


def parse_input(text: str) -> InputSpec:
    """Parse ``NAME:DTYPE[d0,d1,...]`` with an optional ``{LO..HI}`` integer value range (HI a number or a
    dim's symbol)."""
    m = _INPUT_RE.match(text)
    if not m:
        raise UsageError(
            f"malformed --input '{text}'",
            "write NAME:DTYPE[d0,d1,...], e.g. 'input_ids:int64[batch,seq]{0..29999}' or 'image:float32[batch,3,224,224]'",
        )
    dtype = normalize_dtype(m["dtype"])
    dims: list[int | str] = []
    raw = m["dims"].strip()
    for part in ([p.strip() for p in raw.split(",")] if raw else []):
        if part.isascii() and part.isdigit():
            dims.append(int(part))
        elif _SYMBOL_RE.match(part):
            dims.append(part)
        else:
            raise UsageError(
                f"malformed dimension '{part}' in --input '{text}'",
                "a dimension is a whole number (e.g. 3) or a symbol (e.g. batch)",
            )
    rng = None
    if m["lo"] is not None:
        lo, hi = int(m["lo"]), (m["hi"] if _SYMBOL_RE.match(m["hi"]) else int(m["hi"]))
        if isinstance(hi, int) and lo > hi:
            raise UsageError(f"empty value range {{{lo}..{hi}}} in --input '{text}'", "write {LO..HI} with LO <= HI")
        if not (dtype.startswith("int") or dtype.startswith("uint")):
            raise UsageError(f"a value range is only allowed for integer inputs, not {dtype} ('{text}')",
                             "drop the {LO..HI} part or use an integer dtype")
        info = np.iinfo(np.dtype(dtype))
        if lo < info.min or (hi if isinstance(hi, int) else lo) > info.max:
            raise UsageError(f"value range {{{lo}..{hi}}} does not fit {dtype} ({info.min}..{info.max}) in '{text}'",
                             "narrow the range or use a wider integer dtype")
        rng = (lo, hi)
    return InputSpec(m["name"], dtype, tuple(dims), rng)


def parse_dim(text: str) -> Dim:
    """Parse ``SYMBOL=MIN..MAX``, or ``SYMBOL=A,B,C`` for a dim that takes those sizes only."""
    listed = _SIZES_RE.match(text)
    if listed:
        sizes = tuple(sorted({int(x) for x in listed["sizes"].split(",")}))
        if sizes[0] < 1:
            raise UsageError(f"--dim '{text}' allows size {sizes[0]}", "dimensions start at 1")
        return Dim(listed["sym"], sizes[0], sizes[-1], sizes=sizes)
    m = _DIM_RE.match(text)
    if not m:
        raise UsageError(f"malformed --dim '{text}'",
                         "write SYMBOL=MIN..MAX, e.g. 'seq=1..512' (or the sizes it takes, e.g. 'n=4,9,16')")
    lo, hi = int(m["lo"]), int(m["hi"])
    if lo > hi:
        raise UsageError(f"empty range in --dim '{text}'", "write SYMBOL=MIN..MAX with MIN <= MAX")
    if lo < 1:
        raise UsageError(f"--dim '{text}' allows size {lo}", "dimensions start at 1: write e.g. 'seq=1..512'")
    return Dim(m["sym"], lo, hi)


def merge_dims(specs: list[InputSpec], declared: list[Dim], defaults: dict[str, Dim] | None = None) -> dict[str, Dim]:
    """Resolve every symbol used by ``specs`` to a Dim (declared > source default > generic default).

    Each Dim gets an export size that is never 0 or 1 and differs from the other dims' sizes, so that
    the exporter cannot specialize or merge them.
    """
    defaults = defaults or {}
    declared_by_sym = {}
    for d in declared:
        if d.symbol in declared_by_sym:
            raise UsageError(f"--dim {d.symbol} given twice", "declare each dimension once")
        declared_by_sym[d.symbol] = d
    used: list[str] = []
    for s in specs:
        for sym in s.symbols:
            if sym not in used:
                used.append(sym)
    for s in specs:
        hi = s.value_range[1] if s.value_range else None
        if isinstance(hi, str) and hi not in used:
            raise UsageError(f"the value range of '{s}' names {hi}, which no input uses as a dim",
                             f"bound the values by a dim of an input (one of: {', '.join(used) or 'none'}) or a number")
    unknown = sorted(set(declared_by_sym) - set(used))
    if unknown:
        raise UsageError(
            f"--dim names {', '.join(unknown)}, which no input uses",
            f"the inputs use: {', '.join(used) or 'no symbolic dims'}; name the dims in --input, e.g. 'x:float32[batch,16]'",
        )
    bases: dict[str, Dim] = {}
    for sym in used:
        fallback = defaults.get(sym) or _generic_default(sym)
        base = declared_by_sym.get(sym) or fallback
        bases[sym] = base if base.example is not None else replace(base, example=fallback.example)
    sized: dict[str, Dim] = {}
    taken: set[int] = set()
    for sym in sorted(used, key=lambda s: bases[s].max - bases[s].min):  # narrowest range chooses first
        sized[sym] = replace(bases[sym], example=_export_size(bases[sym], taken))
        taken.add(sized[sym].example)
    for s in specs:
        lo, hi = s.value_range or (0, 0)
        if isinstance(hi, str) and lo > sized[hi].min:
            raise UsageError(f"the value range of '{s}' is empty when {hi}={sized[hi].min}",
                             f"start the range at most at {sized[hi].min}, or raise the minimum of {hi} with --dim")
    return {sym: sized[sym] for sym in used}


def _generic_default(sym: str) -> Dim:
    low = sym.lower()
    if "batch" in low or low in ("n", "b", "bs"):
        return Dim(sym, 1, 64, 2)
    if any(k in low for k in ("seq", "len", "token", "time", "step")):
        return Dim(sym, 1, 512, 16)
    if low in ("h", "w", "height", "width"):
        return Dim(sym, 32, 512, 224)
    return Dim(sym, 1, 64, 8)


def _export_size(dim: Dim, taken: set[int]) -> int:
    """A size in range, >= 2 when possible, not used by another dim."""
    want = dim.example if dim.example is not None else min(max(dim.min, 2), dim.max)
    want = min(max(want, dim.min, 2), dim.max) if dim.max >= 2 else dim.max
    for delta in range(0, dim.max - dim.min + 1):
        for cand in (want + delta, want - delta):
            if dim.allows(cand) and cand >= 2 and cand not in taken:
                return cand
    return dim.snap(want)


def spec_from_array(name: str, array: np.ndarray, symbols: dict[int, str] | None = None) -> InputSpec:
    """Build an InputSpec from a concrete array, marking the axes in ``symbols`` dynamic."""
    symbols = symbols or {}
    shape = tuple(symbols.get(i, int(n)) for i, n in enumerate(array.shape))
    return InputSpec(name, normalize_dtype(str(array.dtype)), shape)
