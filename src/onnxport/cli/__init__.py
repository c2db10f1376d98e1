"""The command line: parses options, shows progress, prints results. No logic lives here."""

from __future__ import annotations

import signal as _signal

# Ctrl-C while the (slow) imports below run: one line and exit 130, no traceback. main() then installs the
# handlers of a run (core.signals).
_signal.signal(_signal.SIGINT, lambda *_: (print("interrupted", file=__import__("sys").stderr),
                                           __import__("os")._exit(130)))

import contextlib
import functools
import json
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from onnxport.cli import helptexts
from onnxport.cli.groups import (
    Output,
    bench_group,
    convert_optimize_group,
    export_group,
    load_group,
    optimize_group,
    output_group,
    proof_group,
    runtime_group,
    takes,
)
from onnxport.cli.render import err, print_report, print_summary
from onnxport.core import exits, signals
from onnxport.core.errors import (
    EXIT_EXPORT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VALIDATION_FAILED,
    DiskFull,
    OnnxportError,
    disk_full,
    one_line,
)
from onnxport.core.logs import LibraryLog
from onnxport.core.options import (
    BenchOptions,
    ExportOptions,
    LoadOptions,
    OptimizeOptions,
    ProofOptions,
    RuntimeOptions,
)

EXIT_INTERNAL = 70
STATUS_EXIT = {"ok": EXIT_OK, "validation_failed": EXIT_VALIDATION_FAILED, "export_failed": EXIT_EXPORT_FAILED}

app = typer.Typer(
    name="onnxport", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, cls=helptexts.Group,
    help="PyTorch to ONNX: export, prove against PyTorch on a matrix of shapes, explain every failure.",
    epilog=helptexts.examples("onnxport convert torchvision:resnet18 -o out/resnet18", "onnxport serve out/resnet18",
                              "onnxport COMMAND --help   # every option of a command, grouped"),
)
LOG_NAME = "onnxport.log"  # what the libraries printed during a run, beside report.json


