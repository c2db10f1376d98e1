"""Failing cases looked at against the exact (float64) answer: PyTorch's own float32 answer is off it by its
rounding error, so comparing onnxruntime with PyTorch at a tolerance below that error says nothing about the
export.

Two kinds of rows come out of it (:func:`against_exact`). Deep stacks (ResNet-101 with random weights) end
PyTorch's float32 1.6e-4 from float64 on elements near zero, over the default atol, on outputs of magnitude 2:
such rows are judged against float64 instead, allowed twice PyTorch's own error (``compared_with: float64``);
a case judged so proves its dims like any other. Degenerate inputs make a row noise in any float32
implementation: an all-zero latent entering a UNet makes every channel constant, each GroupNorm of one channel
per group then divides rounding noise by sqrt(eps) (PyTorch 0.16 from float64, onnxruntime 1.26, on outputs of
magnitude ~1). Such rows are left out of the comparison and counted (``float32_unreliable_rows``); a case whose
every row is so stays failed, and a case with rows left out proves no dim (:attr:`CaseResult.scaled`).

Detections have the same trouble on degenerate inputs: a black image gives every anchor away from the border the
same score, and which of the tied boxes the top-k and NMS keep is rounding's choice. Failing detections are looked
at against PyTorch's own detections for inputs nudged by about float32 rounding (:func:`unsteady_detections`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from onnxport.core.records import Tolerance
from onnxport.prove.compare import detection_groups, match_group, own_tolerance
from onnxport.prove.references import as_numpy, torch_outputs
from onnxport.sources.base import LoadedModel

MAX_PARAMETERS = 160_000_000  # widened to float64 for a call: 8 bytes per parameter while it runs
MAX_WORK = 2e14  # parameters x input elements: past it float64 (no fast kernels on CPU) takes minutes per case


def float64_outputs(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray] | None:
    """The model's outputs computed in float64 (its float parameters and buffers widened for the call and given
    back as they were, float inputs widened); None for a model over :data:`MAX_PARAMETERS` or one that does not
    run in float64 (float32 tensors made inside forward, …), or whose parameters times input elements pass
    :data:`MAX_WORK` (an Inception v3 at batch 16 and 512 x 512: tens of minutes in float64 on one core; a ResNet-101 at batch
    4 and 512 x 512, 1.4e14, takes 9 s)."""
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


NOISE_TIMES = 2.0  # a row judged against float64 is allowed twice PyTorch's own float32 error there
ROUNDING = 1e-4  # and, where PyTorch's float32 misses the tolerance, this share of the row's magnitude
ILL_CONDITIONED = 1e-3  # PyTorch's float32 error past this share of the row's magnitude: the row is noise


@dataclass(frozen=True)
class AgainstExact:
    """A failing case's float outputs looked at against the float64 answer (:func:`against_exact`).

    ``undecidable``: per output, a mask of the rows (broadcastable to it) where PyTorch's own float32 error passes
    :data:`ILL_CONDITIONED` of the row's magnitude: noise in any float32 implementation, left out. ``exact``: the
    float64 answer of each output compared with it instead of PyTorch's float32 one, ``floors`` the error allowed
    at each of its rows on top of the tolerance (:func:`against_exact`) and
    ``noise`` PyTorch's largest float32 error on the output."""

    undecidable: dict[str, np.ndarray] = field(default_factory=dict)
    exact: dict[str, np.ndarray] = field(default_factory=dict)
    floors: dict[str, np.ndarray] = field(default_factory=dict)
    noise: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.undecidable or self.exact)


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1) if a.ndim >= 1 and a.shape[0] else a.reshape(1, -1)


