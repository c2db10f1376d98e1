"""PyTorch's references: the one place where PyTorch is run over inputs whose outputs ONNX files are judged by.

:func:`run_each` runs any torch callable over input tuples (inference mode, outputs as numpy, bf16 as float32),
recording per tuple the outputs or why PyTorch failed; :func:`run_over` keeps the outputs (None where it
raised). The plain path's :class:`Refs` of a case matrix (:func:`references`), the parity matrix
(prove/parity.py), the user's samples (prove/samples.py) and the decoder's step cases and greedy tokens
(decoder/variants.py) are all built with them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from onnxport.core.samples import Case, make_inputs
from onnxport.sources.base import LoadedModel


def as_numpy(x: Any) -> np.ndarray:
    """One output as numpy (bf16, which numpy lacks, as float32)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
    return np.asarray(x)


@dataclass(frozen=True)
class Ran:
    """PyTorch on one input tuple: its outputs, or why it failed (``error``: ``Type: message``)."""

    outputs: list[np.ndarray] | None
    error: str | None = None


def run_each(fn: Callable[..., Any], inputs: Sequence[tuple]) -> tuple[Ran, ...]:
    """``fn(*args)`` for every tuple of ``inputs`` in inference mode, outputs as numpy; an exception is recorded,
    never raised. A single tensor returned counts as one output."""
    out = []
    for args in inputs:
        try:
            with torch.inference_mode():
                got = fn(*args)
            seq = got if isinstance(got, (list, tuple)) else (got,)
            out.append(Ran([as_numpy(o) for o in seq]))
        except Exception as e:  # noqa: BLE001 - the caller reports PyTorch failing on these inputs
            text = " ".join(str(e).split())[:200]
            out.append(Ran(None, f"{type(e).__name__}: {text}" if text else type(e).__name__))
    return tuple(out)


def run_over(fn: Callable[..., Any], inputs: Sequence[tuple]) -> tuple[list[np.ndarray] | None, ...]:
    """PyTorch's outputs of ``fn`` on every tuple of ``inputs`` (None where it raises)."""
    return tuple(r.outputs for r in run_each(fn, inputs))


def torch_outputs(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """The loaded model's outputs on ``inputs`` (raises what PyTorch raises)."""
    with torch.inference_mode():
        outs = loaded.flat(*inputs)
    return [as_numpy(o) for o in outs]


@dataclass(frozen=True)
class Refs:
    """PyTorch outputs per case, computed once and shared by every variant (None: PyTorch failed there)."""

    cases: tuple[Case, ...]
    inputs: tuple[tuple, ...]
    outputs: tuple[list[np.ndarray] | None, ...]

    def pick(self, i: int) -> Refs:
        """The references of case ``i`` alone."""
        return Refs(self.cases[i:i + 1], self.inputs[i:i + 1], self.outputs[i:i + 1])


    def known(self) -> dict[tuple, tuple[tuple, list[np.ndarray]]]:
        """(inputs, outputs) by :func:`case_key` of every case PyTorch ran on."""
        return {case_key(c): (i, o) for c, i, o in zip(self.cases, self.inputs, self.outputs) if o is not None}


def fingerprint(array: np.ndarray) -> str:
    """A digest of an array's shape, dtype and bytes: equal arrays, equal fingerprints (TypeError for an object
    array, whose bytes are pointers)."""
    a = np.ascontiguousarray(array)
    if a.dtype == object:
        raise TypeError("an object array has no fingerprint")
    h = hashlib.blake2b(repr((a.shape, a.dtype.str)).encode(), digest_size=16)
    h.update(a.reshape(-1).view(np.uint8).data)  # no copy of the bytes
    return h.hexdigest()


def case_key(case: Case) -> tuple:
    """What makes a case's inputs: its sizes, value profile and seed (the label does not)."""
    return tuple(sorted(case.sizes.items())), case.values, case.seed


def references(loaded: LoadedModel, cases: Sequence[Case], known: Refs | None = None) -> Refs:
    """The inputs of ``cases`` and PyTorch's outputs on them (None for a case PyTorch fails on: parity reports it);
    ``known``: references already computed, reused for the cases they hold."""
    have = known.known() if known is not None else {}
    todo = [c for c in cases if case_key(c) not in have]
    ins = tuple(make_inputs(loaded.inputs, c.sizes, c.values, c.seed) for c in todo)
    ran = dict(zip((case_key(c) for c in todo), zip(ins, run_over(loaded.flat, ins))))
    got = [have.get(case_key(c)) or ran[case_key(c)] for c in cases]
    return Refs(tuple(cases), tuple(i for i, _ in got), tuple(o for _, o in got))
