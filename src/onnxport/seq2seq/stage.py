"""The options an encoder-decoder takes (each other option is refused, naming why) and the feature extractor
copied beside its files."""

from __future__ import annotations

import shutil
from pathlib import Path

from onnxport.core.errors import UsageError
from onnxport.core.options import Options
from onnxport.decoder.applies import bench_label
from onnxport.optimize.registry import chosen
from onnxport.seq2seq.kind import SEQ2SEQ
from onnxport.seq2seq.records import FEATURE_EXTRACTOR_FILE


def save_feature_extractor(model_dir: str | Path, out: str | Path) -> Path | None:
    """Copy the model's ``preprocessor_config.json`` (a speech model's feature extractor, an image model's
    processor) from its local folder to ``out`` (None when it has none), so that a server can turn audio into
    Whisper's log-mel features."""
    src = Path(model_dir) / FEATURE_EXTRACTOR_FILE
    if not src.is_file():
        return None
    dst = Path(out) / FEATURE_EXTRACTOR_FILE
    shutil.copyfile(src, dst)
    return dst


def checked(options: Options) -> Options:
    """``options`` when an encoder-decoder exported with its cache takes them all (opset, tolerance, max length,
    remote code, custom-op libraries, the variants, --budget, --threads); each other one is a UsageError naming
    why."""
    load, ex, proof, opt = options.load, options.export, options.proof, options.optimize
    chosen(opt.variants, SEQ2SEQ)  # an unknown name is a UsageError before the load
    bench = bench_label(options.bench, None)
    refused = [("--dim", bool(load.dims), "its lengths are set by --max-length and the model's positions"),
               ("--compare", bool(load.compare), "its proof compares logits and the caches, then generation"),
               ("--model-args", load.model_args is not None, "hf:DIR is built from its own config.json"),
               ("--weights", load.weights is not None, "hf:DIR loads the weights saved beside its config"),
               ("--working-sizes", load.working_sizes, "its lengths are set by --max-length"),
               ("--strict-dims", load.strict_dims, "its lengths are set by --max-length"),
               (f"--exporter {ex.exporter}", ex.exporter not in ("auto", "dynamo"),
                "only the dynamo exporter keeps the cache's lengths dynamic"),
               ("--samples", proof.samples is not None, "it is proven by greedy generation on random sources"),
               ("--tokenizer/--preprocess", proof.tokenizer is not None or proof.preprocess is not None,
                "they read --samples"),
               (f"--seq {opt.seq}", opt.seq is not None, "the proof sets its source lengths"),
               (bench or "", bench is not None, "benchmarks/seq2seq.py times PyTorch and the three files")]
    for option, given, reason in refused:
        if given:
            raise UsageError(f"{option} does not apply here: an encoder-decoder is exported with its cache "
                             f"({reason})", "drop it, or give --input/--task to export the plain forward")
    return options
