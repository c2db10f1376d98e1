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
from rich.markup import escape
from rich.table import Table

from onnxport.cli.render import err, print_report, print_summary
from onnxport.core.errors import (
    EXIT_EXPORT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VALIDATION_FAILED,
    OnnxportError,
)
from onnxport.core.logs import LibraryLog

EXIT_INTERNAL = 70
STATUS_EXIT = {"ok": EXIT_OK, "validation_failed": EXIT_VALIDATION_FAILED, "export_failed": EXIT_EXPORT_FAILED}

app = typer.Typer(
    name="onnxport", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="PyTorch to ONNX: export, prove against PyTorch on a matrix of shapes, explain every failure.",
)
LOG_NAME = "onnxport.log"  # what the libraries printed during a run, beside report.json


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
    "--exporter", help="auto | dynamo | torchscript | cond | script | scan (auto: dynamo, torchscript, then the "
    "control-flow strategies when those fail or freeze a branch or loop; the newest opset onnxruntime can run)")]
OpsetOpt = Annotated[int | None, typer.Option("--opset", help="ONNX opset (default: newest supported, >= 17)")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")]
ForceOpt = Annotated[bool, typer.Option("--force", help="overwrite earlier results in --out")]
AtolOpt = Annotated[float, typer.Option("--atol", help="absolute tolerance (fp32 default 1e-4)")]
RtolOpt = Annotated[float, typer.Option("--rtol", help="relative tolerance (fp32 default 1e-3)")]
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="allow a Hugging Face model's own code")]
LibOpt = Annotated[list[Path] | None, typer.Option(
    "--custom-op-library", help="compiled ONNX Runtime custom-op library (.so) loaded into every session; repeatable")]
BudgetOpt = Annotated[float | None, typer.Option(
    "--budget", min=1, help="seconds for building and proving variants: none is started after that")]
CompareOpt = Annotated[list[str] | None, typer.Option(
    "--compare", help="OUTPUT=detections|topk|cosine|exact: how parity judges an output (default: exact, "
                      "detections for outputs named *boxes/*scores/*labels); repeatable")]
SizesOpt = Annotated[bool, typer.Option(
    "--working-sizes", help="when the model runs at some sizes of a dim only, prove at those (else exit 2 "
                            "listing which sizes run)")]
SamplesOpt = Annotated[Path | None, typer.Option(
    "--samples", help="your own inputs, proven one by one and used to calibrate int8: a .npz/.npy of arrays "
                      "(named after the inputs, a leading sample axis), a .txt/.jsonl of texts, or a folder of images")]
TokenizerOpt = Annotated[Path | None, typer.Option(
    "--tokenizer", help="Hugging Face tokenizer folder for --samples texts (default: the hf:DIR model's own)")]
PreprocessOpt = Annotated[str | None, typer.Option(
    "--preprocess", help="file.py:function turning a PIL image into the model's input array [C,H,W] for --samples "
                         "images (default: the transform of the torchvision/timm/Hugging Face source)")]
MaxLenOpt = Annotated[int | None, typer.Option(
    "--max-length", min=2, help="causal LMs (hf:DIR *ForCausalLM): the most tokens (prompt + generated) the exported "
                                "KV cache holds, proven up to there (default 128)")]
SeqOpt = Annotated[int | None, typer.Option(
    "--seq", min=1, help="sequence length of your traffic: variants are timed and the best chosen there "
                         "(default: the export size)")]


def _check_device(device: str) -> None:
    from onnxport.runtime.sessions import check_device

    check_device(device)  # exit 4 with what to install when cuda cannot be used here


def _quietly(label: str, call, out: Path, as_json: bool) -> None:
    """Run ``call(progress)`` with what the libraries print sent to OUT/onnxport.log (the terminal shows
    onnxport's own lines only), then print the report and exit with its status."""
    log = LibraryLog()
    terminal = err.file
    rep: dict | None = None
    try:
        with log:
            err.file = log.terminal
            with err.status(label) as status:
                rep = call(lambda msg: status.update(msg))
            if as_json:
                print(json.dumps(rep, indent=2, default=str), file=log.stdout, flush=True)
            print_report(rep, out)
    finally:
        err.file = terminal
        if rep is not None and (out / "report.json").is_file():
            log.keep(out / LOG_NAME)  # a run that wrote its results keeps the log beside them
        log.discard()
    raise typer.Exit(STATUS_EXIT[rep["status"]])


