"""The stage sequence: load → export → check → prove (→ localize) → optimize → bench, with the report
written at each checkpoint. The façades in api.py call into it.

A run is the list of :class:`Stage` records of its model family (:mod:`onnxport.families`: the family
:func:`run_pipeline` detects brings its stages, refusals and loader; this module's :data:`FAMILY` is the plain
model, :data:`EXPORT_STAGES`) or :data:`ADOPTED_STAGES` (an ONNX file given to ``compare``/``optimize``/``bench``),
run by :func:`run_stages` on one :class:`Run`, which carries the run's :class:`~onnxport.core.options.Options`
and the records made so far."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from onnxport import families, optimize, report, runtime
from onnxport.bench import run as bench_run
from onnxport.bench import sizes_at
from onnxport.core import signals
from onnxport.core.diagnostics import Diagnostic, error, info, warning
from onnxport.core.errors import ExportFailed, UsageError, one_line
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import external_data_files, move_model, read_graph, remove_model
from onnxport.core.options import (
    LoadOptions,
    Options,
    ProofOptions,
    RuntimeOptions,
)
from onnxport.core.outdir import RESULT_FILES, check_out, output_folder
from onnxport.core.records import ExportResult, Failure
from onnxport.core.spec import Dim, InputSpec
from onnxport.diagnose import explain, rootcause
from onnxport.exporters import functions
from onnxport.exporters.chain import candidates as export_candidates
from onnxport.exporters.strategies import CONTROL_FLOW
from onnxport.families import Family, Run, Stage
from onnxport.families import steps as family_steps
from onnxport.families.proving import check_and_compare
from onnxport.prove import compare as judging
from onnxport.prove import samples as proving_samples
from onnxport.prove.references import Refs
from onnxport.report.build import Outcome, build_report
from onnxport.runtime import ops
from onnxport.sources import datasets, parse_model_args
from onnxport.sources.base import LoadedModel
from onnxport.sources.declared import load_declared
from onnxport.sources.finish import at_fixed_sizes


def use_runtime(options: RuntimeOptions) -> None:
    """Fail early (exit 4) when ``options.device`` cannot be used here; load its compiled custom-op libraries
    into the registry every later ONNX Runtime session reads (runtime.ops)."""
    runtime.check_device(options.device)
    for lib in options.custom_op_libraries:
        ops.add_library(lib)


def run_stages(stages: Sequence[Stage], run: Run) -> dict:
    """Each stage that applies, in order, timed; the report written at each checkpoint; the last report."""
    rep: dict = {}
    for stage in stages:
        signals.check()  # a signal whose exception a library swallowed stops the run between stages
        if run.stopped or not stage.applies(run):
            continue
        t = time.perf_counter()
        run = stage.step(run)
        if run.outcome is not None:
            if stage.timed:
                seconds = {**run.outcome.stage_seconds, stage.name: time.perf_counter() - t}
                run = run.but(outcome=run.outcome.but(stage_seconds=seconds))
            if stage.checkpoint or run.stopped:
                rep = _write(run.outcome, run.out)
    return rep


def _write(outcome: Outcome, out: Path) -> dict:
    """A checkpoint: the report built from ``outcome``, written into ``out``."""
    rep = build_report(outcome)
    report.write_all(rep, out)
    return rep


# --------------------------------------------------------------------------- entries


def run_pipeline(source: str, out: str | Path, options: Options = Options(), progress: Progress = noop) -> dict:
    """Load ``source`` and run every stage ``options`` asks for into ``out``; returns the report. The model's
    family (:func:`onnxport.families.detect`) checks the options it refuses before the (slow) load, loads the
    model and brings the stages."""
    family = families.detect(source, options.load.task, bool(options.load.inputs))
    options = options.checked()
    parts = family.parts(source) if family.parts is not None else ()
    if parts:
        family.refuse(options)
        return _run_parts(family, source, parts, Path(out), options, progress)
    return _run_family(family, source, out, options, progress)


def _run_family(family: Family, source: str, out: str | Path, options: Options, progress: Progress,
                keywords: dict[str, Any] | None = None) -> dict:
    """One model of ``family`` through its stages into ``out`` (``keywords``: more for its loader)."""
    if family.variant_kind is not None:
        options = _variants_of(options, family.variant_kind)
    if family.device_first:
        use_runtime(options.runtime)
    options = family.refuse(options)  # before the (slow) load
    if not family.device_first:
        use_runtime(options.runtime)
    load_kw = {**_family_load_kw(family, options.load), **(keywords or {})}
    with _loaded_into(out, source, options, progress, family.check_seq, **load_kw) as run:
        run = run.but(hooks=family.hooks, section=family.section)
        stages = family.stages or EXPORT_STAGES  # PIPELINE_STAGES: the one pipeline's
        if not family.scratch:
            return run_stages(stages, run)
        run = run.but(work=Path(tempfile.mkdtemp(prefix=".onnxport-", dir=run.out)))
        try:
            return run_stages(stages, run)
        finally:
            shutil.rmtree(run.work, ignore_errors=True)


_WORST = ("export_failed", "validation_failed", "ok")


def _run_parts(family: Family, source: str, parts: Sequence[families.Part], out: Path, options: Options,
               progress: Progress) -> dict:
    """A model made of several: each part through its own family's stages into ``out/<part>/``, then one report
    in ``out`` headed by the main part's, with every part's status under ``components`` and the family's proof
    of the parts together under ``joint_proof``; the worst status is the whole one's (a part that raises stops
    the run; the parts before it stay complete in their folders)."""
    check_out(out, options.force)
    reports: dict[str, dict] = {}
    for part in parts:
        progress(f"{part.name}: {part.source}")
        family = families.detect(part.source, None)
        reports[part.name] = _run_family(family, part.source, out / part.name, options,
                                         lambda msg, name=part.name: progress(f"{name}: {msg}"), dict(part.keywords))
    main = next((p.name for p in parts if p.main), parts[-1].name)
    rep = dict(reports[main])
    rep["status"] = min((r["status"] for r in reports.values()), key=_WORST.index)
    joint = None
    if family.joint is not None and rep["status"] == "ok":
        progress("proving the models together")
        joint = family.joint(source, out, tuple(parts), options)
    if joint is not None:
        rep["joint_proof"] = joint.to_dict()
        if not joint.passed:
            rep["status"] = "validation_failed"
    proven = [n for n, r in reports.items() if r["status"] == "ok"]
    rep["summary"] = (f"{len(proven)}/{len(reports)} models proven ({', '.join(reports)})"
                      + (f"; {joint.summary}" if joint is not None else "")
                      + f"; {main}: {reports[main].get('summary', '')}")
    if rep.get("export", {}).get("path"):
        rep["export"] = {**rep["export"], "path": f"{main}/{rep['export']['path']}"}
    rep["components"] = [{"name": p.name, "source": p.source, "status": reports[p.name]["status"],
                          "summary": reports[p.name].get("summary"), "report": f"{p.name}/report.json",
                          "file": _part_file(out / p.name, reports[p.name]), "main": p.name == main}
                         for p in parts]
    report.write_all(rep, out)
    return rep


def _part_file(folder: Path, rep: dict) -> str | None:
    """The ONNX file a part's folder holds for use (best, else the proven export), relative to OUT."""
    for name in ("best.onnx", "model.onnx"):
        if (folder / name).is_file():
            return f"{folder.name}/{name}"
    return None