def _command_line() -> str:
    return "onnxport " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _guard(fn):
    """Turn OnnxportError into a one-line message and its exit code; never show a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with exits.trapped():
                return fn(*args, **kwargs)
        except OnnxportError as e:
            hint = f" Hint: {e.hint}" if e.hint else ""
            err.print(f"[bold red]error:[/] {escape(e.message)}.{escape(hint)}", markup=True)
            raise typer.Exit(e.exit_code) from None
        except typer.Exit:
            raise
        except SystemExit as e:  # sys.exit() or os._exit() in the model's own code: not a result
            call = "os._exit" if isinstance(e, exits.ProcessExit) else "sys.exit"
            err.print(f"[bold red]error:[/] the model's code called {call}({escape(str(e.code))}) while onnxport "
                      f"ran it. Hint: remove the {call}() from the module or forward(); nothing was written.",
                      markup=True)
            raise typer.Exit(EXIT_USAGE) from None
        except signals.Stopped as e:
            err.print(e.word)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:  # noqa: BLE001 - last line of defence: a bug, reported in one line
            if signals.pending() is not None:  # a library turned the signal's exception into its own error
                stopped = signals.Stopped(signals.pending())
                err.print(stopped.word)
                raise typer.Exit(stopped.exit_code) from None
            if disk_full(e):
                full = DiskFull()
                err.print(f"[bold red]error:[/] {escape(full.message)}. Hint: {escape(full.hint)}", markup=True)
                raise typer.Exit(full.exit_code) from None
            if os.environ.get("ONNXPORT_DEBUG"):
                raise
            err.print(f"[bold red]internal error:[/] {type(e).__name__}: {escape(one_line(e))}. "
                      "Hint: rerun with ONNXPORT_DEBUG=1 for the traceback and report it.", markup=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper


JsonOpt = Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout",
                                        rich_help_panel=helptexts.OUTPUT)]
ForceOpt = Annotated[bool, typer.Option("--force", help="overwrite earlier results in --repo",
                                         rich_help_panel=helptexts.OUTPUT)]
_serving = functools.partial(typer.Option, rich_help_panel=helptexts.SERVING)
_limits = functools.partial(typer.Option, rich_help_panel=helptexts.LIMITS)
_runtime = functools.partial(typer.Option, rich_help_panel=helptexts.RUNTIME)
_output = functools.partial(typer.Option, rich_help_panel=helptexts.OUTPUT)
SourceArg = Annotated[str, typer.Argument(help="model source, e.g. model.py:Net or torchvision:resnet18")]


def _quietly(label: str, call, out: Path, as_json: bool) -> None:
    """Run ``call(progress)`` with what the libraries print sent to OUT/onnxport.log (the terminal shows
    onnxport's own lines only), then print the report and exit with its status."""
    log = LibraryLog()
    terminal = getattr(err, "_file", None)  # None: rich writes to sys.stderr as it is at each write (restored so)
    rep: dict | None = None
    try:
        with log:
            err.file = log.terminal
            with err.status(label) as status:
                rep = call(lambda msg: status.update(msg))
            signals.settle()  # OUT is committed: a signal from here on leaves the run's status (and the log) as is
            if as_json:
                print(json.dumps(rep, indent=2, default=str), file=log.stdout, flush=True)
            print_report(rep, out)
    finally:
        err.file = terminal
        if rep is not None and (out / "report.json").is_file():
            log.keep(out / LOG_NAME)  # a run that wrote its results keeps the log beside them
        log.discard()
    raise typer.Exit(STATUS_EXIT[rep["status"]])


def _options(output: Output, source: str, onnx_files: tuple[Path, ...] = (), **families):
    """The run's one options record, checked before any work (a bad value is exit 2 at once), then the device,
    the ONNX files the command reads (missing: exit 2), the output folder (a file, earlier results without
    --force: exit 2) and the file of a ``file.py:Name`` source, in the pipeline's order. On the CPU all of it
    before the command imports torch."""
    from onnxport.core.onnxfile import external_threshold, onnx_file
    from onnxport.core.options import Options
    from onnxport.core.outdir import check_out
    from onnxport.runtime import check_device
    from onnxport.runtime.environment import forced_cpu_flags
    from onnxport.sources import check_files

    forced_cpu_flags()  # the environment variables onnxport reads, named where they are wrong
    external_threshold()
    options = Options(**families, force=output.force, command=_command_line(), log_name=LOG_NAME).checked()
    check_device(options.runtime.device)  # --device cuda where it cannot run: exit 4, as the pipeline says first
    for file in onnx_files:
        onnx_file(file)
    check_out(output.out, output.force)
    check_files(source)  # a file.py:Name whose file is missing
    return options


@app.command(cls=helptexts.Command, epilog=helptexts.CONVERT, rich_help_panel=helptexts.PROVE_COMMANDS)
@_guard
@takes(output=output_group, load=load_group, export=export_group, proof=proof_group,
       optimize=convert_optimize_group, runtime=runtime_group)
def convert(source: SourceArg, output: Output, load: LoadOptions, export: ExportOptions, proof: ProofOptions,
            optimize: OptimizeOptions, runtime: RuntimeOptions,
            no_bench: Annotated[bool, typer.Option(
                "--no-bench", help="skip the short benchmark", rich_help_panel=helptexts.BENCHMARK)] = False,
            no_optimize: Annotated[bool, typer.Option(
                "--no-optimize", help="skip the optimized variants", rich_help_panel=helptexts.OPTIMIZE)] = False,
            ) -> None:
    """The whole pipeline: export, check, prove, optimize, benchmark; writes OUT/."""
    options = _options(output, source, load=load, export=export, proof=proof, optimize=optimize, runtime=runtime)
    from onnxport import api  # after the options are checked: a bad value is refused before torch loads

    _quietly(f"convert {source}", lambda progress: api.convert(
        source, output.out, options=options, bench={} if no_bench else None, optimize=not no_optimize,
        progress=progress), output.out, output.json)


@app.command(cls=helptexts.Command, epilog=helptexts.OPTIMIZE_EXAMPLES, rich_help_panel=helptexts.PROVE_COMMANDS)
@_guard
@takes(output=output_group, load=load_group, proof=proof_group, optimize=optimize_group, runtime=runtime_group)
def optimize(source: SourceArg, model: Annotated[Path, typer.Argument(help="the ONNX export to optimize")],
             output: Output, load: LoadOptions, proof: ProofOptions, optimize: OptimizeOptions,
             runtime: RuntimeOptions) -> None:
    """Build optimized variants (onnxslim, ORT offline, fusions, fp16, int8), re-prove each against PyTorch."""
    options = _options(output, source, (model,), load=load, proof=proof, optimize=optimize, runtime=runtime)
    from onnxport import api  # after the options are checked: a bad value is refused before torch loads

    _quietly(f"optimize {model}", lambda progress: api.optimize_file(
        source, model, output.out, options=options, progress=progress), output.out, output.json)


@app.command(cls=helptexts.Command, epilog=helptexts.BENCH, rich_help_panel=helptexts.PROVE_COMMANDS)
@_guard
@takes(output=output_group, load=load_group, export=export_group, proof=proof_group, bench=bench_group,
       runtime=runtime_group)
def bench(source: SourceArg,
          models: Annotated[list[Path] | None, typer.Argument(help="ONNX files to time (default: export one)")] = None,
          *, output: Output, load: LoadOptions, export: ExportOptions, proof: ProofOptions, bench: BenchOptions,
          runtime: RuntimeOptions) -> None:
    """Prove, then benchmark PyTorch against ONNX Runtime (percentiles, throughput, % of GEMM peak)."""
    options = _options(output, source, tuple(models or ()), load=load, export=export, proof=proof, bench=bench,
                       runtime=runtime)
    from onnxport import api  # after the options are checked: a bad value is refused before torch loads

    _quietly(f"bench {source}", lambda progress: api.benchmark(
        source, output.out, onnx_files=list(models or []), options=options, progress=progress),
        output.out, output.json)


@app.command(cls=helptexts.Command, epilog=helptexts.EXPORT_EXAMPLES, rich_help_panel=helptexts.PROVE_COMMANDS)
@_guard
@takes(output=output_group, load=load_group, export=export_group, proof=proof_group, runtime=runtime_group)
def export(source: SourceArg, output: Output, load: LoadOptions, export: ExportOptions, proof: ProofOptions,
           runtime: RuntimeOptions) -> None:
    """Export + check + parity only; writes OUT/model.onnx and OUT/report.json."""
    options = _options(output, source, load=load, export=export, proof=proof, runtime=runtime)
    from onnxport import api  # after the options are checked: a bad value is refused before torch loads

    _quietly(f"export {source}", lambda progress: api.export(source, output.out, options=options, progress=progress),
             output.out, output.json)


@app.command(cls=helptexts.Command, epilog=helptexts.COMPARE, rich_help_panel=helptexts.PROVE_COMMANDS)
@_guard
@takes(output=output_group, load=load_group, proof=proof_group, runtime=runtime_group)
def compare(source: Annotated[str, typer.Argument(help="model source, e.g. model.py:Net")],
            model: Annotated[Path, typer.Argument(help="the ONNX file to prove (from any tool)")],
            output: Output, load: LoadOptions, proof: ProofOptions, runtime: RuntimeOptions) -> None:
    """Prove an existing ONNX file against the PyTorch model; localize where they part."""
    options = _options(output, source, (model,), load=load, proof=proof, runtime=runtime)
    from onnxport import api  # after the options are checked: a bad value is refused before torch loads

    _quietly(f"compare {source} {model}", lambda progress: api.compare_file(
        source, model, output.out, options=options, progress=progress), output.out, output.json)


@app.command(cls=helptexts.Command, epilog=helptexts.CHECK, rich_help_panel=helptexts.INSPECT_COMMANDS)
@_guard
def check(model: Annotated[Path, typer.Argument(help="an .onnx file")], json_out: JsonOpt = False) -> None:
    """Structural checks and graph summary of an ONNX file (no PyTorch model needed)."""
    from onnxport.prove.check import check as check_file  # what api.check_file runs, without torch

    res = check_file(model)
    if json_out:
        print(json.dumps(res.to_dict(), indent=2, default=str))
    verdict = "[green]✔ valid[/]" if res.ok else f"[red]✘ invalid[/]: {escape(str(res.checker_error))}"
    err.print(f"{verdict}  {escape(str(model))}", markup=True)
    print_summary(res.to_dict())
    for d in res.diagnostics:
        err.print(f"  [yellow]{d.severity}[/] {d.code}: {escape(d.message)}", markup=True)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_VALIDATION_FAILED)