def _run(which: str, source: str, out: Path, inputs, dims, model_args, weights, task, exporter, opset, device,
         as_json, force, atol, rtol, trust_remote_code, **extra) -> None:
    from onnxport import api
    from onnxport.core.records import Tolerance

    _check_device(device)
    fn = {"convert": api.convert, "export": api.export, "bench": api.benchmark, "optimize": api.optimize_file}[which]
    _quietly(f"{which} {source}", lambda progress: fn(
        source, out, inputs=inputs, dims=dims, model_args=model_args, weights=weights, task=task,
        exporter=exporter, opset=opset, tolerance=Tolerance(atol, rtol), force=force,
        trust_remote_code=trust_remote_code, command=_command_line(), progress=progress, device=device,
        log_name=LOG_NAME, **extra), out, as_json)


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
                "--variants", help="optimized variants to build and re-prove: auto (default: those that can win for "
                                   "this model on this device), all, or a list such as slim,ort,int8")] = None,
            budget: BudgetOpt = None,
            no_optimize: Annotated[bool, typer.Option("--no-optimize", help="skip the optimized variants")] = False,
            seq: SeqOpt = None, custom_op_library: LibOpt = None, compare: CompareOpt = None,
            working_sizes: SizesOpt = False, samples: SamplesOpt = None, tokenizer: TokenizerOpt = None,
            preprocess: PreprocessOpt = None, max_length: MaxLenOpt = None) -> None:
    """The whole pipeline: export, check, prove, optimize, benchmark; writes OUT/."""
    _run("convert", source, out, input, dim, model_args, weights, task, exporter, opset, device, json_out, force,
         atol, rtol, trust_remote_code, bench={} if no_bench else None, variants=variants, optimize=not no_optimize,
         seq=seq, custom_op_libraries=custom_op_library or [], budget=budget, compare=compare,
         working_sizes=working_sizes, samples=samples, tokenizer=tokenizer, preprocess=preprocess,
         max_length=max_length)


@app.command()
@_guard
def optimize(source: Annotated[str, typer.Argument(help="model source, e.g. torchvision:resnet18")],
             model: Annotated[Path, typer.Argument(help="the ONNX export to optimize")],
             out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
             model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
             variants: Annotated[str | None, typer.Option(
                 "--variants", help="all (default), auto, or a list such as slim,ort,fused,fp16,int8")] = None,
             budget: BudgetOpt = None,
             json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
             trust_remote_code: TrustOpt = False, seq: SeqOpt = None, custom_op_library: LibOpt = None,
             compare: CompareOpt = None, working_sizes: SizesOpt = False, samples: SamplesOpt = None,
             tokenizer: TokenizerOpt = None, preprocess: PreprocessOpt = None) -> None:
    """Build optimized variants (onnxslim, ORT offline, fusions, fp16, int8), re-prove each against PyTorch."""
    from onnxport import api
    from onnxport.core.records import Tolerance

    _quietly(f"optimize {model}", lambda progress: api.optimize_file(
        source, model, out, inputs=input, dims=dim, model_args=model_args, weights=weights, task=task,
        variants=variants, tolerance=Tolerance(atol, rtol), force=force, trust_remote_code=trust_remote_code,
        command=_command_line(), progress=progress, seq=seq, custom_op_libraries=custom_op_library or [],
        log_name=LOG_NAME, budget=budget, compare=compare, working_sizes=working_sizes, samples=samples,
        tokenizer=tokenizer, preprocess=preprocess), out, json_out)


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
              "--trt-engine-cache", help="folder where TensorRT keeps built engines")] = None,
          compare: CompareOpt = None, working_sizes: SizesOpt = False, samples: SamplesOpt = None,
          tokenizer: TokenizerOpt = None, preprocess: PreprocessOpt = None) -> None:
    """Prove, then benchmark PyTorch against ONNX Runtime (percentiles, throughput, % of GEMM peak)."""
    from onnxport.runtime.sessions import GpuOptions, configure

    opts = {"batches": tuple(batch or (1, 8)), "seq_lens": tuple(seq) if seq else None, "threads": threads,
            "max_seconds": seconds, "tune_ort": tune, "compile": compile_,
            "io_binding": device == "cuda" if io_binding is None else io_binding}
    configure(device, GpuOptions(fp16=trt_fp16, trt_workspace_bytes=int(trt_workspace_gb * 1024**3),
                                 trt_engine_cache=str(trt_engine_cache) if trt_engine_cache else None))
    _run("bench", source, out, input, dim, model_args, weights, task, exporter, opset, device, json_out, force,
         atol, rtol, trust_remote_code, bench=opts, onnx_files=list(models or []),
         custom_op_libraries=custom_op_library or [], compare=compare, working_sizes=working_sizes, samples=samples,
         tokenizer=tokenizer, preprocess=preprocess)


@app.command()
@_guard
def export(source: Annotated[str, typer.Argument(help="model source, e.g. model.py:Net or torchvision:resnet18")],
           out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
           model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
           exporter: ExporterOpt = "auto", opset: OpsetOpt = None, device: DeviceOpt = "cpu",
           json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
           trust_remote_code: TrustOpt = False, custom_op_library: LibOpt = None, compare: CompareOpt = None,
           working_sizes: SizesOpt = False, samples: SamplesOpt = None, tokenizer: TokenizerOpt = None,
           preprocess: PreprocessOpt = None, max_length: MaxLenOpt = None) -> None:
    """Export + check + parity only; writes OUT/model.onnx and OUT/report.json."""
    _run("export", source, out, input, dim, model_args, weights, task, exporter, opset, device, json_out, force,
         atol, rtol, trust_remote_code, custom_op_libraries=custom_op_library or [], compare=compare,
         working_sizes=working_sizes, samples=samples, tokenizer=tokenizer, preprocess=preprocess,
         max_length=max_length)


