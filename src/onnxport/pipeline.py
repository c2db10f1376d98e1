"""The stage sequence: load → export → check → prove (→ localize) → optimize → bench, with the report
written at each checkpoint. The façades in api.py call into it."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from onnxport import decoder, diagnose, optimize, report, rootcause, runtime
from onnxport.bench import run as bench_run
from onnxport.bench import sizes_at
from onnxport.core.diagnostics import Diagnostic, error, info, warning
from onnxport.core.errors import ConstrainedDims, ExportFailed, UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import copy_model, external_data_files, move_model, read_graph
from onnxport.core.records import FP32, ExportResult, Failure, Tolerance
from onnxport.core.samples import validation_cases
from onnxport.core.spec import Dim, InputSpec, parse_dim, parse_input
from onnxport.decoder.tokenizer import save_tokenizer
from onnxport.exporters import functions
from onnxport.exporters.chain import export as run_export
from onnxport.exporters.strategies import CONTROL_FLOW
from onnxport.prove import batching, branches, localize
from onnxport.prove import compare as judging
from onnxport.prove import samples as proving_samples
from onnxport.prove.check import check
from onnxport.prove.parity import compare
from onnxport.report.build import Outcome, build_report, status_of
from onnxport.runtime import ops
from onnxport.sources import datasets, load, parse_model_args
from onnxport.sources.base import LoadedModel

RESULT_FILES = ("model.onnx", "model.onnx.data", "model.unverified.onnx", "model.unverified.onnx.data", "onnxport.log",
                "best.onnx", "report.json", "report.html", "report.md")
RESULT_DIRS = ("variants", "tokenizer")


def prepare_out(out: str | Path, force: bool) -> Path:
    """Create ``out``; refuse to overwrite earlier results unless ``force``; clear them with ``force``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file", "name a directory for the results")
    existing = [n for n in RESULT_FILES if (out / n).exists()] + [f"{d}/" for d in RESULT_DIRS if (out / d).exists()]
    if existing and not force:
        raise UsageError(f"{out} already holds results ({', '.join(existing[:3])})",
                         "pass --force to overwrite them, or choose another --out")
    make_out(out)
    for name in existing:
        target = out / name.rstrip("/")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    return out


def make_out(out: Path) -> bool:
    """Create the output folder (and its parents); True when it did not exist. A folder that cannot be
    created is a UsageError naming the reason."""
    out = Path(out)
    if out.is_dir():
        return False
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the output folder {out}: {e.strerror or type(e).__name__}",
                         "choose an --out folder in a place you can write to") from None
    return True


