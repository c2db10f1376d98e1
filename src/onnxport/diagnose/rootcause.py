"""One root cause first: the diagnostics of a failed run ranked so that the cause — an operator no exporter
translates, a branch or size frozen at export, reduced-precision arithmetic — is the headline, and what
follows from it (failed cases, the module where outputs part, a dim that could not be proven) is listed under
it with ``follows_from`` naming the cause, instead of as separate errors blaming innocent modules or dims."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from onnxport.core.diagnostics import Diagnostic, error
from onnxport.core.records import Divergence, Failure, ParityResult

FROZEN = ("control-flow-frozen", "dynamic-dim-narrowed", "frozen-branch")
FOLLOWERS = ("parity-failed", "divergence", "onnxruntime-error", "dynamic-dim-unproven", "export-failed",
             "frozen-branch")
PRECISION_FACTOR = 50  # a failure within 50× the tolerance everywhere is rounding, not a wrong graph
SHAPE_SPREAD = 10  # ... and one whose size does not depend on the shape (largest / smallest case error)


def rank(diags: Sequence[Diagnostic], parity: ParityResult | None = None,
         divergence: Divergence | None = None) -> list[Diagnostic]:
    """``diags`` with the root cause first and its consequences right under it (``follows_from`` set);
    everything else keeps its order. Nothing is dropped."""
    diags = list(diags)
    root = (_operator(diags) or _cannot_tell(diags, parity) or _precision(diags, parity, divergence)
            or _frozen(diags, parity) or _fixed_dim(diags))
    if root is None:
        return diags
    if root not in diags:
        diags.insert(0, root)
    follows = [d for d in diags if d is not root and d.severity == "error" and d.code in FOLLOWERS]
    rest = [d for d in diags if d is not root and all(d is not f for f in follows)]
    return [root, *(dataclasses.replace(d, follows_from=root.code) for d in follows), *rest]


def _operator(diags: list[Diagnostic]) -> Diagnostic | None:
    """The export failed and an exporter named an operator it cannot translate: that operator, with the
    module and line when one attempt found them."""
    if not any(d.code == "export-failed" for d in diags):
        return None
    ops = [d for d in diags if d.code == "unsupported-operator" and d.severity == "error"]
    return max(ops, key=lambda d: d.module is not None, default=None)


def _cannot_tell(diags: list[Diagnostic], parity: ParityResult | None) -> Diagnostic | None:
    """Every case passes but no output's reference could tell a right file from a wrong one: that, not the
    export (a frozen line noted while exporting has nothing failing to explain)."""
    if parity is None or any(not r.passed for r in parity.cases):
        return None
    return next((d for d in diags if d.code == "cannot-tell" and d.severity == "error"), None)


def _precision(diags: list[Diagnostic], parity: ParityResult | None,
               divergence: Divergence | None) -> Diagnostic | None:
    """Every case fails by a small error of about the same size at every shape: rounding (TF32, fp16 kernels,
    a tolerance tighter than the arithmetic), not a frozen branch or a baked-in size."""
    if parity is None or parity.passed or not parity.cases or parity.load_error:
        return None
    judged = [r for r in parity.cases if not (r.passed and r.scaled)]  # a looser bound proves no precision
    if not judged or any(r.passed or r.failure is not Failure.MISMATCH for r in judged):
        return None
    errs = [r.max_abs_err for r in judged]
    tol = parity.tolerance
    if max(errs) <= tol.atol:
        return None  # no error to speak of: the cases fail on something else (unmatched detections, a count)
    if max(errs) > PRECISION_FACTOR * (tol.atol + tol.rtol) or max(errs) > SHAPE_SPREAD * max(min(errs), 1e-30):
        return None
    growth = ""
    if divergence is not None and divergence.trace:
        first = next((e for e in divergence.trace if e.get("max_abs_err")), None)
        if first is not None:
            growth = (f"; the error starts at the first module ({first.get('module')}, "
                      f"{first['max_abs_err']:.1e}) and grows with depth to {max(errs):.1e}")
    return error("reduced-precision",
                 f"every case fails by a small error ({min(errs):.1e} … {max(errs):.1e} over {len(errs)} cases) "
                 f"that does not depend on the shape{growth}: rounding (TF32 or fp16 kernels on a GPU, float32 "
                 "sums in another order on a CPU), not a wrong export",
                 hint="on CUDA run the fp32 proof with TF32 off (PyTorch's allow_tf32 flags, the CUDA provider's "
                      "use_tf32=0); on a CPU, a tolerance that fits the model's magnitudes (--atol); if you serve "
                      "with reduced precision, prove it with a tolerance that fits it, e.g. --atol 1e-2 --rtol 1e-2")



def _frozen(diags: list[Diagnostic], parity: ParityResult | None) -> Diagnostic | None:
    """Parity failed and the export is known to have frozen a branch, loop, value or size: that line."""
    if parity is None or parity.passed:
        return None
    found = [d for d in diags if d.code in FROZEN]
    if not found:
        return None
    first = next((d for d in found if d.code == "frozen-branch"), found[0])
    failed = [r for r in parity.cases if not r.passed]
    fixed = [d for d in diags if d.code == "dynamic-dim-unproven"]
    where = f" at {Path(first.source[0]).name}:{first.source[1]}" if first.source else ""
    mod = f" in {first.module}" if first.module else ""
    dims = ""
    if fixed:
        dims = "; " + ", ".join(d.message.split(" is symbolic", 1)[0] for d in fixed) + " did not stay dynamic"
    return error("frozen-branch",
                 f"the export froze a branch, loop, value or size{where}{mod} to the example's: "
                 f"{len(failed)} of {len(parity.cases)} cases need another and fail{dims}",
                 module=first.module, node=first.node, hint=first.hint, source=first.source)


def _fixed_dim(diags: list[Diagnostic]) -> Diagnostic | None:
    """No frozen line is known, but a dim could not be proven: that dim (the innocent ones were proven by
    cases that change them alone)."""
    return next((d for d in diags if d.code == "dynamic-dim-unproven"), None)
