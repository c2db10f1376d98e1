"""Façades that string the stages together: what the CLI calls, and the public Python API."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from . import __version__, branches, custom_ops, diagnose, environment, localize, report, runtime
from .check import CheckResult, check
from .diagnostics import Diagnostic, error
from .errors import ExportFailed, UsageError
from .export import CONTROL_FLOW, ExportResult, external_data_files, move_model
from .export import export as run_export
from .parity import FP32, ParityResult, Tolerance, compare
from .samples import validation_cases
from .sources import load, parse_model_args
from .sources.base import LoadedModel
from .spec import Dim, InputSpec, parse_dim, parse_input

Progress = Callable[[str], None]
RESULT_FILES = ("model.onnx", "model.onnx.data", "model.unverified.onnx", "model.unverified.onnx.data",
                "best.onnx", "report.json", "report.html", "report.md")


def _noop(_: str) -> None:
    return None


def _as_specs(inputs: Sequence[str | InputSpec] | None) -> list[InputSpec]:
    return [i if isinstance(i, InputSpec) else parse_input(i) for i in inputs or []]


def _as_dims(dims: Sequence[str | Dim] | None) -> list[Dim]:
    return [d if isinstance(d, Dim) else parse_dim(d) for d in dims or []]


def prepare_out(out: str | Path, force: bool) -> Path:
    """Create ``out``; refuse to overwrite earlier results unless ``force``; clear them with ``force``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file", "name a directory for the results")
    existing = [n for n in RESULT_FILES if (out / n).exists()] + (["variants/"] if (out / "variants").exists() else [])
    if existing and not force:
        raise UsageError(f"{out} already holds results ({', '.join(existing[:3])})",
                         "pass --force to overwrite them, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    for name in existing:
        target = out / name.rstrip("/")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    return out


def use_runtime(custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu") -> None:
    """Load compiled custom-op libraries into every later ONNX Runtime session; fail early (exit 4) when
    ``device`` cannot be used here."""
    from . import custom_ops, runtime

    runtime.configure(device)
    for lib in custom_op_libraries or ():
        custom_ops.add_library(lib)


def load_model(source: str, *, inputs: Sequence[str | InputSpec] | None = None,
               dims: Sequence[str | Dim] | None = None, model_args: dict | str | None = None,
               weights: str | None = None, task: str | None = None, trust_remote_code: bool = False) -> LoadedModel:
    """Load a model source (see DESIGN.md SOURCE forms) into a LoadedModel."""
    args = parse_model_args(model_args) if isinstance(model_args, str) else (model_args or {})
    return load(source, inputs=_as_specs(inputs), dims=_as_dims(dims), model_args=args, weights=weights,
                task=task, trust_remote_code=trust_remote_code)


def export(source: str, out: str | Path, *, inputs: Sequence[str | InputSpec] | None = None,
           dims: Sequence[str | Dim] | None = None, model_args: dict | str | None = None,
           weights: str | None = None, task: str | None = None, exporter: str = "auto", opset: int | None = None,
           tolerance: Tolerance = FP32, force: bool = False, trust_remote_code: bool = False,
           command: str | None = None, progress: Progress = _noop, **kwargs: Any) -> dict:
    """Export, check and prove ``source``; write OUT/model.onnx and OUT/report.json. Returns the report.

    Further keywords (``device``, ``custom_op_libraries``) are those of :func:`convert`."""
    return _pipeline(source, out, inputs=inputs, dims=dims, model_args=model_args, weights=weights, task=task,
                     exporter=exporter, opset=opset, tolerance=tolerance, force=force,
                     trust_remote_code=trust_remote_code, command=command, progress=progress, **kwargs)


QUICK_BENCH = {"batches": (1, 8), "warmup": 2, "min_runs": 20, "max_seconds": 2.0}


def convert(source: str, out: str | Path, *, bench: dict | None = None, optimize: bool = True, **kwargs: Any) -> dict:
    """The whole pipeline for ``source``: export, check, prove, optimize (every variant unless ``variants``
    names some; ``optimize=False`` skips it), then a short benchmark (``bench``: options for bench.run;
    ``{}`` skips it)."""
    from . import optimize as optimize_mod

    if not optimize and kwargs.get("variants"):
        raise UsageError("--variants and --no-optimize contradict each other", "drop one of them")
    kwargs["variants"] = optimize_mod.parse_names(kwargs.get("variants")) if optimize else None
    if bench is None:
        bench = {**QUICK_BENCH, **({"seq_lens": [kwargs["seq"]]} if kwargs.get("seq") else {})}
    return _pipeline(source, out, bench=bench, **kwargs)


def benchmark(source: str, out: str | Path, *, onnx_files: Sequence[str | Path] = (), bench: dict | None = None,
              **kwargs: Any) -> dict:
    """Prove and benchmark: export ``source`` into OUT (or prove the given ONNX files against it), then time
    PyTorch against ONNX Runtime on each file. The report's ``benchmark`` holds the runs."""
    opts = dict(bench or {})
    if onnx_files:
        kwargs.pop("exporter", None)
        kwargs.pop("opset", None)
        return compare_file(source, onnx_files[0], out, bench=opts or {"batches": (1, 8)},
                            extra_files=list(onnx_files[1:]), **kwargs)
    return _pipeline(source, out, bench=opts or {"batches": (1, 8)}, **kwargs)


def _pipeline(source: str, out: str | Path, *, inputs=None, dims=None, model_args=None, weights=None, task=None,
              exporter: str = "auto", opset: int | None = None, tolerance: Tolerance = FP32, force: bool = False,
              trust_remote_code: bool = False, command: str | None = None, progress: Progress = _noop,
              bench: dict | None = None, variants: str | Sequence[str] | None = None, seq: int | None = None,
              custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu") -> dict:
    use_runtime(custom_op_libraries, device)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    progress(f"loading {source}")
    if Path(out).exists() and not force:
        prepare_out(out, force=False)  # fail fast before the (slow) load
    loaded = load_model(source, inputs=inputs, dims=dims, model_args=model_args, weights=weights, task=task,
                        trust_remote_code=trust_remote_code)
    timings["load"] = time.perf_counter() - t0
    _check_seq(loaded, seq)
    out = prepare_out(out, force)
    work = Path(tempfile.mkdtemp(prefix=".onnxport-", dir=out))
    try:
        return _run_stages(loaded, out, work, exporter=exporter, opset=opset, tolerance=tolerance,
                           command=command, progress=progress, timings=timings, bench=bench, variants=variants,
                           seq=seq)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_seq(loaded: LoadedModel, seq: int | None) -> None:
    """--seq needs a token input with a dynamic length inside its declared range (fails before any work)."""
    if seq is None:
        return
    from .bench import sizes_at

    sizes = sizes_at(loaded, seq)
    for sym, d in loaded.dims.items():
        if sizes.get(sym) == seq and not d.min <= seq <= d.max:
            raise UsageError(f"--seq {seq} is outside the declared range of '{sym}' ({d.min}..{d.max})",
                             f"pick a length in {d.min}..{d.max}, or declare a wider range with -d {sym}=MIN..MAX")


def _run_stages(loaded: LoadedModel, out: Path, work: Path, *, exporter: str, opset: int | None,
                tolerance: Tolerance, command: str | None, progress: Progress, timings: dict,
                bench: dict | None = None, variants: str | Sequence[str] | None = None, seq: int | None = None
                ) -> dict:
    diags: list[Diagnostic] = list(loaded.diagnostics) + diagnose.static_traps(loaded)
    custom_ops.discover_loaded(loaded)  # autograd.Functions with symbolic(): reported, and exported as their ops
    progress(f"exporting ({exporter})")
    t = time.perf_counter()
    try:
        result = run_export(loaded, work / "model.onnx", exporter=exporter, opset=opset)
    except ExportFailed as e:
        timings["export"] = time.perf_counter() - t
        attempts = getattr(e, "attempts", ())
        diags.extend(diagnose.enrich(list(getattr(e, "diagnostics", ())), loaded, ()))
        diags.extend(diagnose.explain_attempts(attempts, loaded, failed=True))
        diags.append(error("export-failed", e.message, hint=e.hint))
        rep = build_report(loaded, None, None, None, diags, timings, command, attempts=attempts)
        report.write_all(rep, out)
        return rep
    timings["export"] = time.perf_counter() - t
    explained = diagnose.explain_attempts(result.attempts, loaded, failed=False)
    kept = next((a for a in result.attempts if a.ok and a.exporter == result.exporter and not a.frozen), None)
    if kept is not None and kept.exporter in CONTROL_FLOW:  # a strategy kept what the plain exporters could not
        explained = [dataclasses.replace(d, severity="info") for d in explained]
    diags.extend(explained)
    diags.extend(result.diagnostics)
    diags.extend(diagnose.lost_control_flow(result, loaded))
    return _prove(loaded, result, out, diags, tolerance=tolerance, command=command, progress=progress,
                  timings=timings, move_to_out=True, bench=bench, variants=variants, seq=seq)


def _prove(loaded: LoadedModel, result: ExportResult, out: Path, diags: list[Diagnostic], *, tolerance: Tolerance,
           command: str | None, progress: Progress, timings: dict, move_to_out: bool, bench: dict | None = None,
           extra_files: Sequence[str | Path] = (), variants: str | Sequence[str] | None = None,
           seq: int | None = None) -> dict:
    """check + parity (+ localization on failure) of ``result.path``; writes the report."""
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
    placed, sess = _placed_session(result.path)
    loaded = runtime.loaded_on_device(loaded, runtime.config().device)
    parity = compare(loaded, result.path, cases=cases, tolerance=tolerance, dim_checks=checked.dynamic_dims,
                     sess=sess)
    del sess
    diags.extend(diagnose.unreached_branches(sites, loaded))
    timings["parity"] = time.perf_counter() - t
    diags.extend(parity.diagnostics)
    divergence = None
    failing = [(c, r) for c, r in zip(cases, parity.cases) if not r.passed and not (r.error or "").startswith("PyTorch")]
    if failing and not parity.load_error:
        progress("localizing the divergence")
        t = time.perf_counter()
        divergence = localize.find(loaded, result.path, failing[0][0], tolerance)
        timings["localize"] = time.perf_counter() - t
        if divergence is not None:
            diags.append(diagnose.explain_divergence(divergence, loaded, diags))
    rep = build_report(loaded, result, checked, parity, diags, timings, command)
    if rep["validation"] is not None:
        rep["validation"]["branches"] = [s.to_dict() for s in sites]
    if placed is not None:
        rep["runtime"] = placed.to_dict()
    if divergence is not None:
        rep["validation"]["divergence"] = divergence.to_dict()
        rep["validation"]["divergence"]["module"] = diagnose.label(loaded, divergence.module)
    if move_to_out:
        final = out / ("model.onnx" if rep["status"] == "ok" else "model.unverified.onnx")
        move_model(result.path, final)
        rep["export"]["path"] = final.name
    else:
        rep["export"]["path"] = str(result.path)
    report.write_all(rep, out)
    if variants and rep["status"] == "ok":
        from . import optimize

        progress("building and proving the optimized variants")
        t = time.perf_counter()
        model_file = out / rep["export"]["path"] if move_to_out else Path(result.path)
        opt = optimize.variants(loaded, model_file, out, names=variants, tolerance=tolerance, progress=progress,
                                bench_seq=seq)
        rep["variants"] = opt.to_list()
        rep["best"] = None if opt.best is None else {"name": opt.best.name, "path": "best.onnx",
                                                     "speedup": opt.best.speedup, "timed_at": opt.timed_at}
        rep["timings"]["optimize"] = round(time.perf_counter() - t, 3)
        report.write_all(rep, out)
    if bench and rep["status"] == "ok":
        from . import bench as bench_mod

        progress("benchmarking PyTorch against ONNX Runtime")
        t = time.perf_counter()
        model_file = out / rep["export"]["path"] if move_to_out else Path(result.path)
        paths = {"onnxruntime": model_file, **{f"onnxruntime:{Path(p).stem}": Path(p) for p in extra_files}}
        if rep.get("best") and rep["best"]["name"] != "export":
            paths[f"onnxruntime:best ({rep['best']['name']})"] = out / "best.onnx"
        rep["benchmark"] = bench_mod.run(loaded, paths, progress=progress, **bench).to_dict()
        rep["timings"]["bench"] = round(time.perf_counter() - t, 3)
        report.write_all(rep, out)
    return rep


def _placed_session(path: Path) -> tuple[runtime.Placement | None, Any]:
    """The parity session on the configured device and where its nodes went (None, None when onnxruntime
    cannot load the file: parity then reports why)."""
    cfg = runtime.config()
    chain = runtime.default_providers()
    log: list[str] = []
    try:
        sess = runtime.session(path, providers=chain, log_sink=log)
    except UsageError:
        return None, None
    return runtime.placement_from(sess, cfg.device, chain, "".join(log)), sess


def compare_file(source: str, onnx_path: str | Path, out: str | Path, *, inputs=None, dims=None, model_args=None,
                 weights=None, task=None, tolerance: Tolerance = FP32, force: bool = False,
                 trust_remote_code: bool = False, command: str | None = None, progress: Progress = _noop,
                 bench: dict | None = None, extra_files: Sequence[str | Path] = (),
                 variants: str | Sequence[str] | None = None, seq: int | None = None,
                 custom_op_libraries: Sequence[str | Path] = (), device: str = "cpu") -> dict:
    """Prove any ONNX file (exported by onnxport or not) against the PyTorch model; localize a divergence."""
    use_runtime(custom_op_libraries, device)
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise UsageError(f"ONNX file not found: {onnx_path}", "check the path")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    progress(f"loading {source}")
    if Path(out).exists() and not force:
        prepare_out(out, force=False)
    loaded = load_model(source, inputs=inputs, dims=dims, model_args=model_args, weights=weights, task=task,
                        trust_remote_code=trust_remote_code)
    timings["load"] = time.perf_counter() - t0
    _check_seq(loaded, seq)
    out = prepare_out(out, force)
    if onnx_path.resolve().parent == out.resolve() and onnx_path.name in RESULT_FILES:
        raise UsageError("the ONNX file lies in --out, where results are written", "choose another --out")
    model = onnx.load(str(onnx_path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    result = ExportResult(onnx_path, "external", int(opset), 0.0, (), bool(external_data_files(onnx_path)))
    diags = list(loaded.diagnostics) + diagnose.static_traps(loaded)
    for extra in extra_files:
        if not Path(extra).is_file():
            raise UsageError(f"ONNX file not found: {extra}", "check the path")
    return _prove(loaded, result, out, diags, tolerance=tolerance, command=command, progress=progress,
                  timings=timings, move_to_out=False, bench=bench, extra_files=extra_files, variants=variants,
                  seq=seq)


def optimize_file(source: str, onnx_path: str | Path, out: str | Path, *, variants: str | Sequence[str] | None = None,
                  **kwargs: Any) -> dict:
    """Prove ``onnx_path``, then build every optimized variant into OUT/variants/ and re-prove each against
    PyTorch; OUT/best.onnx is the fastest one that passed."""
    from . import optimize

    names = optimize.parse_names(variants)  # an unknown name fails before the (slow) proof
    return compare_file(source, onnx_path, out, variants=names, **kwargs)


def build_report(loaded: LoadedModel, result: ExportResult | None, checked: CheckResult | None,
                 parity: ParityResult | None, diags: list[Diagnostic], timings: dict,
                 command: str | None, attempts: Sequence = ()) -> dict:
    """The report.json dictionary (DESIGN.md contract)."""
    if result is None:
        status = "export_failed"
    elif checked is not None and checked.ok and parity is not None and parity.passed and not any(
            d.severity == "error" for d in diags):
        status = "ok"
    else:
        status = "validation_failed"
    spec_io = [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in loaded.inputs]
    rep: dict[str, Any] = {
        "onnxport_version": __version__,
        "status": status,
        "summary": "",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "model": {"source": loaded.source, "name": loaded.name, "parameters": loaded.parameters,
                  "kind": loaded.kind,
                  "dims": {k: {"min": d.min, "max": d.max, "export": d.example} for k, d in loaded.dims.items()}},
        "export": {
            "exporter": result.exporter if result else None,
            "opset": result.opset if result else None,
            "seconds": round(result.seconds if result else timings.get("export", 0.0), 3),
            "path": None,
            "external_data": bool(result.external_data) if result else False,
            "inputs": list(checked.inputs) if checked else spec_io,
            "outputs": list(checked.outputs) if checked else [{"name": n, "dtype": "unknown", "shape": None}
                                                              for n in loaded.output_names],
            "attempts": [a.to_dict() for a in (result.attempts if result else attempts)],
            "custom_ops": [f.to_dict() for f in loaded.extra.get("custom_functions", ())],
        },
        "check": None,
        "validation": None,
        "variants": [],
        "benchmark": None,
        "diagnostics": [d.to_dict() for d in diags],
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "environment": environment.summary(),
    }
    if checked is not None:
        c = checked.to_dict()
        if parity is not None:
            c["dynamic_dims"] = [d.to_dict() for d in parity.dynamic_dims]
        rep["check"] = c
    if parity is not None:
        rep["validation"] = {"passed": parity.passed, "tolerance": parity.tolerance.to_dict(),
                             "cases": [c.to_dict() for c in parity.cases], "divergence": None}
    rep["summary"] = summary_sentence(rep)
    return rep


def summary_sentence(rep: dict) -> str:
    """The verdict in one sentence."""
    status = rep["status"]
    if status == "export_failed":
        errs = [a["error"] for a in rep["export"]["attempts"] if a.get("error")]
        return "Export failed: " + (errs[-1] if errs else "no exporter produced a model") + "."
    val = rep.get("validation") or {}
    cases = val.get("cases", [])
    n_ok = sum(c["passed"] for c in cases)
    if status == "ok":
        worst = max((c["max_abs_err"] or 0.0 for c in cases), default=0.0)
        syms = list(dict.fromkeys(d["symbol"] for d in rep["check"]["dynamic_dims"]))
        dyn = f"; dynamic dims {', '.join(syms)} proven" if syms else ""
        return (f"Proven: the ONNX model matches PyTorch on {n_ok}/{len(cases)} cases "
                f"(max abs error {worst:.2e}){dyn}.")
    first = next((d for d in rep["diagnostics"] if d["severity"] == "error"), None)
    reason = first["message"] if first else "validation failed"
    return f"Not proven ({n_ok}/{len(cases)} cases pass): {reason}"


def check_file(path: str | Path) -> CheckResult:
    """Structural checks and graph summary of an ONNX file (no PyTorch needed)."""
    return check(path)