@contextlib.contextmanager
def output_folder(out: str | Path, force: bool) -> Iterator[Path]:
    """The output folder, checked before any slow work (earlier results kept unless ``force``; created, so
    a folder that cannot be made fails at once); removed again when the run fails before writing anything."""
    out = Path(out)
    if out.exists() and not force:
        prepare_out(out, force=False)  # earlier results: refused before the (slow) load
    created = make_out(out)
    try:
        yield out
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def use_runtime(custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu") -> None:
    """Load compiled custom-op libraries into every later ONNX Runtime session; fail early (exit 4) when
    ``device`` cannot be used here."""
    runtime.configure(device)
    for lib in custom_op_libraries or ():
        ops.add_library(lib)


def run_pipeline(source: str, out: str | Path, *, inputs=None, dims=None, model_args=None, weights=None, task=None,
              exporter: str = "auto", opset: int | None = None, tolerance: Tolerance = FP32, force: bool = False,
              trust_remote_code: bool = False, command: str | None = None, progress: Progress = noop,
              bench: dict | None = None, variants: str | Sequence[str] | None = None, seq: int | None = None,
              custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu", log_name: str | None = None,
              budget: float | None = None, compare: Sequence[str] | dict[str, str] | None = None,
              working_sizes: bool = False, samples: str | Path | None = None, tokenizer: str | Path | None = None,
              preprocess: str | None = None, max_length: int | None = None) -> dict:
    """Load ``source`` and run every stage into ``out`` (see :mod:`onnxport.api` for the arguments)."""
    use_runtime(custom_op_libraries, device)
    reading = _Samples(samples, tokenizer, preprocess)
    if decoder.wants_cache(source, task) and not inputs:  # a causal LM: exported with its KV cache
        return _run_decoder(source, out, force=force, progress=progress, opset=opset, tolerance=tolerance,
                            command=command, log_name=log_name, trust_remote_code=trust_remote_code,
                            max_length=max_length or decoder.MAX_LENGTH, variants=variants is not None)
    if max_length is not None:
        raise UsageError("--max-length applies to causal language models exported with their KV cache "
                         "(hf:DIR of a *ForCausalLM)", "drop --max-length, or give --task text-generation")
    with _loaded_into(out, force, source, progress, seq, reading, inputs=inputs, dims=dims, model_args=model_args,
                      weights=weights, task=task, trust_remote_code=trust_remote_code,
                      compare=compare, working_sizes=working_sizes) as (loaded, out, timings, given):
        work = Path(tempfile.mkdtemp(prefix=".onnxport-", dir=out))
        try:
            return _run_stages(loaded, out, work, exporter=exporter, opset=opset, tolerance=tolerance,
                               command=command, progress=progress, timings=timings, bench=bench, variants=variants,
                               seq=seq, log_name=log_name, budget=budget, samples=given)
        finally:
            shutil.rmtree(work, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class _Samples:
    """What --samples, --tokenizer and --preprocess asked for (nothing read yet)."""

    path: str | Path | None = None
    tokenizer: str | Path | None = None
    preprocess: str | None = None

    def check(self) -> None:
        """The files exist (before the slow load); options without --samples are a usage error."""
        if self.path is not None:
            datasets.check_options(self.path, self.tokenizer, self.preprocess)
        elif self.tokenizer is not None or self.preprocess is not None:
            raise UsageError("--tokenizer and --preprocess read --samples, which is not given",
                             "add --samples PATH, or drop them")

    def read(self, loaded: LoadedModel, progress: Progress) -> datasets.SampleSet | None:
        if self.path is None:
            return None
        progress(f"reading the samples in {self.path}")
        return datasets.read_samples(self.path, loaded, tokenizer=self.tokenizer, preprocess=self.preprocess)


def _run_decoder(source: str, out: str | Path, *, force: bool, progress: Progress, opset: int | None,
                 tolerance: Tolerance, command: str | None, log_name: str | None, trust_remote_code: bool,
                 max_length: int = decoder.MAX_LENGTH, variants: bool = False) -> dict:
    """A causal LM: one ONNX model with the KV cache as inputs and outputs, proven step by step and by greedy
    generation against ``model.generate`` (:mod:`onnxport.decoder`); the model's tokenizer is copied to
    OUT/tokenizer for serve's generate endpoint."""
    with _loaded_into(out, force, source, progress, None, task="text-generation",
                      trust_remote_code=trust_remote_code) as (loaded, out, timings, _):
        t = time.perf_counter()
        made = decoder.run_model(loaded.model, out, opset=opset, tolerance=tolerance, progress=progress,
                                 max_length=max_length, variants=variants,
                                 new_tokens=max(1, min(decoder.prove.NEW_TOKENS, max_length - 4)))
        timings["export_and_proof"] = time.perf_counter() - t
        diags = list(loaded.diagnostics)
        best = made.variants.best if made.variants is not None else None
        if best is not None and best.name != "export" and best.path is not None:
            copy_model(best.path, out / "best.onnx")  # what serve and triton take
        if save_tokenizer(source.split(":", 1)[1], out) is not None:  # serve's generate then takes and gives text
            diags.append(info("tokenizer-copied", "the model's tokenizer is in tokenizer/: serve's generate "
                                                  "endpoint takes and returns text"))
        outcome = decoder.to_outcome(made, loaded, command, diags, timings).but(log=log_name)
        return _write(outcome.but(diagnostics=tuple(rootcause.rank(outcome.diagnostics, outcome.parity))), out)


@contextlib.contextmanager
def _loaded_into(out: str | Path, force: bool, source: str, progress: Progress, seq: int | None,
                 reading: _Samples = _Samples(), **load_kw: Any
                 ) -> Iterator[tuple[LoadedModel, Path, dict[str, float], datasets.SampleSet | None]]:
    """The model loaded (its load time in the timings), --seq checked, the samples read and the output folder
    ready: what every run does first, inside :func:`output_folder` so a failure leaves no empty folder and
    touches no earlier result."""
    timings: dict[str, float] = {}
    reading.check()
    t0 = time.perf_counter()
    progress(f"loading {source}")
    with output_folder(out, force) as folder:
        loaded = load_model(source, **load_kw)
        timings["load"] = time.perf_counter() - t0
        _check_seq(loaded, seq)
        t0 = time.perf_counter()
        given = reading.read(loaded, progress)
        if given is not None:
            timings["samples_read"] = time.perf_counter() - t0
        yield loaded, prepare_out(folder, force), timings, given


def _check_seq(loaded: LoadedModel, seq: int | None) -> None:
    """--seq needs a token input with a dynamic length inside its declared range (fails before any work)."""
    if seq is None:
        return
    sizes = sizes_at(loaded, seq)
    for sym, d in loaded.dims.items():
        if sizes.get(sym) == seq and not d.min <= seq <= d.max:
            raise UsageError(f"--seq {seq} is outside the declared range of '{sym}' ({d.min}..{d.max})",
                             f"pick a length in {d.min}..{d.max}, or declare a wider range with -d {sym}=MIN..MAX")


def _run_stages(loaded: LoadedModel, out: Path, work: Path, *, exporter: str, opset: int | None,
                tolerance: Tolerance, command: str | None, progress: Progress, timings: dict,
                bench: dict | None = None, variants: str | Sequence[str] | None = None, seq: int | None = None,
                log_name: str | None = None, budget: float | None = None,
                samples: datasets.SampleSet | None = None) -> dict:
    diags: list[Diagnostic] = list(loaded.diagnostics) + diagnose.static_traps(loaded)
    functions.discover_loaded(loaded)  # autograd.Functions with symbolic(): reported, and exported as their ops
    progress(f"exporting ({exporter})")
    t = time.perf_counter()
    try:
        result = run_export(loaded, work / "model.onnx", exporter=exporter, opset=opset)
    except ExportFailed as e:
        timings["export"] = time.perf_counter() - t
        diags.extend(diagnose.enrich(list(e.diagnostics), loaded, ()))
        diags.extend(diagnose.explain_attempts(e.attempts, loaded, failed=True))
        diags.append(error("export-failed", e.message, hint=e.hint))
        diags = rootcause.rank(diags)
        return _write(Outcome(loaded, command, tuple(diags), dict(timings), attempts=e.attempts, log=log_name), out)
    timings["export"] = time.perf_counter() - t
    explained = diagnose.explain_attempts(result.attempts, loaded, failed=False)
    kept = next((a for a in result.attempts if a.ok and a.exporter == result.exporter and not a.frozen), None)
    if kept is not None and kept.exporter in CONTROL_FLOW:  # a strategy kept what the plain exporters could not
        explained = [dataclasses.replace(d, severity="info") for d in explained]
    diags.extend(explained)
    diags.extend(result.diagnostics)
    diags.extend(diagnose.lost_control_flow(result, loaded))
    return _prove(loaded, result, out, diags, tolerance=tolerance, command=command, progress=progress,
                  timings=timings, move_to_out=True, bench=bench, variants=variants, seq=seq, log_name=log_name,
                  budget=budget, samples=samples)


def _write(outcome: Outcome, out: Path) -> dict:
    """A checkpoint: the report built from ``outcome``, written into ``out``."""
    rep = build_report(outcome)
    report.write_all(rep, out)
    return rep


def _prove(loaded: LoadedModel, result: ExportResult, out: Path, diags: list[Diagnostic], *, tolerance: Tolerance,
           command: str | None, progress: Progress, timings: dict, move_to_out: bool, bench: dict | None = None,
           extra_files: Sequence[str | Path] = (), variants: str | Sequence[str] | None = None,
           seq: int | None = None, log_name: str | None = None, budget: float | None = None,
           samples: datasets.SampleSet | None = None) -> dict:
    """check + parity (+ localization on failure) of ``result.path`` and the proof on the samples, then the
    variants and the benchmark; the report is written after each."""
    outcome = _check_and_compare(loaded, result, diags, tolerance=tolerance, command=command, progress=progress,
                                 timings=timings)
    loaded, outcome = outcome.loaded, outcome.but(log=log_name)
    outcome, sample_refs = _prove_samples(outcome, result, samples, tolerance, progress, timings)
    ok = status_of(result, outcome.check, outcome.parity, outcome.diagnostics) == "ok"
    if move_to_out:
        final = out / ("model.onnx" if ok else "model.unverified.onnx")
        move_model(result.path, final)
        model_file, outcome = final, outcome.but(model_path=final.name)
    else:
        model_file, outcome = Path(result.path), outcome.but(model_path=str(result.path))
    rep = _write(outcome, out)
    if variants and ok:
        progress("building and proving the optimized variants")
        t = time.perf_counter()
        opt = optimize.variants(loaded, model_file, out, names=variants, tolerance=tolerance, progress=progress,
                                bench_seq=seq, budget_s=budget, device=runtime.config().device, samples=sample_refs)
        outcome = outcome.but(optimized=opt, stage_seconds={**outcome.stage_seconds,
                                                            "optimize": time.perf_counter() - t})
        rep = _write(outcome, out)
    if bench and ok:
        progress("benchmarking PyTorch against ONNX Runtime")
        t = time.perf_counter()
        paths, own = _bench_backends(outcome, model_file, out, extra_files)
        measured = bench_run(loaded, paths, progress=progress, extra_backends=own,
                             **{"io_binding": runtime.config().device == "cuda", **bench})
        outcome = outcome.but(benchmark=measured, stage_seconds={**outcome.stage_seconds,
                                                                 "bench": time.perf_counter() - t})
        rep = _write(outcome, out)
    return rep


def _bench_backends(outcome: Outcome, model_file: Path, out: Path, extra_files: Sequence[str | Path]
                    ) -> tuple[dict[str, Path], list]:
    """The files the benchmark times, and the best variant as its own backend when it needs session options
    of its own (TF32, a CUDA graph, TensorRT): timed as it was proven, as serve and Triton run it."""
    paths = {"onnxruntime": model_file, **{f"onnxruntime:{Path(p).stem}": Path(p) for p in extra_files}}
    best = outcome.optimized.best if outcome.optimized is not None else None
    if best is None:
        return paths, []
    label = f"onnxruntime:best ({best.name})"
    options = dict(best.session_options or {})
    if not options or options == optimize.gpu.base_options(runtime.config().device):
        return (paths if best.name == "export" else {**paths, label: out / "best.onnx"}), []
    return paths, [optimize.gpu.SessionBackend(out / "best.onnx", optimize.open_for(options, out), label)]


def _prove_samples(outcome: Outcome, result: ExportResult, samples: datasets.SampleSet | None,
                   tolerance: Tolerance, progress: Progress, timings: dict
                   ) -> tuple[Outcome, proving_samples.SampleRefs | None]:
    """Every sample through PyTorch and ONNX Runtime (when ONNX Runtime loads the file): the outcome with the
    samples' proof (a failing sample is an error diagnostic), and PyTorch's outputs for the variants."""
    if samples is None or outcome.parity is None or outcome.parity.load_error:
        return outcome, None
    progress(f"proving on the {samples.count} samples of {samples.file}")
    t = time.perf_counter()
    refs = proving_samples.references(outcome.loaded, samples)
    proof = proving_samples.check(outcome.loaded, result.path, refs, tolerance)
    timings["samples"] = time.perf_counter() - t
    return outcome.but(samples=proof, diagnostics=(*outcome.diagnostics, *proving_samples.diagnostics(proof)),
                       timings=dict(timings)), refs


def _check_and_compare(loaded: LoadedModel, result: ExportResult, diags: list[Diagnostic], *,
                       tolerance: Tolerance, command: str | None, progress: Progress, timings: dict) -> Outcome:
    """The proof: structural check, branch coverage, parity on the case matrix, and the localization of the
    first failing case. The returned outcome's ``loaded`` runs on the configured device."""
    progress("checking the graph")
    t = time.perf_counter()
    checked = check(result.path, loaded.inputs, loaded.dims)
    timings["check"] = time.perf_counter() - t
    diags.extend(checked.diagnostics)
    diags = diagnose.enrich(diags, loaded, result.guards)
    progress("proving parity with PyTorch")
    t = time.perf_counter()
    cases = validation_cases(loaded.dims)
    diags.extend(diagnose.runtime_traps(loaded, cases[0]))
    extra, sites = branches.cover(loaded, result.path, cases, result.guards)
    cases += extra
    placed, sess = _placed_session(result.path, checked.nodes)
    diags.extend(diagnose.placement(placed, result))
    loaded = runtime.loaded_on_device(loaded, runtime.config().device)
    with _strict_on_gpu():  # fp32 proven as fp32: TF32 off on both sides (onnxruntime's in GpuOptions)
        parity = compare(loaded, result.path, cases=cases, tolerance=tolerance, dim_checks=checked.dynamic_dims,
                         sess=sess)
    del sess
    diags.extend(diagnose.unreached_branches(sites, loaded))
    timings["parity"] = time.perf_counter() - t
    diags.extend(parity.diagnostics)
    divergence = None
    failing = [(c, r) for c, r in zip(cases, parity.cases) if not r.passed and r.failure is not Failure.TORCH]
    if failing and not parity.load_error:
        progress("localizing the divergence")
        t = time.perf_counter()
        divergence = localize.find(loaded, result.path, failing[0][0], tolerance)
        timings["localize"] = time.perf_counter() - t
        if divergence is not None:
            diags.append(diagnose.explain_divergence(divergence, loaded, diags))
    invariance = None
    if parity.passed:
        progress("each row alone against the same row inside a batch")
        invariance = batching.check(loaded, result.path, tolerance=tolerance)
        if invariance.applicable and not invariance.passed:
            diags.append(warning(
                "batch-dependent", f"a row's outputs change when it runs inside a batch of {invariance.rows} "
                f"(up to {invariance.max_abs_diff:.3g}, row {invariance.worst_row})",
                hint="the graph mixes rows (a batch statistic, a reduction over axis 0): do not batch requests "
                     "to it; onnxport serve runs each request alone"))
    diags = rootcause.rank(diags, parity, divergence)
    return Outcome(loaded, command, tuple(diags), dict(timings), export=result, check=checked, parity=parity,
                   batch_invariance=invariance if invariance is not None and invariance.applicable else None,
                   branches=tuple(sites), placement=placed, divergence=divergence,
                   divergence_module=diagnose.label(loaded, divergence.module) if divergence else None)


def _strict_on_gpu() -> contextlib.AbstractContextManager:
    return runtime.strict_fp32() if runtime.config().device == "cuda" else contextlib.nullcontext()


def _placed_session(path: Path, nodes: int) -> tuple[runtime.Placement | None, Any]:
    """The parity session on the configured device and where its nodes went (None, None when onnxruntime
    cannot load the file: parity then reports why). On the CPU every node is on the CPU (``nodes``: the
    graph's), so the session is opened once, without the verbose placement log a GPU needs."""
    cfg = runtime.config()
    chain = runtime.default_providers()
    log: list[str] = []
    try:
        if cfg.device == "cpu":
            sess = runtime.session(path, providers=chain)
            return runtime.Placement("cpu", tuple(runtime.provider_names(chain)), tuple(sess.get_providers()),
                                     {runtime.CPU: nodes}), sess
        sess = runtime.session(path, providers=chain, log_sink=log)
    except UsageError:
        return None, None
    return runtime.placement_from(sess, cfg.device, chain, "".join(log)), sess


def _as_specs(inputs: Sequence[str | InputSpec] | None) -> list[InputSpec]:
    return [i if isinstance(i, InputSpec) else parse_input(i) for i in inputs or []]


def _as_dims(dims: Sequence[str | Dim] | None) -> list[Dim]:
    return [d if isinstance(d, Dim) else parse_dim(d) for d in dims or []]


def load_model(source: str, *, inputs: Sequence[str | InputSpec] | None = None,
               dims: Sequence[str | Dim] | None = None, model_args: dict | str | None = None,
               weights: str | None = None, task: str | None = None, trust_remote_code: bool = False,
               compare: Sequence[str] | dict[str, str] | None = None, working_sizes: bool = False) -> LoadedModel:
    """Load a model source (the SOURCE forms of the README) into a LoadedModel; ``compare``: how parity judges
    some outputs (``NAME=KIND`` strings or a dict, see :mod:`onnxport.prove.compare`); ``working_sizes``: when
    the model runs at some sizes of a dim only, keep those sizes (else that is a ConstrainedDims error)."""
    rules = compare if isinstance(compare, dict) else judging.parse_rules(compare)  # a typo fails before the load
    args = parse_model_args(model_args) if isinstance(model_args, str) else (model_args or {})
    declared = _as_dims(dims)
    kw = dict(inputs=_as_specs(inputs), model_args=args, weights=weights, task=task,
              trust_remote_code=trust_remote_code)
    try:
        loaded = load(source, dims=declared, **kw)
    except ConstrainedDims as e:
        if not working_sizes:
            raise
        kept = {d.symbol: d for d in declared}
        kept.update({sym: Dim(sym, runs[0], runs[-1], sizes=runs) for sym, (runs, _) in e.probed.items()})
        loaded = load(source, dims=list(kept.values()), **kw)
        note = info("dim-constrained", f"{e.message}; proven at the sizes that run (--working-sizes)",
                    hint="the ONNX model is proven at these sizes only: feed it those")
        loaded = dataclasses.replace(loaded, diagnostics=(*loaded.diagnostics, note))
    return judging.resolve(loaded, rules)


def compare_file(source: str, onnx_path: str | Path, out: str | Path, *, inputs=None, dims=None, model_args=None,
                 weights=None, task=None, tolerance: Tolerance = FP32, force: bool = False,
                 trust_remote_code: bool = False, command: str | None = None, progress: Progress = noop,
                 bench: dict | None = None, extra_files: Sequence[str | Path] = (),
                 variants: str | Sequence[str] | None = None, seq: int | None = None,
                 custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu",
                 log_name: str | None = None, budget: float | None = None,
                 compare: Sequence[str] | dict[str, str] | None = None, working_sizes: bool = False,
                 samples: str | Path | None = None, tokenizer: str | Path | None = None,
                 preprocess: str | None = None) -> dict:
    """Prove any ONNX file (exported by onnxport or not) against the PyTorch model; localize a divergence."""
    use_runtime(custom_op_libraries, device)
    onnx_path = Path(onnx_path)
    model = read_graph(onnx_path)  # a missing or broken file fails here, before the (slow) load
    for extra in extra_files:
        read_graph(extra)
    reading = _Samples(samples, tokenizer, preprocess)
    with _loaded_into(out, force, source, progress, seq, reading, inputs=inputs, dims=dims, model_args=model_args,
                      weights=weights, task=task, trust_remote_code=trust_remote_code,
                      compare=compare, working_sizes=working_sizes) as (loaded, out, timings, given):
        if onnx_path.resolve().parent == out.resolve() and onnx_path.name in RESULT_FILES:
            raise UsageError("the ONNX file lies in --out, where results are written", "choose another --out")
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        result = ExportResult(onnx_path, "external", int(opset), 0.0, (), bool(external_data_files(onnx_path)))
        diags = list(loaded.diagnostics) + diagnose.static_traps(loaded)
        return _prove(loaded, result, out, diags, tolerance=tolerance, command=command, progress=progress,
                      timings=timings, move_to_out=False, bench=bench, extra_files=extra_files, variants=variants,
                      seq=seq, log_name=log_name, budget=budget, samples=given)