def _family_load_kw(family: Family, load: LoadOptions) -> dict[str, Any]:
    """The loader's keywords for ``family``: the load options, its own task and its own loader when it has them."""
    kw = _load_kw(load, task=family.load_task is None)
    if family.load_task is not None:
        kw["task"] = family.load_task
    if family.load is not None:
        kw["load"] = family.load
    return kw


def compare_file(source: str, onnx_path: str | Path, out: str | Path, options: Options = Options(),
                 progress: Progress = noop) -> dict:
    """Prove any ONNX file (exported by onnxport or not) against the PyTorch model, localize a divergence; then
    the variants and the benchmark ``options`` asks for (``options.bench.onnx_files``: more files to time)."""
    options = _variants_of(options.checked(), optimize.MODEL)
    use_runtime(options.runtime)
    onnx_path = Path(onnx_path)
    read_graph(onnx_path)  # a missing or broken file fails here, before the (slow) load
    for extra in options.bench.onnx_files[1:] if options.bench else ():
        read_graph(extra)
    with _loaded_into(out, source, options, progress, **_load_kw(options.load)) as run:
        if onnx_path.resolve().parent == Path(out).resolve() and onnx_path.name in RESULT_FILES:
            raise UsageError("the ONNX file lies in --out, where results are written", "choose another --out")
        return run_stages(ADOPTED_STAGES, run.but(source_file=onnx_path))


