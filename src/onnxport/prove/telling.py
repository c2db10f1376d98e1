"""Whether a comparison can tell a right file from a wrong one: PyTorch's own outputs must carry information.

A proof over references that do not depend on the input proves nothing: a classifier whose head starts at zero
returns 0 logits for every image (any file returning zeros matches), a detector with random weights finds nothing
(empty matches empty), a detector whose every score is tied returns its boxes in no defined order. Per output and
case, :func:`summary` records what PyTorch returned; :func:`cannot_tell` decides over the cases:

* ``constant``: the output holds one value, the same in every case;
* ``input-independent``: every two cases with the same output shape but other inputs give the same bytes;
* ``empty``: a detection output with no detection in the case;
* ``tied``: a detection score output whose every score is equal in the case (the order is undefined).

An output that cannot tell in any case is named; the file is judged on the others, and when no output can tell
the proof fails ("not proven: the comparison cannot tell a right file from a wrong one"). A case where no output
can tell proves no dim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnxport.core.samples import Case
from onnxport.prove.references import case_key, fingerprint

EMPTY, TIED = "no detection", "scores tied"  # why one case of a detection output cannot tell
HINT = ("use trained weights, or --samples with real inputs; --compare NAME=KIND for an output judged otherwise "
        "(e.g. its task metric)")


@dataclass(frozen=True)
class Seen:
    """What PyTorch returned for one output in one case."""

    digest: str  # shape, dtype and bytes
    shape: tuple[int, ...]
    constant: float | None  # the one value every element holds (None: several values, or none)
    silent: str | None  # why this case alone cannot tell (EMPTY or TIED), None: it can


def summary(name: str, ref: np.ndarray, kind: str) -> Seen:
    """What PyTorch returned for output ``name`` (judged by rule ``kind``) in one case."""
    arr = np.ascontiguousarray(ref)
    digest = fingerprint(arr)
    constant = None
    if arr.size and arr.dtype != object:
        flat = arr.reshape(-1)
        if bool((flat == flat[0]).all()):
            try:
                constant = float(flat[0])
            except (TypeError, ValueError):
                constant = None
    silent = None
    if kind == "detections":
        if arr.ndim >= 1 and arr.shape[0] == 0:
            silent = EMPTY
        elif name.endswith("scores") and arr.size > 1 and constant is not None:
            silent = TIED
    return Seen(digest, tuple(arr.shape), constant, silent)


def _grouped(s: Mapping[str, Seen] | None) -> Mapping[str, Seen] | None:
    """``s`` where a detection group's scores are tied: its boxes, labels, masks... cannot tell either (which
    boxes are kept, and in what order, is undefined when every score is the same)."""
    if not s:
        return s
    tied = [n[:-len("scores")] for n, x in s.items() if n.endswith("scores") and x.silent == TIED]
    if not tied:
        return s
    return {n: (dataclasses.replace(x, silent=TIED) if x.silent is None and any(n.startswith(p) for p in tied)
                else x) for n, x in s.items()}


def cannot_tell(cases: Sequence[Case], seen: Sequence[Mapping[str, Seen] | None]) -> dict[str, str]:
    """Per output that cannot tell a right file from a wrong one in any case, why (see the module docstring).
    ``seen[i]``: the summaries of case ``i`` (None where PyTorch failed)."""
    runs = [(c, _grouped(s)) for c, s in zip(cases, seen) if s]
    if not runs:
        return {}
    names = list(runs[0][1])
    out: dict[str, str] = {}
    for name in names:
        per = [(c, s[name]) for c, s in runs if name in s]
        if not per:
            continue
        if all(x.silent for _, x in per):
            kinds = sorted({x.silent for _, x in per})
            out[name] = f"{' or '.join(kinds)} in every case"
            continue
        values = {x.constant for _, x in per}
        if len(values) == 1 and None not in values:
            out[name] = f"{values.pop():g} in every element of every case"
            continue
        by_shape: dict[tuple, list[tuple[Case, Seen]]] = {}
        for c, x in per:
            if x.silent:  # empty or tied there: no evidence either way
                continue
            by_shape.setdefault(x.shape, []).append((c, x))
        groups = [g for g in by_shape.values() if len({case_key(c) for c, _ in g}) > 1]
        if groups and all(len({x.digest for _, x in g}) == 1 for g in groups):
            out[name] = "the same for every input (it does not depend on the input)"
    return out


def telling_cases(seen: Sequence[Mapping[str, Seen] | None], silent: Mapping[str, str]) -> list[bool]:
    """Per case, whether some output can tell there (not silent overall, nor empty or tied in that case)."""
    return [bool(s) and any(n not in silent and x.silent is None for n, x in _grouped(s).items()) for s in seen]