@app.command(cls=helptexts.Command, epilog=helptexts.SERVE, rich_help_panel=helptexts.DEPLOY_COMMANDS)
@_guard
@takes(runtime=runtime_group)
def serve(path: Annotated[Path, typer.Argument(help="an output folder, a .onnx file, or a Triton-style repository")],
          host: Annotated[str, _serving("--host", help="address to bind (default: loopback only)")] = "127.0.0.1",
          port: Annotated[int, _serving("--port", min=1, max=65535, help="TCP port")] = 8000,
          max_batch: Annotated[int | None, _serving("--max-batch", help="rows per batched run (1: off)")] = None,
          max_delay_ms: Annotated[float | None, _serving("--max-delay-ms", help="longest wait to fill a batch")] = None,
          max_body_mb: Annotated[float, _limits("--max-body-mb", help="largest request body (HTTP) or message (gRPC)")] = 64.0,
          name: Annotated[str | None, _serving(
              "--name", help="the served model's name (default: the output folder's or file's name)")] = None,
          grpc_port: Annotated[int | None, _serving(
              "--grpc-port", min=1, max=65535, help="also serve Triton gRPC on this port (same host; default: off)")] = None,
          header_timeout_s: Annotated[float, _limits(
              "--header-timeout-s", help="HTTP: longest a request's headers may take to arrive")] = 10.0,
          body_timeout_s: Annotated[float, _limits(
              "--body-timeout-s", help="HTTP: longest a request's body may take to arrive, after its headers")] = 60.0,
          idle_timeout_s: Annotated[float, _limits(
              "--idle-timeout-s", help="HTTP: longest a connection may stay open with no request under way")] = 5.0,
          custom_op_python: Annotated[list[Path] | None, _runtime(
              "--custom-op-python", metavar="FILE.py", help="Python file registering ort_python_op implementations; repeatable")] = None,
          *, runtime: RuntimeOptions) -> None:
    """Serve models over the Open Inference Protocol v2 (KServe v2 / Triton HTTP and gRPC), dynamic batching."""
    from onnxport import pipeline
    from onnxport.core.errors import UsageError
    from onnxport.runtime import ops
    from onnxport.serve import ServeOptions, Timeouts, check_limits, discover, listen, require_grpc, run

    # every option is checked before anything is loaded or started
    check_limits(max_batch=max_batch, max_delay_ms=max_delay_ms, max_body_bytes=max_body_mb * 2**20, flags=True)
    timeouts = Timeouts(header_timeout_s, body_timeout_s, idle_timeout_s).checked()
    if grpc_port is not None:
        require_grpc()  # a missing extra fails in one line, before anything starts
        if grpc_port == port:
            raise UsageError(f"--grpc-port {grpc_port} is the HTTP --port too", "give gRPC a port of its own")
    pipeline.use_runtime(runtime)
    for file in custom_op_python or []:
        ops.import_implementations(file)
    discover(path, name)  # a bad PATH fails here, in one line, before anything starts
    sock = listen(host, port)  # so does a port that is taken
    if grpc_port is not None:
        listen(host, grpc_port).close()  # and the gRPC one
    where = '[' + host + ']' if ':' in host else host
    base = f"http://{where}:{port}"

    def loaded(app) -> None:  # printed only once every model has loaded
        err.print(f"serving {path} on {base}/v2 (Ctrl-C or SIGTERM stops after in-flight requests finish)")
        if grpc_port is not None:
            err.print(f"  gRPC (KServe v2 / Triton inference.GRPCInferenceService) on {where}:{grpc_port}")
        for m in app.state.models.values():
            err.print(f"  model {m.name!r} ({m.source.onnx_path.name}): POST {base}/v2/models/{m.name}/infer")
            for line in m.usage(base):  # the extensions it answers (a decoder's generate)
                err.print(line)
            if m.source.batching_off:
                err.print(f"    batching off: {m.source.batching_off}")

    try:
        run(path, ServeOptions(host=host, port=port, max_batch=max_batch, max_delay_ms=max_delay_ms,
                               max_body_bytes=int(max_body_mb * 2**20), name=name, grpc_port=grpc_port,
                               timeouts=timeouts), sock=sock, runtime=runtime, on_loaded=loaded)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command(cls=helptexts.Command, epilog=helptexts.TRITON, rich_help_panel=helptexts.DEPLOY_COMMANDS)
