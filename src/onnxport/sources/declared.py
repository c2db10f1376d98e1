"""A source loaded with the user's declared inputs and dims, and the dims it runs at some sizes of only kept to
those sizes (a ``constrained-dim`` warning naming the rule), unless the user wants that refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from onnxport.core.diagnostics import Diagnostic, warning
from onnxport.core.errors import ConstrainedDims
from onnxport.core.spec import Dim, InputSpec, parse_dim, parse_input
from onnxport.sources import load
from onnxport.sources.base import LoadedModel


def load_declared(source: str, *, inputs: Sequence[str | InputSpec] | None = None,
                  dims: Sequence[str | Dim] | None = None, model_args: dict | None = None,
                  weights: str | None = None, task: str | None = None, trust_remote_code: bool = False,
                  strict_dims: bool = False) -> LoadedModel:
    """``source`` loaded with the declared inputs and dims. A dim the model runs at some sizes of only (found by
    probing: multiples of k, perfect squares, …) is kept to the sizes that run, every such dim found, each named
    in a ``constrained-dim`` warning; ``strict_dims``: a ConstrainedDims error instead (exit 2)."""
    declared = {d.symbol: d for d in (d if isinstance(d, Dim) else parse_dim(d) for d in dims or [])}
    kw = dict(inputs=[i if isinstance(i, InputSpec) else parse_input(i) for i in inputs or []],
              model_args=model_args or {}, weights=weights, task=task, trust_remote_code=trust_remote_code)
    found: dict[str, tuple[tuple[int, ...], str | None]] = {}
    for tries in range(1, 6):  # each pass may find another constrained dim, once the first keeps to its sizes
        try:
            loaded = load(source, dims=list(declared.values()), **kw)
            break
        except ConstrainedDims as e:
            if strict_dims or tries == 5 or not set(e.sizes) - set(found):
                raise
            for sym, sizes in e.sizes.items():
                every = sizes == tuple(range(sizes[0], sizes[-1] + 1))  # a narrower range, not a list of sizes
                declared[sym] = Dim(sym, sizes[0], sizes[-1], sizes=None if every else sizes, rule=e.rules.get(sym))
                found[sym] = (sizes, e.rules.get(sym))
    if found:
        loaded = dataclasses.replace(loaded, diagnostics=(*loaded.diagnostics, *_constrained(found)))
    return loaded


def _constrained(found: dict[str, tuple[tuple[int, ...], str | None]]) -> list[Diagnostic]:
    """A ``constrained-dim`` warning per dim the model runs at some sizes of only."""
    out = []
    for sym, (sizes, rule) in found.items():
        shown = ", ".join(map(str, sizes[:6])) + (", …" if len(sizes) > 6 else "")
        what = f"{rule} ({sizes[0]}..{sizes[-1]})" if rule else f"these sizes: {shown}"
        out.append(warning("constrained-dim", f"the PyTorch model runs with {sym} at {what} only: proven at those "
                           "sizes", hint=f"feed the ONNX model {sym} at those sizes; --strict-dims makes this an "
                                         "error (exit 2)"))
    return out
