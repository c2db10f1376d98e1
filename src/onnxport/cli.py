"""The command line: parses options, shows progress, prints results. No logic lives here."""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from onnxport.core.errors import EXIT_EXPORT_FAILED, EXIT_OK, EXIT_VALIDATION_FAILED, OnnxportError

EXIT_INTERNAL = 70
STATUS_EXIT = {"ok": EXIT_OK, "validation_failed": EXIT_VALIDATION_FAILED, "export_failed": EXIT_EXPORT_FAILED}

app = typer.Typer(
    name="onnxport", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="PyTorch to ONNX: export, prove against PyTorch on a matrix of shapes, explain every failure.",
)
err = Console(stderr=True, soft_wrap=True, highlight=False, markup=False,
              width=None if sys.stderr.isatty() else 120)


def _command_line() -> str:
    return "onnxport " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _guard(fn):
    """Turn OnnxportError into a one-line message and its exit code; never show a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OnnxportError as e:
            hint = f" Hint: {e.hint}" if e.hint else ""
            err.print(f"[bold red]error:[/] {escape(e.message)}.{escape(hint)}", markup=True)
            raise typer.Exit(e.exit_code) from None
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:  # noqa: BLE001 - last line of defence: a bug, reported in one line
            if os.environ.get("ONNXPORT_DEBUG"):
                raise
            first = " ".join(str(e).split())[:300]
            err.print(f"[bold red]internal error:[/] {type(e).__name__}: {escape(first)}. "
                      "Hint: rerun with ONNXPORT_DEBUG=1 for the traceback and report it.", markup=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper


InputOpt = Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME:DTYPE[d0,d1,...]{LO..HI}; repeatable")]
DimOpt = Annotated[list[str] | None, typer.Option("--dim", "-d", help="SYMBOL=MIN..MAX; repeatable")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="output folder")]
ArgsOpt = Annotated[str | None, typer.Option("--model-args", help="JSON object of constructor arguments")]
WeightsOpt = Annotated[str | None, typer.Option("--weights", help="state_dict (.pt/.pth) or .safetensors")]
TaskOpt = Annotated[str | None, typer.Option("--task", help="Hugging Face task, e.g. text-classification")]
ExporterOpt = Annotated[str, typer.Option(
    "--exporter", help="auto | dynamo | torchscript | cond | script (auto: dynamo, torchscript, then the control-flow "
    "strategies when those fail or freeze a branch)")]
OpsetOpt = Annotated[int | None, typer.Option("--opset", help="ONNX opset (default: newest supported, >= 17)")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")]
ForceOpt = Annotated[bool, typer.Option("--force", help="overwrite earlier results in --out")]
AtolOpt = Annotated[float, typer.Option("--atol", help="absolute tolerance (fp32 default 1e-4)")]
RtolOpt = Annotated[float, typer.Option("--rtol", help="relative tolerance (fp32 default 1e-3)")]
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="allow a Hugging Face model's own code")]
LibOpt = Annotated[list[Path] | None, typer.Option(
    "--custom-op-library", help="compiled ONNX Runtime custom-op library (.so) loaded into every session; repeatable")]
SeqOpt = Annotated[int | None, typer.Option(
    "--seq", min=1, help="sequence length of your traffic: variants are timed and the best chosen there "
                         "(default: the export size)")]


def _check_device(device: str) -> None:
    from onnxport.runtime.sessions import check_device

    check_device(device)  # exit 4 with what to install when cuda cannot be used here


def _finish(rep: dict, out: Path, as_json: bool) -> None:
    """Print the report (JSON on stdout when asked, the summary on stderr) and exit with its status code."""
    if as_json:
        print(json.dumps(rep, indent=2, default=str))
    print_report(rep, out)
    raise typer.Exit(STATUS_EXIT[rep["status"]])


def _run(which: str, source: str, out: Path, inputs, dims, model_args, weights, task, exporter, opset, device,
         as_json, force, atol, rtol, trust_remote_code, **extra) -> None:
    from onnxport import api
    from onnxport.core.records import Tolerance

    _check_device(device)
    fn = {"convert": api.convert, "export": api.export, "bench": api.benchmark, "optimize": api.optimize_file}[which]
    with err.status(f"{which} {source}") as status:
        rep = fn(source, out, inputs=inputs, dims=dims, model_args=model_args, weights=weights, task=task,
                 exporter=exporter, opset=opset, tolerance=Tolerance(atol, rtol), force=force,
                 trust_remote_code=trust_remote_code, command=_command_line(),
                 progress=lambda msg: status.update(msg), device=device, **extra)
    _finish(rep, out, as_json)


@app.command()
@_guard
def convert(source: Annotated[str, typer.Argument(help="model source, e.g. model.py:Net or torchvision:resnet18")],
            out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
            model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
            exporter: ExporterOpt = "auto", opset: OpsetOpt = None, device: DeviceOpt = "cpu",
            json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
            trust_remote_code: TrustOpt = False,
            no_bench: Annotated[bool, typer.Option("--no-bench", help="skip the short benchmark")] = False,
            variants: Annotated[str | None, typer.Option(
                "--variants", help="optimized variants to build and re-prove (default: all), e.g. slim,ort,int8")] = None,
            no_optimize: Annotated[bool, typer.Option("--no-optimize", help="skip the optimized variants")] = False,
            seq: SeqOpt = None, custom_op_library: LibOpt = None) -> None:
    """The whole pipeline: export, check, prove, optimize, benchmark; writes OUT/."""
    _run("convert", source, out, input, dim, model_args, weights, task, exporter, opset, device, json_out, force,
         atol, rtol, trust_remote_code, bench={} if no_bench else None, variants=variants, optimize=not no_optimize,
         seq=seq, custom_op_libraries=custom_op_library or [])


@app.command()
@_guard
def optimize(source: Annotated[str, typer.Argument(help="model source, e.g. torchvision:resnet18")],
             model: Annotated[Path, typer.Argument(help="the ONNX export to optimize")],
             out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
             model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
             variants: Annotated[str | None, typer.Option("--variants", help="e.g. slim,ort,fused,fp16,int8")] = None,
             json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
             trust_remote_code: TrustOpt = False, seq: SeqOpt = None, custom_op_library: LibOpt = None) -> None:
    """Build optimized variants (onnxslim, ORT offline, fusions, fp16, int8), re-prove each against PyTorch."""
    from onnxport import api
    from onnxport.core.records import Tolerance

    with err.status(f"optimize {model}") as status:
        rep = api.optimize_file(source, model, out, inputs=input, dims=dim, model_args=model_args, weights=weights,
                                task=task, variants=variants, tolerance=Tolerance(atol, rtol), force=force,
                                trust_remote_code=trust_remote_code, command=_command_line(),
                                progress=lambda msg: status.update(msg), seq=seq,
                                custom_op_libraries=custom_op_library or [])
    _finish(rep, out, json_out)


@app.command()
@_guard
def bench(source: Annotated[str, typer.Argument(help="model source, e.g. torchvision:resnet18")],
          models: Annotated[list[Path] | None, typer.Argument(help="ONNX files to time (default: export one)")] = None,
          out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
          model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
          exporter: ExporterOpt = "auto", opset: OpsetOpt = None, device: DeviceOpt = "cpu",
          batch: Annotated[list[int] | None, typer.Option("--batch", "-b", help="batch sizes (repeatable)")] = None,
          seq: Annotated[list[int] | None, typer.Option("--seq", help="sequence lengths to sweep (repeatable)")] = None,
          threads: Annotated[int | None, typer.Option("--threads", help="threads for every backend")] = None,
          seconds: Annotated[float, typer.Option("--seconds", help="time budget per size")] = 10.0,
          tune: Annotated[bool, typer.Option("--tune", help="search ONNX Runtime session options")] = False,
          compile_: Annotated[bool, typer.Option("--compile", help="also time torch.compile")] = False,
          json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
          trust_remote_code: TrustOpt = False, custom_op_library: LibOpt = None,
          io_binding: Annotated[bool, typer.Option(
              "--io-binding/--no-io-binding", help="ONNX Runtime runs through IO binding, inputs and outputs "
                                                   "on the device (default: on with --device cuda)")] = None,
          trt_fp16: Annotated[bool, typer.Option("--trt-fp16", help="TensorRT may run layers in fp16")] = False,
          trt_workspace_gb: Annotated[float, typer.Option("--trt-workspace-gb", help="TensorRT workspace")] = 2.0,
          trt_engine_cache: Annotated[Path | None, typer.Option(
              "--trt-engine-cache", help="folder where TensorRT keeps built engines")] = None) -> None:
    """Prove, then benchmark PyTorch against ONNX Runtime (percentiles, throughput, % of GEMM peak)."""
    from onnxport.runtime.sessions import GpuOptions, configure

    opts = {"batches": tuple(batch or (1, 8)), "seq_lens": tuple(seq) if seq else None, "threads": threads,
            "max_seconds": seconds, "tune_ort": tune, "compile": compile_,
            "io_binding": device == "cuda" if io_binding is None else io_binding}
    configure(device, GpuOptions(fp16=trt_fp16, trt_workspace_bytes=int(trt_workspace_gb * 1024**3),
                                 trt_engine_cache=str(trt_engine_cache) if trt_engine_cache else None))
    _run("bench", source, out, input, dim, model_args, weights, task, exporter, opset, device, json_out, force,
         atol, rtol, trust_remote_code, bench=opts, onnx_files=list(models or []),
         custom_op_libraries=custom_op_library or [])


@app.command()
@_guard
def export(source: Annotated[str, typer.Argument(help="model source, e.g. model.py:Net or torchvision:resnet18")],
           out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
           model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
           exporter: ExporterOpt = "auto", opset: OpsetOpt = None, device: DeviceOpt = "cpu",
           json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
           trust_remote_code: TrustOpt = False, custom_op_library: LibOpt = None) -> None:
    """Export + check + parity only; writes OUT/model.onnx and OUT/report.json."""
    _run("export", source, out, input, dim, model_args, weights, task, exporter, opset, device, json_out, force,
         atol, rtol, trust_remote_code, custom_op_libraries=custom_op_library or [])


@app.command()
@_guard
def compare(source: Annotated[str, typer.Argument(help="model source, e.g. model.py:Net")],
            model: Annotated[Path, typer.Argument(help="the ONNX file to prove (from any tool)")],
            out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
            model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
            json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
            trust_remote_code: TrustOpt = False, custom_op_library: LibOpt = None,
            device: DeviceOpt = "cpu") -> None:
    """Prove an existing ONNX file against the PyTorch model; localize where they part."""
    from onnxport import api
    from onnxport.core.records import Tolerance

    _check_device(device)
    with err.status(f"compare {source} {model}") as status:
        rep = api.compare_file(source, model, out, inputs=input, dims=dim, model_args=model_args, weights=weights,
                               task=task, tolerance=Tolerance(atol, rtol), force=force,
                               trust_remote_code=trust_remote_code, command=_command_line(),
                               progress=lambda msg: status.update(msg),
                               custom_op_libraries=custom_op_library or [], device=device)
    _finish(rep, out, json_out)


@app.command()
@_guard
def check(model: Annotated[Path, typer.Argument(help="an .onnx file")], json_out: JsonOpt = False) -> None:
    """Structural checks and graph summary of an ONNX file (no PyTorch model needed)."""
    from onnxport.api import check_file

    res = check_file(model)
    if json_out:
        print(json.dumps(res.to_dict(), indent=2, default=str))
    verdict = "[green]✔ valid[/]" if res.ok else f"[red]✘ invalid[/]: {escape(str(res.checker_error))}"
    err.print(f"{verdict}  {escape(str(model))}", markup=True)
    _print_summary(res.to_dict())
    for d in res.diagnostics:
        err.print(f"  [yellow]{d.severity}[/] {d.code}: {escape(d.message)}", markup=True)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_VALIDATION_FAILED)


@app.command()
@_guard
def serve(path: Annotated[Path, typer.Argument(help="an output folder, a .onnx file, or a Triton-style repository")],
          host: Annotated[str, typer.Option("--host", help="address to bind (default: loopback only)")] = "127.0.0.1",
          port: Annotated[int, typer.Option("--port", help="TCP port")] = 8000,
          max_batch: Annotated[int | None, typer.Option("--max-batch", help="rows per batched run (1: off)")] = None,
          max_delay_ms: Annotated[float | None, typer.Option("--max-delay-ms", help="longest wait to fill a batch")] = None,
          max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="largest request body")] = 64.0,
          custom_op_library: LibOpt = None,
          custom_op_python: Annotated[list[Path] | None, typer.Option(
              "--custom-op-python", help="Python file registering ort_python_op implementations; repeatable")] = None,
          device: DeviceOpt = "cpu") -> None:
    """Serve models over the Open Inference Protocol v2 (KServe v2 / Triton HTTP) with dynamic batching."""
    from onnxport import api
    from onnxport.runtime import ops
    from onnxport.serve import discover, run

    api.use_runtime(custom_op_library or [], device)
    for file in custom_op_python or []:
        ops.import_implementations(file)
    discover(path)  # a bad PATH fails here, in one line, before anything starts
    err.print(f"serving {path} on http://{host}:{port}/v2 (Ctrl-C stops after in-flight requests finish)")
    try:
        run(path, host=host, port=port, max_batch=max_batch, max_delay_ms=max_delay_ms,
            max_body_bytes=int(max_body_mb * 1024 * 1024))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
@_guard
def triton(out: Annotated[Path, typer.Argument(help="an output folder (or a .onnx file)")],
           repo: Annotated[Path, typer.Option("--repo", help="the model repository to write")],
           name: Annotated[str | None, typer.Option("--name", help="model name in the repository")] = None,
           max_batch: Annotated[int, typer.Option("--max-batch", help="max_batch_size")] = 32,
           max_delay_ms: Annotated[float, typer.Option("--max-delay-ms", help="dynamic batching delay")] = 2.0,
           instances: Annotated[int, typer.Option("--instances", help="instance_group count")] = 1,
           gpu: Annotated[bool, typer.Option("--gpu", help="GPU instances and the TensorRT accelerator")] = False,
           json_out: JsonOpt = False, force: ForceOpt = False) -> None:
    """Write a Triton Inference Server model repository and a KServe InferenceService manifest."""
    from onnxport.deploy import triton_repository

    res = triton_repository(out, repo, name=name, max_batch=max_batch, max_delay_ms=max_delay_ms,
                            instance_count=instances, gpu=gpu, force=force)
    if json_out:
        print(json.dumps(res.to_dict(), indent=2, default=str))
    for key, value in res.to_dict().items():
        err.print(f"  {key:<10}{value}")


@app.command()
@_guard
def view(model: Annotated[Path, typer.Argument(help="an .onnx file")],
         port: Annotated[int, typer.Option("--port", help="TCP port")] = 8080) -> None:
    """Open the model in Netron (needs the optional extra: pip install 'onnxport[view]')."""
    from onnxport.core.errors import UsageError, missing_dependency

    if not model.is_file():
        raise UsageError(f"ONNX file not found: {model}", "check the path")
    try:
        import netron
    except ImportError:
        raise missing_dependency("netron", "view") from None
    netron.start(str(model), address=("127.0.0.1", port), browse=False)
    err.print(f"Netron shows {model} on http://127.0.0.1:{port} (Ctrl-C stops)")
    try:
        netron.wait()
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command("report")
@_guard
def report_cmd(out: Annotated[Path, typer.Argument(help="an output folder holding report.json")]) -> None:
    """Re-render report.html and report.md from OUT/report.json."""
    from onnxport import report
    from onnxport.core.errors import UsageError

    if not (out / "report.json").is_file():
        raise UsageError(f"{out} has no report.json", "point at a folder written by onnxport convert/export/compare")
    try:
        data = report.load(out)
        report.validate(data)
    except Exception as e:  # noqa: BLE001 - unreadable or off-contract JSON is the user's input problem
        raise UsageError(f"{out / 'report.json'} is not a valid onnxport report: {str(e).splitlines()[0][:200]}",
                         "re-run onnxport to write it anew") from None
    for path in report.write_all(data, out):
        err.print(f"  wrote     {path}")


@app.command()
@_guard
def doctor(json_out: JsonOpt = False) -> None:
    """Versions of torch/onnx/onnxruntime, providers, max opsets, CPU features."""
    from onnxport.environment import doctor as gather

    info = gather()
    if json_out:
        print(json.dumps(info, indent=2))
        return
    t = Table(title="onnxport doctor", show_header=False)
    for name, ver in info["packages"].items():
        t.add_row(name, ver or "not installed")
    t.add_row("python", info["python"])
    t.add_row("platform", info["platform"])
    t.add_row("providers", ", ".join(info["providers"]))
    t.add_row("cuda", "available" if info["cuda_available"] else "not available")
    t.add_row("max opset", ", ".join(f"{k} {v}" for k, v in info["max_opset"].items()))
    cpu = info["cpu"]
    t.add_row("cpu", f"{cpu['model']} ({cpu['cores']} cores)")
    t.add_row("cpu flags", " ".join(cpu["flags"]) or "-")
    err.print(t)


# --------------------------------------------------------------------------- printing


def _shape(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _print_summary(c: dict) -> None:
    err.print(f"  graph     IR {c['ir_version']} · opset {c['opset']} · {c['nodes']} nodes · "
              f"{c['initializers']} initializers · {c['parameters']:,} parameters · {c['bytes'] / 1e6:.1f} MB")
    top = ", ".join(f"{k}×{v}" for k, v in list(c["op_histogram"].items())[:8])
    err.print(f"  ops       {top}")
    for io in c["inputs"]:
        err.print(f"  input     {io['name']} {io['dtype']}{_shape(io['shape'])}")
    for io in c["outputs"]:
        err.print(f"  output    {io['name']} {io['dtype']}{_shape(io['shape'])}")


def print_report(rep: dict, out: Path) -> None:
    """The terminal summary: verdict first, then the facts that support it."""
    status = rep["status"]
    style = {"ok": "bold green", "validation_failed": "bold red", "export_failed": "bold red"}[status]
    mark = "✔" if status == "ok" else "✘"
    err.print(f"[{style}]{mark} {status}[/]  {escape(rep['summary'])}", markup=True)
    m = rep["model"]
    err.print(f"  model     {m['name']} ({m['kind']}) · {m['parameters']:,} parameters")
    exp = rep["export"]
    def mark(a: dict) -> str:
        if (a["error"] or "").startswith("not applicable"):
            return f"{a['exporter']} –"
        return f"{a['exporter']} {('✔ froze' if a.get('frozen') else '✔') if a['ok'] else '✘'} {a['seconds']:.1f}s"

    tries = ", ".join(mark(a) for a in exp["attempts"])
    err.print(f"  export    {exp['exporter'] or '-'} · opset {exp['opset'] or '-'} · attempts: {tries}")
    for a in exp["attempts"]:
        if a["error"] or a.get("frozen"):
            err.print(f"            [dim]{a['exporter']}: {escape(a['error'] or a['frozen'])}[/]", markup=True)
    if rep["check"]:
        c = rep["check"]
        err.print(f"  file      {out / exp['path'] if exp.get('path') else '-'}")
        _print_summary(c)
        by_symbol: dict[str, list[dict]] = {}
        for d in c["dynamic_dims"]:
            by_symbol.setdefault(d["symbol"], []).append(d)
        for sym, ds in by_symbol.items():
            proven = all(d["proven"] for d in ds)
            ok = "[green]proven[/]" if proven else "[red]NOT proven[/]"
            sizes = ",".join(map(str, ds[0].get("sizes_passed", [])))
            where = escape(", ".join(f"{d['input']}[{d['axis']}]" for d in ds))
            err.print(f"  dim       {escape(sym)} {ds[0]['min']}..{ds[0]['max']} ({where}) {ok} at sizes {sizes or '-'}",
                      markup=True)
    rt = rep.get("runtime")
    if rt:
        placed = ", ".join(f"{p} ({n} nodes)" for p, n in (rt.get("nodes_per_provider") or {}).items())
        err.print(f"  runtime   {rt['device']} · {placed or ', '.join(rt['providers_used'])}")
        if rt["cpu_fallback_nodes"]:
            err.print(f"[yellow]  fallback  {len(rt['cpu_fallback_nodes'])} node(s) on the CPU: "
                      f"{escape(', '.join(rt['cpu_fallback_nodes'][:8]))}[/]", markup=True)
    val = rep.get("validation")
    if val:
        t = Table(title=f"validation (atol {val['tolerance']['atol']}, rtol {val['tolerance']['rtol']})")
        for col in ("case", "sizes", "max abs err", "max rel err", "pass"):
            t.add_column(col)
        for c in val["cases"]:
            sizes = c.get("sizes") or {}
            shapes = (" ".join(f"{k}={v}" for k, v in sizes.items()) if sizes
                      else " ".join(f"{k}{_shape(v)}" for k, v in c["shapes"].items()))
            mark = "[green]✔[/]" if c["passed"] else f"[red]✘[/] {escape(c.get('error') or '')}"
            fa = "-" if c["max_abs_err"] is None else f"{c['max_abs_err']:.2e}"
            fr = "-" if c["max_rel_err"] is None else f"{c['max_rel_err']:.2e}"
            t.add_row(c.get("label", ""), shapes, fa, fr, Text.from_markup(mark))
        err.print(t)
        for b in val.get("branches") or []:
            seen = b.get("sides") or {f"{k} iterations": v for k, v in (b.get("trip_counts") or {}).items()}
            what = "; ".join(f"{k} on '{v}'" for k, v in seen.items() if v)
            ok = "[green]both sides[/]" if b["op"] == "If" else "[green]several trip counts[/]"
            ok = ok if b["covered"] else "[yellow]partly[/]"
            err.print(f"  {b['op']:<9} {escape(b['node'])} ({escape(b.get('module') or 'model')}) {ok}: {escape(what)}",
                      markup=True)
    if rep.get("variants"):
        at = (rep.get("best") or {}).get("timed_at") or {}
        where = ", ".join(f"{k} {v}" for k, v in at.items())
        t = Table(title="variants (each re-proven against PyTorch" + (f"; timed at {where})" if where else ")"))
        for col in ("variant", "nodes", "MB", "max abs err", "metric", "p50 ms b1", "speedup", "verdict"):
            t.add_column(col)
        for v in rep["variants"]:
            m = v.get("metric") or {}
            metric = f"{m.get('name')} {m.get('value'):.4f} (≥ {m.get('threshold')})" if m.get("value") is not None else "-"
            lat = (v.get("latency_ms") or {}).get("1")
            verdict = ("[green]✔[/]" if v["passed"] else f"[red]✘[/] {escape(str(v.get('reason') or ''))[:80]}")
            if rep.get("best") and rep["best"]["name"] == v["name"]:
                verdict += " [bold]best[/]"
            mae = v.get("max_abs_err")
            t.add_row(v["name"], str(v.get("nodes") or "-"), f"{(v.get('bytes') or 0) / 1e6:.1f}",
                      "-" if mae is None else f"{mae:.2e}", metric, "-" if lat is None else f"{lat:.2f}",
                      "-" if v.get("speedup") is None else f"{v['speedup']:.2f}×", Text.from_markup(verdict))
        err.print(t)
    b = rep.get("benchmark")
    if b and b.get("runs"):
        peak = b.get("peak_gflops")
        t = Table(title=f"benchmark ({b['threads']} threads" + (f", GEMM peak {peak:.0f} GFLOP/s)" if peak else ")"))
        for col in ("backend", "batch", "p50 ms", "p90 ms", "p99 ms", "items/s", "% peak", "speedup"):
            t.add_column(col)
        for r in b["runs"]:
            pct = r.get("peak_pct")
            sp = r.get("speedup")
            t.add_row(r["backend"], str(r["batch"]) + (f"×{r['seq']}" if r.get("seq") else ""), f"{r['p50_ms']:.2f}",
                      f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['throughput']:.1f}",
                      "-" if pct is None else f"{pct:.0f}%", "-" if sp is None else f"{sp:.2f}×")
        err.print(t)
    div = (rep.get("validation") or {}).get("divergence")
    if div and div.get("trace"):
        t = Table(title=f"where PyTorch and ONNX part (case '{div['case']}')")
        for col in ("module", "type", "ONNX node", "op", "max abs err", ""):
            t.add_column(col)
        trace = div["trace"]
        first_bad = next((i for i, e in enumerate(trace) if not e["passed"]), len(trace))
        for e in trace[max(0, first_bad - 3): first_bad + 4]:
            err_ = "-" if e["max_abs_err"] is None else f"{e['max_abs_err']:.2e}"
            t.add_row(e["module"], e["module_type"], str(e["node"]), str(e["op"]), err_,
                      Text.from_markup("[green]✔[/]" if e["passed"] else "[red]✘[/]"))
        err.print(t)
    for d in rep["diagnostics"]:
        color = {"error": "red", "warning": "yellow"}.get(d["severity"], "blue")
        where = escape(f" [{d['module']}]") if d.get("module") else ""
        err.print(f"[{color}]{d['severity']}[/] {d['code']}{where}: {escape(d['message'])}", markup=True)
        if d.get("hint") and d["severity"] != "info":
            err.print(f"    hint: {d['hint']}")
    err.print(f"  report    {out / 'report.json'}")


def main() -> None:
    """Console-script entry point."""
    app()
