"""Batch invariance: does a row get the same answer alone as inside a batch of other rows?

A server that batches requests hands each user the row of a batched run. That is only right when the graph
treats rows independently. Dynamic int8 quantization does not: it computes each activation's scale over the
whole tensor, so one user's answer depends on who else was in the batch. The check runs a heterogeneous batch
(random rows, different padding, float rows at different scales) once, then each row alone, and compares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from onnxport.core.records import FP32, BatchInvariance, Tolerance
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.prove.across import centred_cosine_min
from onnxport.prove.compare import compare_arrays
from onnxport.prove.varying import COSINE, centred
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

SERVE_ROWS = 32  # the server's and the Triton repository's default max batch
ROW_SCALES = (1.0, 10.0, 0.1, 3.0)  # float rows at different magnitudes: what per-batch scales trip over


def batch_symbol(loaded: LoadedModel) -> str | None:
    """The dynamic dim every input has first (the axis a server batches along), or None."""
    firsts = {s.shape[0] if s.shape else None for s in loaded.inputs}
    sym = next(iter(firsts)) if len(firsts) == 1 else None
    if isinstance(sym, str) and sym in loaded.dims and loaded.dims[sym].max > 1:
        return sym
    return None


def heterogeneous_batch(loaded: LoadedModel, rows: int, seed: int = 7) -> tuple[torch.Tensor, ...]:
    """``rows`` different rows at the export sizes: random values, masks padded differently, float rows
    scaled differently."""
    sym = batch_symbol(loaded)
    sizes = {**export_sizes(loaded.dims), sym: rows}
    tensors = list(make_inputs(loaded.inputs, sizes, "random", seed))
    for i, t in enumerate(tensors):
        if t.dtype.is_floating_point and t.dim():
            scale = torch.tensor([ROW_SCALES[r % len(ROW_SCALES)] for r in range(rows)], dtype=t.dtype)
            tensors[i] = t * scale.reshape(-1, *([1] * (t.dim() - 1)))
    return tuple(tensors)


def check(loaded: LoadedModel, path: str | Path, *, rows: int | None = None, tolerance: Tolerance = FP32,
          sess=None, providers: list | None = None) -> BatchInvariance:
    """Each row of a heterogeneous batch of ``rows`` (default: the server's max batch, within the declared
    range) against the same row run alone, every output within ``tolerance`` (on ``sess``, else a session on
    ``providers``, default the CPU)."""
    sym = batch_symbol(loaded)
    if sym is None:
        return BatchInvariance(0, True, 0.0, applicable=False,
                               reason="the inputs share no dynamic first dim: a server cannot batch them")
    rows = max(2, min(rows or SERVE_ROWS, loaded.dims[sym].max))
    sess = sess if sess is not None else session(path, providers=providers)
    feed = FeedMap.of(loaded.inputs, sess)
    batch = heterogeneous_batch(loaded, rows)
    together = sess.run(None, feed(batch))
    unbatched = next(((o.name, np.shape(t)) for o, t in zip(sess.get_outputs(), together)
                      if not np.ndim(t) or np.shape(t)[0] != rows), None)
    if unbatched is not None:
        return BatchInvariance(0, True, 0.0, applicable=False,
                               reason=f"output '{unbatched[0]}' is not split by row (shape {list(unbatched[1])} for "
                                      f"a batch of {rows}): a server cannot hand each request its row")
    worst, worst_row, passed = 0.0, None, True
    singles: list[list[np.ndarray]] = [[] for _ in together]
    for r in range(rows):
        alone = sess.run(None, feed(tuple(t[r:r + 1] for t in batch)))
        for i, (got_batched, got_alone) in enumerate(zip(together, alone)):
            diff, _, ok = compare_arrays(np.asarray(got_alone), np.asarray(got_batched)[r:r + 1], tolerance)
            singles[i].append(np.asarray(got_alone))
            if diff > worst:
                worst, worst_row = diff, r
            passed &= ok
    names = [o.name for o in sess.get_outputs()]
    cos, within, untold, held = _varying(names, singles, together, tolerance)
    why = None
    if not held:
        why = (f"on what varies between the rows, the centred cosine is {cos:.4f} (below "
               f"{centred_cosine_min(tolerance):.4f})" if cos is not None and cos < centred_cosine_min(tolerance)
               else f"where the centred rows cannot tell, {1 - (within or 0.0):.1%} of the elements are outside "
               "the tolerance at the output's own scale")
    return BatchInvariance(rows, bool(passed and held), float(worst), worst_row, reason=why, cosine_centred=cos,
                           within_own_scale=within, cannot_tell=untold)


def _varying(names: list[str], singles: list[list[np.ndarray]], together: list, tolerance: Tolerance
             ) -> tuple[float | None, float | None, dict[str, str], bool]:
    """Each float output's rows alone against the same rows batched, on what varies between the rows (centred by
    their mean alone, :mod:`onnxport.prove.varying`): the lowest centred cosine must reach
    :func:`~onnxport.prove.across.centred_cosine_min`; an output whose centred rows cannot tell is held to every
    element within the tolerance at its own scale. (lowest cosine, lowest share within, why not per output, held)."""
    cosines: list[float] = []
    shares: list[float] = []
    untold: dict[str, str] = {}
    held = True
    for name, alone, batched in zip(names, singles, together):
        ref = np.concatenate(alone)
        if not np.issubdtype(ref.dtype, np.floating) or ref.shape != np.shape(batched):
            continue
        v = centred([ref], [np.asarray(batched)], tolerance)
        if v.within is not None:
            shares.append(v.within)
        if v.cosine is not None:
            cosines.append(v.cosine)
            held &= v.cosine >= centred_cosine_min(tolerance)
        else:
            untold[name] = v.cannot_tell.get(COSINE, "cannot tell")
            held &= v.within is not None and v.within >= 1.0
    return min(cosines, default=None), min(shares, default=None), untold, held