def _variants_of(options: Options, kind: str) -> Options:
    """``options`` with the variant names checked for the model's ``kind`` (a name it has no builder for is a
    UsageError before the load) and spelled as a tuple, or "auto"."""
    names = options.optimize.variants
    if names is None:
        return options
    parsed = optimize.parse_names(names, kind)
    return options.but(optimize=dataclasses.replace(options.optimize, variants=parsed if isinstance(parsed, str)
                                                    else tuple(parsed)))


def _load_kw(load: LoadOptions, task: bool = True) -> dict[str, Any]:
    """:func:`load_model`'s keywords from the load options (``task`` False: the caller sets it)."""
    kw = {f.name: getattr(load, f.name) for f in dataclasses.fields(load)}
    if not task:
        kw.pop("task")
    return kw


@contextlib.contextmanager
def _loaded_into(out: str | Path, source: str, options: Options, progress: Progress, check_seq: bool = True,
                 **load_kw: Any) -> Iterator[Run]:
    """The model loaded (its load time in the timings), --seq checked, the samples read and the output folder
    ready: what every run does first. The output folder is checked before the load and made after it, inside
    :func:`output_folder`, so a failure leaves no empty folder and touches no earlier result."""
    timings: dict[str, float] = {}
    proof = options.proof
    _check_samples(proof)
    check_out(Path(out), options.force)  # before the (slow) load; the folder is made after it
    t0 = time.perf_counter()
    progress(f"loading {source}")
    loaded = load_kw.pop("load", load_model)(source, **load_kw)
    timings["load"] = time.perf_counter() - t0
    if check_seq:
        _check_seq(loaded, options.optimize.seq)
    with output_folder(out, options.force) as folder:
        given = None
        if proof.samples is not None:
            t0 = time.perf_counter()
            progress(f"reading the samples in {proof.samples}")
            given = datasets.read_samples(proof.samples, loaded, tokenizer=proof.tokenizer,
                                          preprocess=proof.preprocess)
            timings["samples_read"] = time.perf_counter() - t0
        yield Run(options, loaded, folder, progress, timings, given)


def _check_samples(proof: ProofOptions) -> None:
    """The --samples files exist (before the slow load); --tokenizer/--preprocess without --samples is a
    usage error."""
    if proof.samples is not None:
        datasets.check_options(proof.samples, proof.tokenizer, proof.preprocess)
    elif proof.tokenizer is not None or proof.preprocess is not None:
        raise UsageError("--tokenizer and --preprocess read --samples, which is not given",
                         "add --samples PATH, or drop them")


def _check_seq(loaded: LoadedModel, seq: int | None) -> None:
    """--seq needs a token input with a dynamic length inside its declared range (fails before any work)."""
    if seq is None or not loaded.dims:
        return
    sizes = sizes_at(loaded, seq)
    for sym, d in loaded.dims.items():
        if sizes.get(sym) == seq and not d.min <= seq <= d.max:
            raise UsageError(f"--seq {seq} is outside the declared range of '{sym}' ({d.min}..{d.max})",
                             f"pick a length in {d.min}..{d.max}, or declare a wider range with -d {sym}=MIN..MAX")


