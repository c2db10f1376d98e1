"""The encoder-decoder family's parts of the one pipeline (:class:`onnxport.families.Hooks`): its export with the
cache (three files and their layout), its proof (the step cases, then greedy generation against
``model.generate``), the files kept under the names the proof earns, its variants (the ``seq2seq`` kind, timed by
decode tokens/s) and its report section. The pipeline's stages call them and make the report's records of what
they return."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onnxport.decoder.stage import cache_notes
from onnxport.families import Exported, Hooks, Made, Optimized, Proved, Run
from onnxport.runtime.binding import Target
from onnxport.seq2seq.export import export_seq2seq
from onnxport.seq2seq.flow import MAX_LENGTH, MAX_SOURCE, keep_files, prepared
from onnxport.seq2seq.generation import open_sessions
from onnxport.seq2seq.layout import fitted_max_length
from onnxport.seq2seq.outcome import diagnostics, variants_info
from onnxport.seq2seq.prove import NEW_TOKENS, prove_seq2seq
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqExport, Seq2SeqLayout, Seq2SeqOutcome
from onnxport.seq2seq.stage import save_feature_extractor
from onnxport.seq2seq.variants import optimize_seq2seq


@dataclass(frozen=True)
class FilesExport:
    """The encoder-decoder's typed export: the three files' layout, the export's record and how many tokens its
    greedy generation is proven on."""

    layout: Seq2SeqLayout
    export: Seq2SeqExport
    new_tokens: int


def export(run: Run) -> Exported:
    """The three files in the run's scratch folder, at ``--max-length`` decoder tokens (left out: the default,
    fitted to the positions the model was built for); the tokenizer (and an audio or image model's
    preprocessor_config.json) copied into OUT."""
    o = run.options
    max_length, fitted = ((o.export.max_length, None) if o.export.max_length
                          else fitted_max_length(run.loaded.model, MAX_LENGTH))
    new_tokens = min(NEW_TOKENS, max_length)
    layout = prepared(run.loaded.model, max_length, MAX_SOURCE, new_tokens)
    run.progress(f"exporting the encoder and the decoder with its cache ({layout.layers} layers, {layout.heads} "
                 f"heads, up to {max_length} decoder tokens)")
    made = export_seq2seq(run.loaded.model, layout, run.work, opset=o.export.opset)
    diags = cache_notes(run, layout.generation, fitted, MAX_LENGTH)
    if layout.source_input != "input_ids":  # features or pixels: Whisper's generate takes audio with it
        save_feature_extractor(run.loaded.source.split(":", 1)[1], run.out)
    note = (f"encoder-decoder cache: {layout.layers} layers, {layout.heads} heads, up to {layout.max_length} "
            f"decoder tokens; files {', '.join(FILES)}")
    return Exported(run.work / WITH_PAST_FILE, "dynamo", made.opset, made.seconds,
                    FilesExport(layout, made, new_tokens), made.tried, note, tuple(diags))


def prove(run: Run, exported: Exported) -> Proved:
    """Every step case against PyTorch (the encoder first), then greedy generation by the three files against
    ``model.generate``."""
    made: FilesExport = exported.record
    run.progress(f"proving at opset {exported.opset}: step cases and greedy generation against PyTorch")
    target = Target.of(run.options.runtime)
    sessions = open_sessions(exported.path.parent, paths=made.export.paths, providers=list(target.providers))
    proof = prove_seq2seq(run.loaded.model, made.layout, sessions, tolerance=run.options.proof.tolerance,
                          new_tokens=made.new_tokens, target=target)
    return Proved(proof.tolerance, proof.cases, proof.passed, proof, tuple(diagnostics(proof)))


def keep(run: Run, proven: bool) -> Path:
    """The three files moved into OUT (``*.unverified.onnx`` when not proven); the decoder with past."""
    return keep_files(run.made.exported.path.parent, run.out, proven)


def optimize(run: Run, made: Made) -> Optimized:
    """The ``seq2seq`` kind's variants of the three proven files, each in ``variants/<name>/``, re-proven and
    timed by decode tokens/s."""
    o, files = run.options, made.exported.record
    built = optimize_seq2seq(run.loaded.model, files.layout, run.model_file.parent, run.out,
                             names=o.optimize.variants, tolerance=o.proof.tolerance, progress=run.progress,
                             budget_s=o.optimize.budget, threads=o.bench.threads if o.bench is not None else None,
                             target=Target.of(o.runtime))
    return Optimized(built, (variants_info(built),))


def section(run: Run) -> Seq2SeqOutcome:
    """report.json's ``seq2seq`` section: the files, the layout, the export, the proof and the variants."""
    made = run.made
    files: FilesExport = made.exported.record
    return Seq2SeqOutcome(run.out, files.layout, files.export, made.proved.record,
                          made.optimized.record if made.optimized is not None else None)


HOOKS = Hooks(export=export, prove=prove, section=section, optimize=optimize, keep=keep)
