"""The decoder family's parts of the one pipeline (:class:`onnxport.families.Hooks`): its export with the KV
cache (one file and its cache layout), its proof (the step cases, then greedy generation against
``model.generate``), its variants (the ``decoder`` kind, timed by decode tokens/s) and its report section. The
pipeline's stages call them and make the report's records of what they return."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnxport.decoder.export import export_decoder
from onnxport.decoder.flow import MAX_LENGTH, prepared
from onnxport.decoder.layout import fitted_max_length
from onnxport.decoder.outcome import proof_diagnostics, settings, variants_info
from onnxport.decoder.prove import NEW_TOKENS, prove_decoder
from onnxport.decoder.records import CacheLayout, CacheVariants, DecoderExport, DecoderOutcome
from onnxport.decoder.stage import cache_notes
from onnxport.decoder.variants import optimize_decoder
from onnxport.families import Exported, Hooks, Made, Optimized, Proved, Run
from onnxport.optimize.passes import install_best
from onnxport.optimize.registry import BASELINE
from onnxport.runtime.binding import Target


@dataclass(frozen=True)
class CacheExport:
    """The decoder's typed export: the file's cache layout, the export's record and how many tokens its greedy
    generation is proven on."""

    layout: CacheLayout
    export: DecoderExport
    new_tokens: int


def export(run: Run) -> Exported:
    """The model with its KV cache as one ONNX file in the run's scratch folder, at ``--max-length`` tokens
    (left out: the default, fitted to the positions the model was built for)."""
    o = run.options
    max_length, fitted = ((o.export.max_length, None) if o.export.max_length
                          else fitted_max_length(run.loaded.model, MAX_LENGTH))
    new_tokens = max(1, min(NEW_TOKENS, max_length - 4))
    layout, source_dtype = prepared(run.loaded.model, max_length, new_tokens, run.progress)
    made = export_decoder(run.loaded.model, layout, run.work / "decoder.onnx", opset=o.export.opset)
    made = dataclasses.replace(made, source_dtype=source_dtype)
    note = f"KV cache: {layout.layers} layers, {layout.kv_heads} kv heads, up to {layout.max_length} tokens"
    diags = cache_notes(run, layout.generation, fitted, MAX_LENGTH) + settings(made, layout)
    return Exported(made.path, "dynamo", made.opset, made.seconds, CacheExport(layout, made, new_tokens), made.tried,
                    note, tuple(diags))


def prove(run: Run, exported: Exported) -> Proved:
    """Every step case against PyTorch, then greedy generation against ``model.generate``."""
    made: CacheExport = exported.record
    run.progress(f"proving at opset {exported.opset}: step cases and greedy generation against PyTorch")
    proof = prove_decoder(run.loaded.model, made.layout, run.result.path, tolerance=run.options.proof.tolerance,
                          new_tokens=made.new_tokens, target=Target.of(run.options.runtime))
    return Proved(proof.tolerance, proof.cases, proof.passed, proof, tuple(proof_diagnostics(proof)))


def optimize(run: Run, made: Made) -> Optimized:
    """The ``decoder`` kind's variants of the proven file, each re-proven and timed by decode tokens/s; the
    fastest, when not the export itself, copied to best.onnx (what serve and triton take)."""
    o, cached = run.options, made.exported.record
    built = optimize_decoder(run.loaded.model, cached.layout, run.model_file, run.out, names=o.optimize.variants,
                             tolerance=o.proof.tolerance, progress=run.progress, target=Target.of(o.runtime),
                             settings=CacheVariants(budget_s=o.optimize.budget, seq=o.optimize.seq,
                                                    threads=o.bench.threads if o.bench is not None else None))
    best = built.best
    if best is not None and best.name != BASELINE and best.path is not None:
        install_best(best.path, run.out)
    return Optimized(built, (variants_info(built),))


def section(run: Run) -> DecoderOutcome:
    """report.json's ``decoder`` section: the layout, the export, the proof and the variants."""
    made = run.made
    cached: CacheExport = made.exported.record
    path = run.model_file or made.exported.path
    return DecoderOutcome(path, cached.layout, dataclasses.replace(cached.export, path=path), made.proved.record,
                          made.optimized.record if made.optimized is not None else None)


HOOKS = Hooks(export=export, prove=prove, section=section, optimize=optimize)