def against_exact(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...],
                  pairs: Sequence[tuple[str, np.ndarray, np.ndarray]], failed: set[str], tol: Tolerance
                  ) -> AgainstExact:
    """The failing float outputs (``failed``) of one case, against the model's float64 answer.

    PyTorch's float32 answer is itself off the exact one by its rounding error, which grows with depth: ResNet-101
    with random weights ends up to 1.6e-4 from float64 on elements near zero (atol 1e-4), and onnxruntime's file
    up to 1.4e-4, as right as PyTorch, yet the two differ by 2.2e-4. So a failing output is judged against
    float64 instead, each row allowed :data:`NOISE_TIMES` PyTorch's own error there on top of ``tol``, and at least
    :data:`ROUNDING` of the row's magnitude where PyTorch itself misses ``tol`` (its error depends on the order of
    its sums: Visformer's outputs near 360 end 1.4e-3 from float64 on one thread, 4.8e-3 on two, and onnxruntime's
    9.7e-3, a few float32 steps of 360). Rows where PyTorch's error passes :data:`ILL_CONDITIONED` of the row's
    magnitude are noise in any float32 implementation and left out, and only while some rows stay (a case must
    still prove something)."""
    wanted = [(n, r) for n, r, _ in pairs if n in failed and np.issubdtype(r.dtype, np.floating) and r.size]
    if not wanted:
        return AgainstExact()
    answers = float64_outputs(loaded, inputs)
    if answers is None or len(answers) != len(pairs):
        return AgainstExact()
    by_name = {n: e for (n, _, _), e in zip(pairs, answers)}
    found = AgainstExact()
    for name, r in wanted:
        e = by_name[name]
        if e.shape != r.shape:
            continue
        off = np.abs(_rows(r).astype(np.float64) - _rows(e))
        noise = off.max(1)
        size = np.abs(np.nan_to_num(_rows(e), nan=0.0, posinf=0.0, neginf=0.0)).max(1)
        own = own_tolerance(e, tol)
        noisy = ~(noise <= ILL_CONDITIONED * np.maximum(size, own.atol))  # NaN noise: noisy
        missed = ~(off <= own.bound(_rows(e))).all(1)  # PyTorch's float32 itself outside the tolerance there
        allowed = np.where(missed, np.maximum(NOISE_TIMES * noise, ROUNDING * size), NOISE_TIMES * noise)
        if noisy.all():
            continue
        shape = (-1,) + (1,) * (r.ndim - 1) if r.ndim >= 1 else ()
        if noisy.any():
            found.undecidable[name] = noisy.reshape(shape)
        found.exact[name] = e
        found.floors[name] = np.where(noisy, 0.0, allowed).reshape(shape)
        found.noise[name] = float(noise[~noisy].max())
    return found


NUDGE = 1e-6  # inputs nudged by this times their magnitude: a few float32 roundings
NUDGES = 3  # nudged runs: how far PyTorch's own detections move varies from one nudge to the next


def nudged(inputs: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, ...]:
    """``inputs`` with float32 rounding's size of noise added: :data:`NUDGE` of each one's magnitude (at least 1)."""
    rng = np.random.default_rng(seed)
    return tuple(t + NUDGE * max(float(t.abs().max()), 1.0) * torch.from_numpy(rng.standard_normal(t.shape)).to(t.dtype)
                 if t.is_floating_point() and t.numel() else t for t in inputs)


def unsteady_detections(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...],
                        pairs: Sequence[tuple[str, np.ndarray, np.ndarray]], per_out: dict[str, dict],
                        tol: Tolerance) -> dict[str, dict]:
    """The failing detection outputs of one case that float32 cannot decide: PyTorch's own detections for the
    inputs nudged by :data:`NUDGE` (the most over :data:`NUDGES` nudges) move more than the file's differ from
    them (their paired boxes and scores further, and at least as many unpaired or borderline as the file has
    unpaired). A black image into Faster R-CNN: nudged by 1e-6, PyTorch's boxes move up to 7.3 px and its scores
    4e-3, the file's are 1.1 px and 2.4e-4 from it, and 9 of its 100 detections find no counterpart where up to 80
    of PyTorch's own are unpaired or borderline. Returns, per such output, how far PyTorch's own moved
    (``box_err``, ``score_err``, ``unpaired``: unmatched and borderline); a wrong file (boxes decoded wrong, scores
    off) parts from PyTorch by more than PyTorch from itself and stays failed."""
    failing = {n for n, rec in per_out.items() if rec.get("compare") == "detections" and not rec["passed"]}
    if not failing:
        return {}
    ref = {n: r for n, r, _ in pairs}
    groups = [g for g in detection_groups(list(ref)).values() if set(g.values()) & failing]
    moved: list[dict[str, float]] = [{"box_err": 0.0, "score_err": 0.0, "unpaired": 0} for _ in groups]
    for seed in range(NUDGES):
        try:
            again = dict(zip(loaded.output_names, torch_outputs(loaded, nudged(inputs, seed))))
        except Exception:  # noqa: BLE001 - no second answer: the case stays as judged
            return {}
        for group, most in zip(groups, moved):
            if set(group.values()) <= set(again):
                own = match_group(group, ref, again, tol, loaded)
                most.update(box_err=max(most["box_err"], own.box_err), score_err=max(most["score_err"], own.score_err),
                            unpaired=max(most["unpaired"], own.unmatched + own.borderline))
    unsteady: dict[str, dict] = {}
    for group, most in zip(groups, moved):
        file = next(per_out[n] for n in group.values() if "unmatched" in per_out[n])
        box, score = (np.inf if file[k] is None else file[k] for k in ("box_err", "score_err"))
        if most["box_err"] >= box and most["score_err"] >= score and most["unpaired"] >= file["unmatched"]:
            unsteady.update({n: dict(most) for n in group.values()})
    return unsteady
