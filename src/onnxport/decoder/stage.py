"""The pipeline's stage of a causal LM exported with its KV cache."""

from __future__ import annotations

from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.greedy import GreedyRules
from onnxport.decoder.flow import MAX_LENGTH, run_model
from onnxport.decoder.layout import fitted_max_length
from onnxport.decoder.outcome import to_outcome
from onnxport.decoder.prove import NEW_TOKENS
from onnxport.decoder.records import CacheVariants
from onnxport.decoder.tokenizer import save_tokenizer
from onnxport.diagnose import rootcause
from onnxport.families import Run


def generation_notes(rules: GreedyRules | None) -> list[Diagnostic]:
    """A warning naming what the generation config asks that greedy decoding with the exported files does not
    do (sampling, beams, ...): ``generate()`` with that config gives other tokens than serve and Triton."""
    if rules is None or not rules.not_applied:
        return []
    return [warning("generation-not-applied", f"the generation config asks for {', '.join(rules.not_applied)}, "
                    "which greedy decoding with the exported files does not apply: serve and the Triton model "
                    "decode greedily with the rest of the config (its other rules are applied)",
                    hint="set these in generation_config.json to greedy values (do_sample false, num_beams 1) "
                         "to have the served tokens equal generate()'s (docs/decoders.md)")]


def export_notes(run: Run, rules: GreedyRules | None, fitted: int | None, default: int) -> list[Diagnostic]:
    """The diagnostics every export with a cache adds to the load's: what the generation config asks that
    greedy files cannot do, the default ``--max-length`` fitted to the model's ``fitted`` positions, and the
    tokenizer copied beside the files (which it does)."""
    diags = list(run.loaded.diagnostics) + generation_notes(rules)
    if fitted is not None:
        diags.append(info("max-length-fitted", f"--max-length {default} (the default) exceeds the {fitted} "
                                               f"positions the model was built for: exported for {fitted} tokens",
                          hint="give --max-length to choose another length"))
    if save_tokenizer(run.loaded.source.split(":", 1)[1], run.out) is not None:  # generate takes and gives text
        diags.append(info("tokenizer-copied", "the model's tokenizer is in tokenizer/: serve's generate "
                                              "endpoint takes and returns text"))
    return diags


def stage(run: Run) -> Run:
    """A causal LM: one ONNX model with the KV cache as inputs and outputs, proven step by step and by greedy
    generation against ``model.generate`` (:mod:`onnxport.decoder`), and its variants when asked for."""
    o = run.options
    max_length, fitted = ((o.export.max_length, None) if o.export.max_length
                          else fitted_max_length(run.loaded.model, MAX_LENGTH))
    made = run_model(run.loaded.model, run.out, opset=o.export.opset, tolerance=o.proof.tolerance,
                     progress=run.progress, max_length=max_length,
                     new_tokens=max(1, min(NEW_TOKENS, max_length - 4)),
                     variants=CacheVariants(o.optimize.variants, o.optimize.budget,
                                            o.bench.threads if o.bench is not None else None, o.optimize.seq))
    diags = export_notes(run, made.layout.generation, fitted, MAX_LENGTH)
    outcome = to_outcome(made, run.loaded, o.command, diags, run.timings).but(log=o.log_name)
    return run.but(outcome=outcome.but(diagnostics=tuple(rootcause.rank(outcome.diagnostics, outcome.parity))))
