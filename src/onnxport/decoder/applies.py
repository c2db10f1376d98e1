"""Which options a causal LM exported with its KV cache takes: each other one is refused, naming why."""

from __future__ import annotations

import dataclasses

from onnxport.core.errors import UsageError
from onnxport.core.options import QUICK_BENCH, BenchOptions, Options
from onnxport.decoder.flow import MAX_LENGTH


def refuse_for_decoder(options: Options) -> None:
    """A causal LM exported with its KV cache takes the options that apply to it (opset, tolerance, variants,
    budget, --seq as the timed prompt length, --threads, custom-op libraries); each other one is a UsageError
    naming why, never silently ignored."""
    load, ex, proof, bench = options.load, options.export, options.proof, options.bench
    why = "a causal LM is exported with its KV cache"
    refused = [("--dim", bool(load.dims), "its lengths are set by --max-length"),
               ("--compare", bool(load.compare), "its proof compares logits and the cache, then generation"),
               ("--working-sizes", load.working_sizes, "its lengths are set by --max-length"),
               ("--strict-dims", load.strict_dims, "its lengths are set by --max-length"),
               (f"--exporter {ex.exporter}", ex.exporter not in ("auto", "dynamo"),
                "only the dynamo exporter keeps the cache's lengths dynamic"),
               ("--samples", proof.samples is not None, "it is proven by greedy generation on random prompts"),
               ("--tokenizer/--preprocess", proof.tokenizer is not None or proof.preprocess is not None,
                "they read --samples"),
               (bench_label(bench, options.optimize.seq), bench_label(bench, options.optimize.seq) is not None,
                "its variants are timed by decode tokens/s in convert; benchmarks/decoder.py times PyTorch beside "
                "them"),
               (f"--seq {options.optimize.seq}", (options.optimize.seq or 0) >= (ex.max_length or MAX_LENGTH),
                f"the timed prompt must leave room in --max-length {ex.max_length or MAX_LENGTH}")]
    for option, given, reason in refused:
        if given:
            raise UsageError(f"{option} does not apply here: {why} ({reason})",
                             "drop it, or give --input/--task to export the plain forward without a cache")


_BENCH_FLAGS = {"batches": "--batch", "seq_lens": "--seq", "max_seconds": "--seconds", "tune_ort": "--tune",
                "compile": "--compile", "io_binding": "--io-binding", "onnx_files": "MODEL.onnx files"}


def bench_label(bench: BenchOptions | None, seq: int | None) -> str | None:
    """The benchmark options a model exported with its cache cannot take, named for a refusal: None when
    ``bench`` asks for no more than convert's short benchmark (whose only part a decoder takes is
    ``threads``, the threads its variants are timed with; ``seq_lens`` (--seq,) is the timed prompt), else the
    benchmark named with the options that ask for more."""
    if bench is None:
        return None
    quick = dataclasses.replace(QUICK_BENCH, threads=bench.threads, seq_lens=(seq,) if seq else None)
    if bench == quick:
        return None
    flags = [flag for name, flag in _BENCH_FLAGS.items() if getattr(bench, name) != getattr(quick, name)]
    return "onnxport bench" + (f" ({', '.join(flags)})" if flags else "")