# --------------------------------------------------------------------------- the stages


def _export(run: Run) -> Run:
    """The exporter chain into the scratch folder (its first file); a failure ends the run with the attempts and
    their causes. A family with hooks makes its own files (families.steps)."""
    if run.hooks is not None:
        return family_steps.export(run)
    loaded, ex = run.loaded, run.options.export
    diags: list[Diagnostic] = list(loaded.diagnostics) + explain.static_traps(loaded)
    customs = functions.discover_loaded(loaded)  # autograd.Functions with symbolic(): reported, exported as their ops
    run.progress(f"exporting ({ex.exporter})")
    t = time.perf_counter()
    found = export_candidates(loaded, run.work / "model.onnx", exporter=ex.exporter, opset=ex.opset,
                              device=run.device, gpu=run.options.runtime.gpu)
    try:
        result = next(found)
    except ExportFailed as e:
        run = run.timed(export=time.perf_counter() - t)
        diags.extend(explain.enrich(list(e.diagnostics), loaded, ()))
        diags.extend(explain.explain_attempts(e.attempts, loaded, failed=True))
        diags.append(error("export-failed", e.message, hint=e.hint))
        outcome = Outcome(loaded, run.options.command, tuple(rootcause.rank(diags)), dict(run.timings),
                          attempts=e.attempts, log=run.options.log_name, custom_functions=customs)
        return run.but(outcome=outcome, stopped=True)
    run = run.timed(export=time.perf_counter() - t).but(candidates=found if ex.exporter == "auto" else None)
    return _exported(run, result, customs)


def _exported(run: Run, result: ExportResult, customs: tuple = ()) -> Run:
    """``run`` with ``result`` as its export, and the outcome that says how it was made."""
    loaded = run.loaded
    diags: list[Diagnostic] = list(loaded.diagnostics) + explain.static_traps(loaded)
    explained = explain.explain_attempts(result.attempts, loaded, failed=False)
    kept = next((a for a in result.attempts if a.ok and a.exporter == result.exporter and not a.frozen
                 and not a.unproven), None)
    if kept is not None and (kept.exporter in CONTROL_FLOW or any(a.unproven for a in result.attempts)):
        explained = [dataclasses.replace(d, severity="info") for d in explained]  # a later strategy made up for it
    diags.extend(explained)
    diags.extend(result.diagnostics)
    diags.extend(explain.lost_control_flow(result, loaded))
    return run.but(result=result, outcome=Outcome(loaded, run.options.command, tuple(diags), dict(run.timings),
                                                  custom_functions=customs))


def _adopt(run: Run) -> Run:
    """The user's ONNX file taken as the export to prove (it stays where it is)."""
    path = run.source_file
    model = read_graph(path)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    result = ExportResult(path, "external", int(opset), 0.0, (), bool(external_data_files(path)))
    diags = tuple(run.loaded.diagnostics) + tuple(explain.static_traps(run.loaded))
    return run.but(result=result, outcome=Outcome(run.loaded, run.options.command, diags, dict(run.timings)))