@_guard
def triton(out: Annotated[Path, typer.Argument(help="an output folder (or a .onnx file)")],
           repo: Annotated[Path, _output("--repo", help="the model repository to write")],
           name: Annotated[str | None, _output("--name", help="model name in the repository")] = None,
           max_batch: Annotated[int, _serving("--max-batch", help="max_batch_size")] = 32,
           max_delay_ms: Annotated[float, _serving("--max-delay-ms", help="dynamic batching delay")] = 2.0,
           instances: Annotated[int, _serving("--instances", help="instance_group count")] = 1,
           gpu: Annotated[bool, _serving("--gpu", help="GPU instances and the TensorRT accelerator")] = False,
           json_out: JsonOpt = False, force: ForceOpt = False) -> None:
    """Write a Triton Inference Server model repository and a KServe InferenceService manifest."""
    from onnxport.core.errors import UsageError
    from onnxport.serve import check_limits
    from onnxport.serve.models import check_model_name, check_repository_folder
    from onnxport.serve.repository import triton_repositories

    # every option is checked before the model is read
    check_limits(max_batch=max_batch, max_delay_ms=max_delay_ms, flags=True)
    if instances < 1:
        raise UsageError(f"--instances must be at least 1, got {instances}", "pass the number of model instances")
    if name is not None:
        check_model_name(name)
    check_repository_folder(repo, out)
    try:
        written = triton_repositories(out, repo, name=name, max_batch=max_batch, max_delay_ms=max_delay_ms,
                                      instance_count=instances, gpu=gpu, force=force)
    except OSError as e:
        if disk_full(e):
            raise
        raise UsageError(f"cannot write the repository in {repo}: {one_line(e)}",
                         "pass a folder you can write to") from None
    if json_out:  # one entry: its object, as always; a model made of several: one object per entry
        dicts = [res.to_dict() for res in written]
        print(json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2, default=str))
    for res in written:
        for key, value in res.to_dict().items():
            if key != "warnings":
                err.print(f"  {key:<10}{value}")
        for warning in res.warnings:  # the versions the model's environment needs cannot work together
            err.print(f"[yellow]warning:[/] {escape(warning)}", markup=True)


