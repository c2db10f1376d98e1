"""The notes every export with a KV cache adds to the report (the decoder's, the encoder-decoder's)."""

from __future__ import annotations

from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.errors import OnnxportError
from onnxport.core.greedy import GreedyRules
from onnxport.decoder.tokenizer import save_tokenizer
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
    """The load's diagnostics and the :func:`cache_notes` of an export with a cache (the encoder-decoder's
    stage reports both together)."""
    return list(run.loaded.diagnostics) + cache_notes(run, rules, fitted, default)


def cache_notes(run: Run, rules: GreedyRules | None, fitted: int | None, default: int) -> list[Diagnostic]:
    """The diagnostics every export with a cache adds: what the generation config asks that greedy files cannot
    do, the default ``--max-length`` fitted to the model's ``fitted`` positions, and the tokenizer copied beside
    the files (which it does)."""
    diags = generation_notes(rules)
    if fitted is not None:
        diags.append(info("max-length-fitted", f"--max-length {default} (the default) exceeds the {fitted} "
                                               f"positions the model was built for: exported for {fitted} tokens",
                          hint="give --max-length to choose another length"))
    try:
        copied = save_tokenizer(run.loaded.source.split(":", 1)[1], run.out)
    except OnnxportError as e:  # the model is exported all the same; its server takes token ids
        diags.append(warning("tokenizer-unreadable", f"{e.message}: not copied, so serve's generate endpoint "
                                                     "takes and returns token ids only", hint=e.hint))
        return diags
    if copied is not None:  # generate takes and gives text
        diags.append(info("tokenizer-copied", "the model's tokenizer is in tokenizer/: serve's generate "
                                              "endpoint takes and returns text"))
    return diags
