"""What the encoder-decoder's proof and variants add to the report: its diagnostics (the generations, the first
failing step case, the best variant) and the name of its report.json section. The report's records of its
export and step cases are made by the one pipeline's stages (:mod:`onnxport.families.steps`)."""

from __future__ import annotations

from onnxport.core.diagnostics import Diagnostic, error, info
from onnxport.decoder.outcome import diverged
from onnxport.decoder.records import DecoderVariants
from onnxport.seq2seq.records import Seq2SeqProof

SECTION = "seq2seq"  # report.json's section of the family's own records


def diagnostics(proof: Seq2SeqProof) -> list[Diagnostic]:
    """What the proof found, the failing generation first."""
    out = diverged(proof.generations, "sources", " with the three files",
                   "see the step cases below; a failing case names the file and the lengths")
    failed = [c for c in proof.cases if not c.passed]
    if failed:
        c = failed[0]
        out.append(error("parity-failed", f"{len(failed)} of {len(proof.cases)} step cases fail; first: "
                         f"{c.file}, batch {c.batch}, source {c.source}, past {c.past}, {c.new} new token(s): "
                         f"{c.error or 'outputs differ'}",
                         hint="a length the export did not keep dynamic, or a mask the padding sets wrong"))
    if proof.passed:
        agree = ", ".join(f"{g.name} {sum(g.agreement)}/{g.new_tokens}" for g in proof.generations)
        out.append(info("generation-proven", "greedy generation with encoder_model, decoder_model and "
                        f"decoder_with_past_model equals model.generate token for token ({agree})"))
    return out


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