@app.command(cls=helptexts.Command, epilog=helptexts.VIEW, rich_help_panel=helptexts.INSPECT_COMMANDS)
@_guard
def view(model: Annotated[Path, typer.Argument(help="an .onnx file")],
         port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port")] = 8080) -> None:
    r"""Open the model in Netron (needs the optional extra: pip install 'onnxport\[view]')."""
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


@app.command("report", cls=helptexts.Command, epilog=helptexts.REPORT,
             rich_help_panel=helptexts.INSPECT_COMMANDS)
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


@app.command(cls=helptexts.Command, epilog=helptexts.DOCTOR, rich_help_panel=helptexts.INSPECT_COMMANDS)
@_guard
def doctor(json_out: JsonOpt = False) -> None:
    """Versions of torch/onnx/onnxruntime, providers, max opsets, CPU features."""
    from onnxport.diagnose.machine import doctor as gather

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
    t.add_row("gpu libraries", info["gpu_libraries_summary"])
    for line in info["providers_unloadable"]:
        t.add_row("unloadable", line)
    t.add_row("cuda", "available" if info["cuda_available"] else "not available")
    t.add_row("max opset", ", ".join(f"{k} {v}" for k, v in info["max_opset"].items()))
    cpu = info["cpu"]
    t.add_row("cpu", f"{cpu['model']} ({cpu['cores']} cores)")
    t.add_row("cpu flags", " ".join(cpu["flags"]) or "-")
    err.print(t)


# --------------------------------------------------------------------------- printing








def main() -> None:
    """Console-script entry point. Usage mistakes (unknown options, bad values, a missing argument) are
    answered in one line with exit 2, like every other bad input."""
    signals.install()
    try:
        code = app(standalone_mode=False)
    except _USAGE_ERROR as e:
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            err.print(ctx.get_help())
        else:
            where = f"onnxport {ctx.info_name} --help" if ctx is not None and ctx.parent is not None else "onnxport --help"
            message = " ".join(e.format_message().split()).rstrip(".")
            err.print(f"[bold red]error:[/] {escape(message)}. Hint: see '{where}'.", markup=True)
        code = EXIT_USAGE
    except typer.Abort:
        err.print("interrupted")
        code = 130
    except signals.Stopped as e:
        err.print(e.word)
        code = e.exit_code
    signals.settle()  # from here a signal changes nothing: the run's status is the exit status
    _exit(code or 0)


def _exit(code: int) -> None:
    """End the process with ``code`` once the work is done, even where the user's model started a thread that
    never ends (a non-daemon thread keeps Python alive after main returns): the exit handlers run, the
    streams are flushed, and the process ends."""
    lingering = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
                 and not t.daemon]
    if not lingering:
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# Typer raises its own copy of click's UsageError for unknown options, bad values and missing arguments.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