def _prove(run: Run) -> Run:
    """check + parity (+ localization on failure) of the export and its proof on the samples; with ``auto``, a
    file that is not proven sends the chain on to its next strategy, and the first proven file is kept (none
    proven: the first one tried, with its proof). When none is, and onnxport made up ranges of sizes for the
    model (a torchvision/timm name, a guessed image), the chain runs once more with those sizes fixed
    (:func:`at_fixed_sizes`, a ``range-fixed`` warning), kept if proven. A new export is moved into OUT as
    model.onnx when proven, else model.unverified.onnx. A family with hooks proves its export its own way
    (families.steps)."""
    if run.hooks is not None:
        return family_steps.prove(run)
    trial = _first_proven(run)
    if not trial.proven and run.options.export.exporter == "auto" and run.source_file is None \
            and _worth_another_export(trial) \
            and (fixed := at_fixed_sizes(trial.loaded, _why_unproven(trial))) is not None:
        aside = run.work / "unproven-ranges.onnx"  # the chain below writes model.onnx again
        if trial.result.path != aside:
            move_model(trial.result.path, aside)
        trial = trial.but(result=dataclasses.replace(trial.result, path=aside))
        run.progress("no export proven over the made-up ranges: exporting at fixed sizes")
        again = _export(run.but(loaded=fixed, timings={}))
        if not again.stopped:
            retried = _first_proven(again, fail_fast=True)
            if retried.proven:  # the seconds and attempts of both rounds
                remove_model(aside)
                spent = {k: trial.timings.get(k, 0.0) + retried.timings.get(k, 0.0)
                         for k in {**trial.timings, **retried.timings}}
                both = dataclasses.replace(retried.result, attempts=(*(
                    a if a.unproven or not a.ok else dataclasses.replace(a, unproven=_why_unproven(trial))
                    for a in trial.result.attempts), *retried.result.attempts))
                trial = retried.but(timings=spent, result=both,
                                    outcome=retried.outcome.but(timings=spent, export=both))
    run = trial
    run = run.but(outcome=run.outcome.but(diagnostics=(*run.outcome.diagnostics, *_retried(run))))
    if run.source_file is None:
        final = run.out / ("model.onnx" if run.proven else "model.unverified.onnx")
        move_model(run.result.path, final)
        return run.but(model_file=final, outcome=run.outcome.but(model_path=final.name))
    return run.but(model_file=run.result.path, outcome=run.outcome.but(model_path=str(run.result.path)))


def _first_proven(run: Run, fail_fast: bool = False) -> Run:
    """The proof of ``run``'s export; with ``auto``, a file that is not proven sends the chain on to its next
    strategy, and the first proven file is kept (none proven: the first one tried, with its proof). PyTorch's
    outputs are computed once for all the files; each file after the first (every one with ``fail_fast``: a
    round whose unproven files are dropped) is proven up to its first failing case only."""
    first: Run | None = None
    while True:
        trial = _proof_of(run, localize_failure=first is None and not fail_fast,
                          known=first.references if first is not None else None,
                          fail_fast=fail_fast or first is not None)
        if trial.proven or run.candidates is None or not _worth_another_export(trial, whole=first is None
                                                                                    and not fail_fast):
            if not trial.proven and first is not None:  # the file proven over every case is the one reported
                trial = first.but(result=dataclasses.replace(first.result, attempts=trial.result.attempts))
                trial = trial.but(outcome=trial.outcome.but(export=trial.result))
            break
        why = _why_unproven(trial)
        if first is None:
            kept = run.work / "first-unproven.onnx"
            move_model(trial.result.path, kept)
            first = trial.but(result=dataclasses.replace(trial.result, path=kept))
        run.progress(f"the {trial.result.exporter} export is not proven ({why}): trying the next exporter")
        t = time.perf_counter()
        try:
            result = run.candidates.send(why)
        except StopIteration as stop:
            trial = first.but(result=dataclasses.replace(first.result, attempts=stop.value or first.result.attempts))
            trial = trial.but(outcome=trial.outcome.but(export=trial.result))
            break
        spent = {"export": trial.timings.get("export", 0.0) + time.perf_counter() - t}
        run = _exported(run.but(timings={**trial.timings, **spent}), result, run.outcome.custom_functions)
    if run.candidates is not None:
        run.candidates.close()
    return trial.but(candidates=None)


def _proof_of(run: Run, localize_failure: bool = True, known: Refs | None = None, fail_fast: bool = False) -> Run:
    """The proof of ``run``'s export: check, parity, the samples (``known``, ``fail_fast``: check_and_compare)."""
    outcome, refs = check_and_compare(run, list(run.outcome.diagnostics), localize_failure, known, fail_fast)
    outcome = outcome.but(log=run.options.log_name, stage_seconds=run.outcome.stage_seconds,
                          custom_functions=run.outcome.custom_functions)
    return _prove_samples(run.but(loaded=outcome.loaded, outcome=outcome, references=refs,
                                  timings=dict(outcome.timings)))


