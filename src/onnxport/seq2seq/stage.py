"""The pipeline's encoder-decoder stage and the options it takes: each other option is refused, naming why."""

from __future__ import annotations

import shutil
from pathlib import Path

from onnxport.core.diagnostics import Diagnostic, info
from onnxport.core.errors import UsageError
from onnxport.core.options import Options
from onnxport.decoder.applies import bench_label
from onnxport.decoder.records import CacheVariants, DecoderVariants
from onnxport.decoder.stage import export_notes
from onnxport.diagnose import rootcause
from onnxport.families import Run
from onnxport.optimize.registry import SEQ2SEQ, chosen
from onnxport.seq2seq.flow import MAX_LENGTH, run_model
from onnxport.seq2seq.layout import fitted_max_length
from onnxport.seq2seq.outcome import to_outcome
from onnxport.seq2seq.prove import NEW_TOKENS
from onnxport.seq2seq.records import FEATURE_EXTRACTOR_FILE


def variants_info(made: DecoderVariants) -> Diagnostic:
    """The best variant of the three files (``seq2seq-variant-best``) and those not kept, with why."""
    best, base = made.best, made.get("export")
    failed = ", ".join(f"{v.name} ({v.error})" for v in made.variants if not v.passed)
    rest = f"; not kept: {failed}" if failed else ""
    if best is None or base is None or not base.decode_tok_s:
        return info("seq2seq-variant-best", f"no variant of the three files could be timed{rest}")
    where = "the proven files" if best.name == "export" else f"variants/{best.name}/"
    return info("seq2seq-variant-best", f"fastest proven variant: {best.name} ({where}) at "
                f"{best.decode_tok_s:.1f} tokens/s decode at batch 1, {made.speedup or 1.0:.2f}x the export's "
                f"{base.decode_tok_s:.1f}{rest}")


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
               ("--device cuda", options.runtime.device != "cpu", "its proof runs on the CPU today"),
               (f"--seq {opt.seq}", opt.seq is not None, "the proof sets its source lengths"),
               (bench or "", bench is not None, "benchmarks/seq2seq.py times PyTorch and the three files")]
    for option, given, reason in refused:
        if given:
            raise UsageError(f"{option} does not apply here: an encoder-decoder is exported with its cache "
                             f"({reason})", "drop it, or give --input/--task to export the plain forward")
    return options


def stage(run: Run) -> Run:
    """An encoder-decoder : ``encoder_model.onnx``, ``decoder_model.onnx`` and
    ``decoder_with_past_model.onnx`` with the cache, proven step by step and by greedy generation against
    ``model.generate`` (:mod:`onnxport.seq2seq`); the tokenizer (and a speech model's feature extractor) copied
    beside them."""
    o = run.options
    max_length, fitted = ((o.export.max_length, None) if o.export.max_length
                          else fitted_max_length(run.loaded.model, MAX_LENGTH))
    made = run_model(run.loaded.model, run.out, opset=o.export.opset, tolerance=o.proof.tolerance,
                     progress=run.progress, max_length=max_length, new_tokens=min(NEW_TOKENS, max_length),
                     variants=CacheVariants(o.optimize.variants, o.optimize.budget,
                                            o.bench.threads if o.bench is not None else None))
    diags = export_notes(run, made.layout.generation, fitted, MAX_LENGTH)
    if made.layout.source_input != "input_ids":  # features or pixels: Whisper's generate takes audio with it
        save_feature_extractor(run.loaded.source.split(":", 1)[1], run.out)
    if made.variants is not None:
        diags.append(variants_info(made.variants))
    outcome = to_outcome(made, run.loaded, o.command, diags, run.timings).but(log=o.log_name)
    return run.but(outcome=outcome.but(diagnostics=tuple(rootcause.rank(outcome.diagnostics, outcome.parity))))
