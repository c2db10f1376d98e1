"""Option groups shared by every command that takes them: one function per option family, whose parameters are
the command-line options and which returns that family's record (:mod:`onnxport.core.options`). ``@takes``
adds a group's options to a command and hands the command the record, so an option is spelled, defaulted,
checked and documented once, whichever command takes it. (No ``from __future__ import annotations`` here: a
group's help texts are built when the module loads, so its annotations must be objects, not strings.)"""

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from onnxport.cli import helptexts
from onnxport.core.options import (
    BenchOptions,
    ExportOptions,
    GpuOptions,
    LoadOptions,
    OptimizeOptions,
    ProofOptions,
    RuntimeOptions,
)
from onnxport.core.records import Tolerance

# typer.Option with the --help panel its options are listed in (onnxport.cli.helptexts)
_output = functools.partial(typer.Option, rich_help_panel=helptexts.OUTPUT)
_source = functools.partial(typer.Option, rich_help_panel=helptexts.SOURCE)
_export = functools.partial(typer.Option, rich_help_panel=helptexts.EXPORT)
_proof = functools.partial(typer.Option, rich_help_panel=helptexts.PROOF)
_optimize = functools.partial(typer.Option, rich_help_panel=helptexts.OPTIMIZE)
_runtime = functools.partial(typer.Option, rich_help_panel=helptexts.RUNTIME)
_bench = functools.partial(typer.Option, rich_help_panel=helptexts.BENCHMARK)


