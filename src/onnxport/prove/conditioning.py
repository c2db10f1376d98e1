"""Rows that float32 arithmetic cannot decide: PyTorch's own float32 answer is outside the tolerance of the exact
(float64) answer, so comparing onnxruntime with it at that tolerance says nothing about the export.

Seen on degenerate inputs only: an all-zero latent entering a UNet makes every channel constant, each GroupNorm
of one channel per group then divides rounding noise by sqrt(eps), and the output of that row is noise in any
float32 implementation (PyTorch 0.16 from float64, onnxruntime 1.26, on outputs of magnitude ~1). Such rows are
left out of the comparison of a failing case and counted (``float32_unreliable_rows``); a case whose every row
is so stays failed, and a case judged this way proves no dim (:attr:`CaseResult.scaled`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from onnxport.core.records import Tolerance
from onnxport.prove.compare import compare_arrays, magnitudes, own_tolerance
from onnxport.prove.references import as_numpy
from onnxport.sources.base import LoadedModel

MAX_PARAMETERS = 100_000_000  # widened to float64 for a call: 8 bytes per parameter while it runs
MAX_WORK = 5e13  # parameters x input elements: past it float64 (no fast kernels on CPU) takes minutes per case


def float64_outputs(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray] | None:
    """The model's outputs computed in float64 (its float parameters and buffers widened for the call and given
    back as they were, float inputs widened); None for a model over :data:`MAX_PARAMETERS` or one that does not
    run in float64 (float32 tensors made inside forward, …), or whose parameters times input elements pass
    :data:`MAX_WORK` (an Inception v3 at batch 16 and 512 x 512: tens of minutes in float64 on one core)."""
    if loaded.parameters > MAX_PARAMETERS or not any(t.is_floating_point() for t in inputs):
        return None
    if loaded.parameters * sum(t.numel() for t in inputs) > MAX_WORK:
        return None
    tensors = [t for t in (*loaded.flat.parameters(), *loaded.flat.buffers()) if t.is_floating_point()]
    kept = [t.data for t in tensors]
    default = torch.get_default_dtype()
    hooks = []
    try:  # widened in place and given back exactly (no copy: a model may hold tensors deepcopy refuses)
        for t in tensors:
            t.data = t.data.double()
        torch.set_default_dtype(torch.float64)  # tensors forward makes itself (a grid from torch.arange)
        for module in loaded.flat.modules():  # and those it narrows itself (RAFT's coords grid: `.float()`)
            hooks.append(module.register_forward_pre_hook(_widened, with_kwargs=True))
        with torch.inference_mode():
            outs = loaded.flat(*[t.double() if t.is_floating_point() else t for t in inputs])
        return [as_numpy(o) for o in outs]
    except Exception:  # noqa: BLE001 - no float64 answer: the case is judged as it was
        return None
    finally:
        for h in hooks:
            h.remove()
        torch.set_default_dtype(default)
        for t, data in zip(tensors, kept):
            t.data = data


def _widened(module, args, kwargs):
    """A forward pre-hook: float32 tensors among a module's arguments as float64."""
    def wide(t):
        return t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

    return torch.utils._pytree.tree_map(wide, args), torch.utils._pytree.tree_map(wide, kwargs)


def unreliable_rows(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...],
                    pairs: Sequence[tuple[str, np.ndarray, np.ndarray]], failed: set[str], tol: Tolerance,
                    scaled: bool) -> dict[str, np.ndarray]:
    """Per failing float output (``failed``), a mask of its rows (first axis, broadcastable to the output) whose
    float32 PyTorch value is itself outside ``tol`` of the float64 value; only outputs where some rows stay
    decidable (a case must still prove something)."""
    wanted = [(n, r) for n, r, _ in pairs if n in failed and np.issubdtype(r.dtype, np.floating) and r.ndim >= 1
              and len(r) > 1]
    if not wanted:
        return {}
    exact = float64_outputs(loaded, inputs)
    if exact is None or len(exact) != len(pairs):
        return {}
    by_name = {n: e for (n, _, _), e in zip(pairs, exact)}
    out: dict[str, np.ndarray] = {}
    for name, r in wanted:
        e = by_name[name]
        if e.shape != r.shape:
            continue
        scale = magnitudes(e) if scaled else None
        own = own_tolerance(e, tol)
        rows = np.array([not compare_arrays(e[i], r[i], own, None if scale is None else scale[i])[2]
                         for i in range(len(r))])
        if rows.any() and not rows.all():
            out[name] = rows.reshape((-1,) + (1,) * (r.ndim - 1))
    return out
