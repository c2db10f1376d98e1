"""What a decoder run tells the report beyond its records: the diagnostics of its proof (the generations, the
failing step cases), of its variants and of what the export was set to; its section is ``decoder``."""

from __future__ import annotations

from collections.abc import Sequence

from onnxport.core.diagnostics import Diagnostic, error, info
from onnxport.decoder.records import (
    CacheLayout,
    DecoderExport,
    DecoderOutcome,
    DecoderProof,
    DecoderVariants,
    GenerationCheck,
)

SECTION = "decoder"  # report.json's section of the family's own records


def diverged(generations: Sequence[GenerationCheck], lengths: str, made_by: str, hint: str) -> list[Diagnostic]:
    """A ``generation-diverged`` error for each failing generation (``lengths``: what its prompt lengths are
    called; ``made_by``: how the exported files are named in the sentence, with its leading space)."""
    out: list[Diagnostic] = []
    for g in generations:
        if not g.passed:
            where = g.error or f"first differs at step {g.first_divergent_step}"
            out.append(error("generation-diverged",
                             f"greedy generation '{g.name}' ({g.batch} row(s), {lengths} {list(g.prompt_lengths)})"
                             f"{made_by} does not equal model.generate: {where}", hint=hint))
    return out


def diagnostics(dec: DecoderOutcome) -> list[Diagnostic]:
    """What the proof found, the failing generation first; then what the variants made and what the export was
    set to."""
    out = proof_diagnostics(dec.proof)
    if dec.variants is not None:
        out.append(variants_info(dec.variants))
    return out + settings(dec.export, dec.layout)


def proof_diagnostics(proof: DecoderProof) -> list[Diagnostic]:
    """What the proof found: each failing generation, the failing step cases, or the generations proven."""
    out = diverged(proof.generations, "prompts", "",
                   "see the step cases below; a failing step case names the past length where logits or presents "
                   "part")
    failed = [c for c in proof.cases if not c.passed]
    if failed:
        c = failed[0]
        out.append(error("parity-failed", f"{len(failed)} of {len(proof.cases)} step cases fail; first: batch "
                         f"{c.batch}, past {c.past}, {c.new} new token(s): {c.error or 'outputs differ'}",
                         hint="a cache length the export did not keep dynamic, or a position the mask sets wrong"))
    if proof.passed:
        agree = ", ".join(f"{g.name} {sum(g.agreement)}/{g.new_tokens}" for g in proof.generations)
        out.append(info("generation-proven", f"greedy generation equals model.generate token for token ({agree})"))
    return out


def settings(made: DecoderExport, layout: CacheLayout) -> list[Diagnostic]:
    """What the export was switched to (docs/decoders.md): the dtype, the experts, the window, other notes."""
    out = []
    if made.source_dtype is not None:
        out.append(info("decoder-dtype", f"the model's weights are {made.source_dtype}: exported and proven in "
                        f"{made.dtype} (the weights upcast exactly; the file takes and returns {made.dtype})"))
    if made.experts is not None:
        out.append(info("decoder-experts", f"the mixture-of-experts layers were exported with transformers' "
                        f"{made.experts} experts (grouped_mm has no ONNX translation); proven against the model's "
                        "own experts"))
    if layout.sliding_window is not None:
        out.append(info("decoder-sliding-window", f"the cache keeps all {layout.max_length} tokens and the mask "
                        f"applies the {layout.sliding_window}-token sliding window; proven past the window"))
    out += [info("decoder-export-note", note) for note in made.notes]
    return out


def variants_info(made: DecoderVariants) -> Diagnostic:
    best, base = made.best, made.get("export")
    failed = ", ".join(f"{v.name} ({v.error})" for v in made.variants if not v.passed)
    rest = f"; not kept: {failed}" if failed else ""
    if best is None or base is None or not base.decode_tok_s:
        return info("decoder-variants", f"no decoder variant could be timed{rest}")
    speedup = made.speedup or 1.0
    return info("decoder-variant-best",
                f"fastest proven variant: {best.name} at {best.decode_tok_s:.1f} tokens/s decode at batch 1, "
                f"{speedup:.2f}x the export's {base.decode_tok_s:.1f} ({best.path.name if best.path else ''}){rest}")