def takes(**groups: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command so that it takes the options of each group (``name=group_function``) and receives
    the group's record under ``name``."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(fn, eval_str=True)
        params = [p for p in own.parameters.values() if p.name not in groups]
        owner: dict[str, str] = {}
        for name, group in groups.items():
            for p in inspect.signature(group, eval_str=True).parameters.values():
                if p.name in owner or p.name in own.parameters:
                    raise TypeError(f"option '{p.name}' of group '{name}' is taken twice by {fn.__name__}")
                owner[p.name] = name
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            given: dict[str, dict[str, Any]] = {name: {} for name in groups}
            for key in [k for k in kwargs if k in owner]:
                given[owner[key]][key] = kwargs.pop(key)
            return fn(*args, **kwargs, **{name: groups[name](**given[name]) for name in groups})

        command.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


# --------------------------------------------------------------------------- output


@dataclass(frozen=True)
class Output:
    """Where the results go, whether earlier ones may be overwritten, and whether stdout gets the report."""

    out: Path
    force: bool
    json: bool


def output_group(
    out: Annotated[Path, _output("--out", "-o", help="output folder")] = Path("onnxport-out"),
    force: Annotated[bool, _output("--force", help="overwrite earlier results in --out")] = False,
    json_out: Annotated[bool, _output("--json", help="print the report as JSON on stdout")] = False,
) -> Output:
    return Output(out, force, json_out)


# --------------------------------------------------------------------------- load


def load_group(
    input: Annotated[list[str] | None, _source(
        "--input", "-i", metavar="SPEC",
        help=helptexts.literal("one model input, NAME:DTYPE[d0,d1,...]{LO..HI}, e.g. 'x:float32[batch,3,224,224]'; "
                               "repeatable (default: inferred from the source where it can be)"))] = None,
    dim: Annotated[list[str] | None, _source(
        "--dim", "-d", metavar="SYMBOL=MIN..MAX",
        help="the range a dynamic dim must work over (or SYMBOL=A,B,C); repeatable")] = None,
    model_args: Annotated[str | None, _source(
        "--model-args", metavar="JSON", help="JSON object of constructor arguments")] = None,
    weights: Annotated[str | None, _source(
        "--weights", metavar="FILE", help="state_dict (.pt/.pth) or .safetensors")] = None,
    task: Annotated[str | None, _source("--task", help="Hugging Face task, e.g. text-classification")] = None,
    trust_remote_code: Annotated[bool, _source(
        "--trust-remote-code", help="allow a Hugging Face model's own code")] = False,
    compare: Annotated[list[str] | None, _proof(
        "--compare", metavar="OUTPUT=HOW",
        help="OUTPUT=detections|topk|cosine|exact: how parity judges an output (default: exact, detections for "
             "outputs named *boxes/*scores/*labels); repeatable")] = None,
    working_sizes: Annotated[bool, _proof(
        "--working-sizes", help="when the model runs at some sizes of a dim only, prove at those (the default)")
    ] = False,
    strict_dims: Annotated[bool, _proof(
        "--strict-dims", help="when the model runs at some sizes of a dim only, exit 2 listing which sizes run "
                              "(default: prove at those, with a constrained-dim warning)")] = False,
) -> LoadOptions:
    return LoadOptions(tuple(input or ()), tuple(dim or ()), model_args, weights, task, trust_remote_code,
                       tuple(compare) if compare else None, working_sizes, strict_dims)


# --------------------------------------------------------------------------- export


def export_group(
    exporter: Annotated[str, _export(
        "--exporter", help="auto | dynamo | torchscript | cond | script | scan (auto: dynamo, torchscript, then the "
        "control-flow strategies when those fail or freeze a branch or loop; the newest opset onnxruntime can "
        "run)")] = "auto",
    opset: Annotated[int | None, _export(
        "--opset", help="ONNX opset (default: newest supported, >= 17)")] = None,
    max_length: Annotated[int | None, _export(
        "--max-length", min=2, help="causal LMs (hf:DIR *ForCausalLM): the most tokens (prompt + generated) the "
                                    "exported KV cache holds, proven up to there (default 128)")] = None,
) -> ExportOptions:
    return ExportOptions(exporter, opset, max_length)


# --------------------------------------------------------------------------- proof


def proof_group(
    atol: Annotated[float, _proof("--atol", help="absolute tolerance (fp32 default 1e-4)")] = 1e-4,
    rtol: Annotated[float, _proof("--rtol", help="relative tolerance (fp32 default 1e-3)")] = 1e-3,
    samples: Annotated[Path | None, _proof(
        "--samples", help="your own inputs, proven one by one and used to calibrate int8: a .npz/.npy of arrays "
                          "(named after the inputs, a leading sample axis), a .txt/.jsonl of texts, or a folder of "
                          "images")] = None,
    tokenizer: Annotated[Path | None, _proof(
        "--tokenizer", help="Hugging Face tokenizer folder for --samples texts (default: the hf:DIR model's "
                            "own)")] = None,
    preprocess: Annotated[str | None, _proof(
        "--preprocess", help="file.py:function turning a PIL image into the model's input array \\[C,H,W] "
                             "for --samples images (default: the transform of the torchvision/timm/Hugging Face "
                             "source)")] = None,
) -> ProofOptions:
    return ProofOptions(Tolerance(atol, rtol), samples, tokenizer, preprocess)


# --------------------------------------------------------------------------- optimize


def _optimize_group(default: str) -> Callable[..., OptimizeOptions]:
    def optimize_group(
        variants: Annotated[str | None, _optimize(
            "--variants", help=f"optimized variants to build and re-prove: {default} (default), "
                               f"{'all' if default == 'auto' else 'auto'} (auto: those that can win for this model "
                               "on this device), or a list such as slim,ort,fused,fp16,int8")] = None,
        budget: Annotated[float | None, _optimize(
            "--budget", min=1, help="seconds for building and proving variants: none is started after that")] = None,
        seq: Annotated[int | None, _optimize(
            "--seq", min=1, help="sequence length of your traffic: variants are timed and the best chosen there "
                                 "(default: the export size; a decoder's timed prompt length)")] = None,
    ) -> OptimizeOptions:
        return OptimizeOptions(variants, budget, seq)

    return optimize_group


convert_optimize_group = _optimize_group("auto")
optimize_group = _optimize_group("all")


# --------------------------------------------------------------------------- runtime


def runtime_group(
    device: Annotated[str, _runtime("--device", help="cpu | cuda")] = "cpu",
    custom_op_library: Annotated[list[Path] | None, _runtime(
        "--custom-op-library", metavar="LIB.so", help="compiled ONNX Runtime custom-op library (.so) loaded into every session; "
                                    "repeatable")] = None,
    trt_fp16: Annotated[bool, _runtime("--trt-fp16", help="TensorRT may run layers in fp16")] = False,
    trt_workspace_gb: Annotated[float, _runtime("--trt-workspace-gb", help="TensorRT workspace")] = 2.0,
    trt_engine_cache: Annotated[Path | None, _runtime(
        "--trt-engine-cache", help="folder where TensorRT keeps built engines")] = None,
) -> RuntimeOptions:
    gpu = GpuOptions(fp16=trt_fp16, trt_workspace_bytes=int(trt_workspace_gb * 1024**3),
                     trt_engine_cache=str(trt_engine_cache) if trt_engine_cache else None)
    return RuntimeOptions(device, gpu, tuple(custom_op_library or ()))


# --------------------------------------------------------------------------- bench


def bench_group(
    batch: Annotated[list[int] | None, _bench("--batch", "-b", metavar="N", help="batch sizes (repeatable)")] = None,
    seq: Annotated[list[int] | None, _bench("--seq", metavar="N", help="sequence lengths to sweep (repeatable)")] = None,
    threads: Annotated[int | None, _bench("--threads", help="threads for every backend")] = None,
    seconds: Annotated[float, _bench("--seconds", help="time budget per size")] = 10.0,
    tune: Annotated[bool, _bench("--tune", help="search ONNX Runtime session options")] = False,
    compile_: Annotated[bool, _bench("--compile", help="also time torch.compile")] = False,
    io_binding: Annotated[bool | None, _bench(
        "--io-binding/--no-io-binding", help="ONNX Runtime runs through IO binding, inputs and outputs on the "
                                             "device (default: on with --device cuda)")] = None,
) -> BenchOptions:
    return BenchOptions(batches=tuple(batch or (1, 8)), seq_lens=tuple(seq) if seq else None, threads=threads,
                        max_seconds=seconds, tune_ort=tune, compile=compile_, io_binding=io_binding)
