"""The proof of one export inside the stage sequence: the structural check, branch coverage, parity on the case
matrix with PyTorch's references, the localization of the first failing case and batch invariance, read into the
run's :class:`~onnxport.report.build.Outcome`."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

from onnxport import runtime
from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.errors import UsageError
from onnxport.core.records import BatchInvariance, Failure
from onnxport.core.samples import sweep_cases, validation_cases
from onnxport.diagnose import explain, rootcause
from onnxport.families.run import Run
from onnxport.prove import batching, branches, localize
from onnxport.prove.check import check
from onnxport.prove.parity import compare
from onnxport.prove.references import Refs, references
from onnxport.report.build import Outcome
from onnxport.sources.base import LoadedModel


def check_and_compare(run: Run, diags: list[Diagnostic], localize_failure: bool = True,
                       known: Refs | None = None, fail_fast: bool = False) -> tuple[Outcome, Refs]:
    """The proof: structural check, branch coverage, parity on the case matrix, and the localization of the
    first failing case; with PyTorch's outputs on the cases (``known``: those of an earlier file of the same
    model, reused). ``fail_fast``: parity stops at the first failing case (a file the chain replaces when it
    fails, whose proof only says why). The returned outcome's ``loaded`` runs on the run's device."""
    loaded, result, tolerance, timings = run.loaded, run.result, run.options.proof.tolerance, dict(run.timings)
    run.progress("checking the graph")
    t = time.perf_counter()
    checked = check(result.path, loaded.inputs, loaded.dims)
    timings["check"] = time.perf_counter() - t
    diags.extend(checked.diagnostics)
    diags = explain.enrich(diags, loaded, result.guards)
    run.progress("proving parity with PyTorch")
    t = time.perf_counter()
    cases = validation_cases(loaded.dims)
    sweep = sweep_cases(loaded.dims, cases)  # every size of a short range (batch 1..16), while cheap
    diags.extend(explain.runtime_traps(loaded, cases[0]))
    extra, sites = branches.cover(loaded, result.path, cases, result.guards)
    cases += extra
    placed, sess = _placed_session(run, checked.nodes)
    diags.extend(explain.placement(placed, result))
    loaded = runtime.loaded_on_device(loaded, run.device)
    with _strict_on_gpu(run.device):  # fp32 proven as fp32: TF32 off on both sides (onnxruntime's in GpuOptions)
        t_refs = time.perf_counter()
        refs = references(loaded, cases, known)
        parity = compare(loaded, result.path, cases=cases, tolerance=tolerance, dim_checks=checked.dynamic_dims,
                         sess=sess, refs=refs, sweep=sweep, spent_before=time.perf_counter() - t_refs,
                         fail_fast=fail_fast)
    del sess
    diags.extend(explain.unreached_branches(sites, loaded))
    timings["parity"] = time.perf_counter() - t
    diags.extend(parity.diagnostics)
    divergence = None
    failing = [(c, r) for c, r in zip(cases, parity.cases) if not r.passed and r.failure is not Failure.TORCH]
    if failing and not parity.load_error and localize_failure:
        run.progress("localizing the divergence")
        t = time.perf_counter()
        # localizing keeps every node's value of its case: the case of the fewest input elements costs least
        smallest = min(failing, key=lambda cr: sum(math.prod(s) for s in cr[1].shapes.values()))[0]
        try:
            divergence = localize.find(loaded, result.path, smallest, tolerance, providers=run.providers())
        except localize.TooLarge as e:
            diags.append(info("localize-skipped", f"the failing outputs were not traced back to a module: the "
                              f"smallest failing case ({smallest.label}) is too large to localize ({e})",
                              hint="localize a smaller failing case: onnxport compare SOURCE MODEL.onnx with "
                                   "--dim ranges that hold it"))
        timings["localize"] = time.perf_counter() - t
        if divergence is not None:
            diags.append(explain.explain_divergence(divergence, loaded, diags))
    invariance = _batch_invariance(run, loaded, diags) if parity.passed else None
    diags = rootcause.rank(diags, parity, divergence)
    return Outcome(loaded, run.options.command, tuple(diags), dict(timings), export=result, check=checked,
                   parity=parity, batch_invariance=invariance, branches=tuple(sites), placement=placed,
                   divergence=divergence,
                   divergence_module=explain.label(loaded, divergence.module) if divergence else None), refs


def _batch_invariance(run: Run, loaded: LoadedModel, diags: list[Diagnostic]) -> BatchInvariance | None:
    """Each row alone against the same row inside a batch (None when the inputs cannot be batched); a
    batch-dependent graph is a warning."""
    run.progress("each row alone against the same row inside a batch")
    invariance = batching.check(loaded, run.result.path, tolerance=run.options.proof.tolerance,
                                providers=run.providers())
    if invariance.applicable and not invariance.passed:
        diags.append(warning(
            "batch-dependent", f"a row's outputs change when it runs inside a batch of {invariance.rows} "
            f"(up to {invariance.max_abs_diff:.3g}, row {invariance.worst_row}"
            + (f"; {invariance.reason})" if invariance.reason else ")"),
            hint="the graph mixes rows (a batch statistic, a reduction over axis 0): do not batch requests "
                 "to it; onnxport serve runs each request alone"))
    return invariance if invariance.applicable else None


def _strict_on_gpu(device: str) -> contextlib.AbstractContextManager:
    return runtime.strict_fp32() if device == "cuda" else contextlib.nullcontext()


def _placed_session(run: Run, nodes: int) -> tuple[runtime.Placement | None, Any]:
    """The parity session on the run's device and where its nodes went (None, None when onnxruntime cannot
    load the file: parity then reports why). On the CPU every node is on the CPU (``nodes``: the graph's), so
    the session is opened once, without the verbose placement log a GPU needs."""
    path, chain = run.result.path, run.providers()
    log: list[str] = []
    try:
        if run.device == "cpu":
            sess = runtime.session(path, providers=chain)
            return runtime.Placement("cpu", tuple(runtime.provider_names(chain)), tuple(sess.get_providers()),
                                     {runtime.CPU: nodes}), sess
        sess = runtime.session(path, providers=chain, log_sink=log)
    except UsageError:
        return None, None
    return runtime.placement_from(sess, run.device, chain, "".join(log), gpu=run.options.runtime.gpu), sess