def _worth_another_export(run: Run, whole: bool = True) -> bool:
    """Whether another exporter could do better than this unproven file: not when every case fails by rounding
    alone (reduced precision; ``whole``: the proof ran every case, not up to its first failure) or PyTorch itself
    fails on the cases that fail."""
    o = run.outcome
    if whole and any(d.code in ("reduced-precision", "cannot-tell") and d.severity == "error" for d in o.diagnostics):
        return False  # rounding alone, or references that cannot tell: another exporter changes nothing
    failed = [r for r in (o.parity.cases if o.parity else ()) if not r.passed]
    return not failed or any(r.failure is not Failure.TORCH for r in failed)


def _why_unproven(run: Run) -> str:
    """Why a proof failed, in a line: its first error."""
    o = run.outcome
    first = next((d for d in o.diagnostics if d.severity == "error"), None)
    if first is not None:
        return one_line(first.message, 200)
    passed = sum(r.passed for r in o.parity.cases) if o.parity else 0
    return f"{passed}/{len(o.parity.cases) if o.parity else 0} cases pass"


def _retried(run: Run) -> list[Diagnostic]:
    """An info line per other export that was made but not proven (the chain went on after it)."""
    result = run.result
    others = [a for a in result.attempts if a.unproven]
    if run.proven:
        return [info("export-retried", f"the {a.exporter} export (opset {a.opset}) was not proven ({a.unproven}); "
                     f"the {result.exporter} export tried after it is") for a in others]
    reported = next((a for a in others if a.exporter == result.exporter and a.opset == result.opset), None)
    return [info("export-retried", f"the {a.exporter} export (opset {a.opset}) was not proven either ({a.unproven})")
            for a in others if a is not reported]


def _optimize(run: Run) -> Run:
    if run.hooks is not None:
        return family_steps.optimize(run)
    opt = run.options.optimize
    run.progress("building and proving the optimized variants")
    settings = optimize.VariantOptions(names=opt.variants, tolerance=run.options.proof.tolerance, bench_seq=opt.seq,
                                       budget_s=opt.budget, device=run.device)
    made = optimize.variants(run.loaded, run.model_file, run.out, settings, progress=run.progress,
                             samples=run.sample_refs, known=run.references)
    notes = optimize.openvino.best_notes(made.best) if made.best is not None else []
    return run.but(outcome=run.outcome.but(optimized=made, diagnostics=(*run.outcome.diagnostics, *notes)))


def _bench(run: Run) -> Run:
    b = run.options.bench
    run.progress("benchmarking PyTorch against ONNX Runtime")
    paths, own = _bench_backends(run)
    measured = bench_run(run.loaded, paths, b, device=run.device, providers=run.providers(), progress=run.progress,
                         extra_backends=own)
    cache = (measured.peak or {}).get("cache_warning")
    notes = [warning("peak-cache-unusable", cache, hint="set ONNXPORT_CACHE_DIR to a writable folder")] if cache else []
    return run.but(outcome=run.outcome.but(benchmark=measured, diagnostics=(*run.outcome.diagnostics, *notes)))


def _wants_variants(run: Run) -> bool:
    return run.options.optimize.enabled and run.proven


def _wants_bench(run: Run) -> bool:
    return run.options.bench is not None and run.proven and (run.hooks is None or run.hooks.bench)


EXPORT_STAGES: tuple[Stage, ...] = (
    Stage("export", _export, timed=False), Stage("prove", _prove, checkpoint=True, timed=False),
    Stage("optimize", _optimize, checkpoint=True, applies=_wants_variants),
    Stage("bench", _bench, checkpoint=True, applies=_wants_bench),
)
ADOPTED_STAGES: tuple[Stage, ...] = (Stage("adopt", _adopt, timed=False), *EXPORT_STAGES[1:])