@app.command()
@_guard
def compare(source: Annotated[str, typer.Argument(help="model source, e.g. model.py:Net")],
            model: Annotated[Path, typer.Argument(help="the ONNX file to prove (from any tool)")],
            out: OutOpt = Path("onnxport-out"), input: InputOpt = None, dim: DimOpt = None,
            model_args: ArgsOpt = None, weights: WeightsOpt = None, task: TaskOpt = None,
            json_out: JsonOpt = False, force: ForceOpt = False, atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-3,
            trust_remote_code: TrustOpt = False, custom_op_library: LibOpt = None,
            device: DeviceOpt = "cpu", compare: CompareOpt = None, working_sizes: SizesOpt = False,
            samples: SamplesOpt = None, tokenizer: TokenizerOpt = None, preprocess: PreprocessOpt = None) -> None:
    """Prove an existing ONNX file against the PyTorch model; localize where they part."""
    from onnxport import api
    from onnxport.core.records import Tolerance

    _check_device(device)
    _quietly(f"compare {source} {model}", lambda progress: api.compare_file(
        source, model, out, inputs=input, dims=dim, model_args=model_args, weights=weights, task=task,
        tolerance=Tolerance(atol, rtol), force=force, trust_remote_code=trust_remote_code,
        command=_command_line(), progress=progress, custom_op_libraries=custom_op_library or [], device=device,
        log_name=LOG_NAME, compare=compare, working_sizes=working_sizes, samples=samples, tokenizer=tokenizer,
        preprocess=preprocess), out, json_out)


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
    print_summary(res.to_dict())
    for d in res.diagnostics:
        err.print(f"  [yellow]{d.severity}[/] {d.code}: {escape(d.message)}", markup=True)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_VALIDATION_FAILED)


@app.command()
@_guard
def serve(path: Annotated[Path, typer.Argument(help="an output folder, a .onnx file, or a Triton-style repository")],
          host: Annotated[str, typer.Option("--host", help="address to bind (default: loopback only)")] = "127.0.0.1",
          port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port")] = 8000,
          max_batch: Annotated[int | None, typer.Option("--max-batch", help="rows per batched run (1: off)")] = None,
          max_delay_ms: Annotated[float | None, typer.Option("--max-delay-ms", help="longest wait to fill a batch")] = None,
          max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="largest request body (HTTP) or message (gRPC)")] = 64.0,
          name: Annotated[str | None, typer.Option(
              "--name", help="the served model's name (default: the output folder's or file's name)")] = None,
          grpc_port: Annotated[int | None, typer.Option(
              "--grpc-port", min=1, max=65535, help="also serve Triton gRPC on this port (same host; default: off)")] = None,
          custom_op_library: LibOpt = None,
          custom_op_python: Annotated[list[Path] | None, typer.Option(
              "--custom-op-python", help="Python file registering ort_python_op implementations; repeatable")] = None,
          device: DeviceOpt = "cpu") -> None:
    """Serve models over the Open Inference Protocol v2 (KServe v2 / Triton HTTP, and gRPC with --grpc-port)
    with dynamic batching."""
    from onnxport import api
    from onnxport.core.errors import UsageError
    from onnxport.runtime import ops
    from onnxport.serve import discover, listen, require_grpc, run, signature
    from onnxport.serve.generate import decoder_layout

    if grpc_port is not None:
        require_grpc()  # a missing extra fails in one line, before anything starts
        if grpc_port == port:
            raise UsageError(f"--grpc-port {grpc_port} is the HTTP --port too", "give gRPC a port of its own")
    api.use_runtime(custom_op_library or [], device)
    for file in custom_op_python or []:
        ops.import_implementations(file)
    models = discover(path, name)  # a bad PATH fails here, in one line, before anything starts
    sock = listen(host, port)  # so does a port that is taken
    if grpc_port is not None:
        listen(host, grpc_port).close()  # and the gRPC one
    where = '[' + host + ']' if ':' in host else host
    base = f"http://{where}:{port}"
    err.print(f"serving {path} on {base}/v2 (Ctrl-C or SIGTERM stops after in-flight requests finish)")
    if grpc_port is not None:
        err.print(f"  gRPC (KServe v2 / Triton inference.GRPCInferenceService) on {where}:{grpc_port}")
    for m in models:
        err.print(f"  model {m.name!r} ({m.onnx_path.name}): POST {base}/v2/models/{m.name}/infer")
        if decoder_layout(signature(m.onnx_path), m.decoder_layout) is not None:
            err.print(f"    a decoder with its KV cache: POST {base}/v2/models/{m.name}/generate and /generate_stream")
        if m.batching_off:
            err.print(f"    batching off: {m.batching_off}")
    try:
        run(path, host=host, port=port, max_batch=max_batch, max_delay_ms=max_delay_ms,
            max_body_bytes=int(max_body_mb * 1024 * 1024), name=name, sock=sock, grpc_port=grpc_port)
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
         port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port")] = 8080) -> None:
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
    sys.exit(code or 0)


# Typer raises its own copy of click's UsageError for unknown options, bad values and missing arguments.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
