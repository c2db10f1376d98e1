"""The one pipeline's export, prove and optimize stages for a family with :class:`~onnxport.families.Hooks`:
each calls the family's hook and makes the report's records of its typed result the same way for every family
(the export's attempts, the validation's cases, the file moved into OUT under the name its proof earns, the
family's section). :mod:`onnxport.pipeline`'s stage functions hand a run whose family has hooks to these."""

from __future__ import annotations

import time

from onnxport.core.diagnostics import error
from onnxport.core.errors import ExportFailed
from onnxport.core.onnxfile import external_data_files, move_model
from onnxport.core.records import Attempt, CaseResult, ExportResult, Failure, ParityResult
from onnxport.diagnose import rootcause
from onnxport.families.hooks import Exported, Made, ProvenCase
from onnxport.families.run import Run
from onnxport.prove.check import check
from onnxport.report.build import Outcome


def export(run: Run) -> Run:
    """The family's export (its files in ``run.work``); the export's record with one attempt per opset or way it
    tried (``Exported.tried``) and the kept one. An export that fails (ExportFailed) ends the run as the plain
    model's does: the report says why (status ``export_failed``, exit 3)."""
    t = time.perf_counter()
    try:
        made = run.hooks.export(run)
    except ExportFailed as e:
        run = run.timed(export=time.perf_counter() - t)
        ex = run.options.export
        tried = e.attempts or (Attempt(ex.exporter, False, run.timings["export"], ex.opset or 0, e.message),)
        diags = (*run.loaded.diagnostics, *e.diagnostics, error("export-failed", e.message, hint=e.hint))
        return run.but(stopped=True, outcome=Outcome(run.loaded, run.options.command, tuple(rootcause.rank(diags)),
                                                     dict(run.timings), attempts=tried, log=run.options.log_name))
    run = run.timed(export=time.perf_counter() - t)
    result = export_result(made)
    outcome = Outcome(run.loaded, run.options.command, (*run.loaded.diagnostics, *made.diagnostics),
                      dict(run.timings), export=result, log=run.options.log_name)
    return run.but(result=result, made=Made(made), outcome=outcome)


def export_result(made: Exported) -> ExportResult:
    """The report's record of a family's export."""
    attempts = (*(Attempt(made.exporter, False, 0.0, made.opset, why) for why in made.tried),
                Attempt(made.exporter, True, made.seconds, made.opset, note=made.note))
    return ExportResult(made.path, made.exporter, made.opset, made.seconds, attempts,
                        bool(external_data_files(made.path)))


def prove(run: Run) -> Run:
    """The structural check and the family's proof of its export; the file moved into OUT as model.onnx when
    proven, else model.unverified.onnx (a family whose ``Hooks.keep`` names its files: under its names)."""
    timings = dict(run.timings)
    t = time.perf_counter()
    checked = check(run.result.path)
    timings["check"] = time.perf_counter() - t
    t = time.perf_counter()
    proved = run.hooks.prove(run, run.made.exported)
    timings["parity"] = time.perf_counter() - t
    parity = ParityResult(proved.passed, proved.tolerance, tuple(case_result(c) for c in proved.cases))
    diags = rootcause.rank((*run.outcome.diagnostics, *checked.diagnostics, *proved.diagnostics), parity)
    outcome = run.outcome.but(check=checked, parity=parity, diagnostics=tuple(diags), timings=timings)
    run = run.but(made=run.made.but(proved=proved), timings=timings, outcome=outcome)
    if run.hooks.keep is not None:
        final = run.hooks.keep(run, run.proven)
    else:
        final = run.out / ("model.onnx" if run.proven else "model.unverified.onnx")
        move_model(run.result.path, final)
    run = run.but(model_file=final)
    return run.but(outcome=sectioned(run, outcome.but(model_path=final.name)))


def case_result(case: ProvenCase) -> CaseResult:
    """One case of a family's proof as a case of the report's validation."""
    return CaseResult(case.label, {k: list(v) for k, v in case.shapes.items()}, "random", case.max_abs_err,
                      case.max_rel_err, case.passed, case.error,
                      {name: {"max_abs_err": err, "passed": case.passed} for name, err in case.errors.items()},
                      sizes=dict(case.sizes), failure=None if case.passed else Failure.MISMATCH)


def optimize(run: Run) -> Run:
    """The family's variants of the proven file (nothing when it has none), in its section."""
    if run.hooks.optimize is None:
        return run
    found = run.hooks.optimize(run, run.made)
    run = run.but(made=run.made.but(optimized=found))
    return run.but(outcome=sectioned(run, run.outcome.but(diagnostics=(*run.outcome.diagnostics,
                                                                      *found.diagnostics))))


def sectioned(run: Run, outcome: Outcome) -> Outcome:
    """``outcome`` with the family's report section made from its records so far."""
    key = run.section
    if key is None:
        return outcome
    return outcome.but(sections={**outcome.sections, key: run.hooks.section(run)})