def _plain_options(options: Options) -> Options:
    """``options`` when the plain export takes them all (--max-length is the cached families')."""
    if options.export.max_length is not None:
        raise UsageError("--max-length applies to causal language models exported with their KV cache "
                         "(hf:DIR of a *ForCausalLM, without --input)", "drop --max-length")
    return options


FAMILY = Family("model", EXPORT_STAGES, refuse=_plain_options, device_first=True, variant_kind=optimize.MODEL,
                scratch=True)  # the plain model: any source no other family takes, or given --input


def _bench_backends(run: Run) -> tuple[dict[str, Path], list]:
    """The files the benchmark times, and the best variant as its own backend when it needs session options
    of its own (TF32, a CUDA graph, TensorRT): timed as it was proven, as serve and Triton run it."""
    extra = run.options.bench.onnx_files[1:] if run.source_file is not None else ()
    paths = {"onnxruntime": run.model_file, **{f"onnxruntime:{Path(p).stem}": Path(p) for p in extra}}
    optimized = run.outcome.optimized
    best = optimized.best if optimized is not None else None
    if best is None:
        return paths, []
    label = f"{best.backend}:best ({best.name})"
    options = best.session_options
    if options is None or options == runtime.SessionOptions.base(run.device):
        return (paths if best.name == "export" else {**paths, label: run.out / "best.onnx"}), []
    return paths, [optimize.gpu.SessionBackend(run.out / "best.onnx", optimize.open_for(options, run.out), label)]


def _prove_samples(run: Run) -> Run:
    """Every sample through PyTorch and ONNX Runtime (when ONNX Runtime loads the file): the outcome with the
    samples' proof (a failing sample is an error diagnostic), and PyTorch's outputs for the variants."""
    outcome, samples = run.outcome, run.samples
    if samples is None or outcome.parity is None or outcome.parity.load_error:
        return run
    run.progress(f"proving on the {samples.count} samples of {samples.file}")
    t = time.perf_counter()
    refs = proving_samples.references(outcome.loaded, samples)
    proof = proving_samples.check(outcome.loaded, run.result.path, refs, run.options.proof.tolerance,
                                  sess=runtime.session(run.result.path, providers=run.providers()))
    run = run.timed(samples=time.perf_counter() - t)
    outcome = outcome.but(samples=proof, diagnostics=(*outcome.diagnostics, *proving_samples.diagnostics(proof)),
                          timings=dict(run.timings))
    return run.but(outcome=outcome, sample_refs=refs)


def load_model(source: str, *, inputs: Sequence[str | InputSpec] | None = None,
               dims: Sequence[str | Dim] | None = None, model_args: dict | str | None = None,
               weights: str | None = None, task: str | None = None, trust_remote_code: bool = False,
               compare: Sequence[str] | dict[str, str] | None = None, working_sizes: bool = False,
               strict_dims: bool = False) -> LoadedModel:
    """Load a model source (the SOURCE forms of the README) into a LoadedModel; ``compare``: how parity judges
    some outputs (``NAME=KIND`` strings or a dict, see :mod:`onnxport.prove.compare`). When the model runs at
    some sizes of a dim only (multiples of 32, perfect squares, …), those sizes are kept and named in a
    ``constrained-dim`` warning; ``strict_dims`` makes that a ConstrainedDims error instead (``working_sizes``
    is the default and kept for the command lines that spell it)."""
    rules = compare if isinstance(compare, dict) else judging.parse_rules(compare)  # a typo fails before the load
    args = parse_model_args(model_args) if isinstance(model_args, str) else (model_args or {})
    loaded = load_declared(source, inputs=inputs, dims=dims, model_args=args, weights=weights, task=task,
                           trust_remote_code=trust_remote_code, strict_dims=strict_dims)
    return judging.resolve(loaded, rules)
