"""A decoder run in the report's terms: its export as an ExportResult, its step cases as parity cases, the
generations as diagnostics, so ``report.json`` keeps its contract and gains a ``decoder`` section."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onnxport.core.diagnostics import Diagnostic, error, info
from onnxport.core.records import Attempt, CaseResult, ExportResult, Failure, ParityResult
from onnxport.decoder.records import DecoderOutcome, DecoderVariants, GenerationCheck, StepCase
from onnxport.prove.check import check
from onnxport.report.build import Outcome
from onnxport.sources.base import LoadedModel

SECTION = "decoder"  # report.json's section of the family's own records


def _case(c: StepCase, kv_heads: int, head_dim: int) -> CaseResult:
    label = f"batch {c.batch}, past {c.past}, {c.new} new"
    shapes = {"input_ids": [c.batch, c.new], "past_key_values.0.key": [c.batch, kv_heads, c.past, head_dim]}
    return CaseResult(label, shapes, "random", c.max_abs_err, c.max_rel_err, c.passed, c.error,
                      {"logits": {"max_abs_err": c.max_abs_err_logits, "passed": c.passed},
                       "presents": {"max_abs_err": c.max_abs_err_presents, "passed": c.passed}},
                      sizes={"batch": c.batch, "past": c.past, "seq": c.new},
                      failure=None if c.passed else Failure.MISMATCH)


def _attempts(dec: DecoderOutcome) -> tuple[Attempt, ...]:
    tried = tuple(Attempt("dynamo", False, 0.0, dec.export.opset, reason) for reason in dec.export.tried)
    note = f"KV cache: {dec.layout.layers} layers, {dec.layout.kv_heads} kv heads, up to {dec.layout.max_length} tokens"
    return (*tried, Attempt("dynamo", True, dec.export.seconds, dec.export.opset, note=note))


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
    """What the proof found, the failing generation first; then what the export was set to."""
    out = diverged(dec.proof.generations, "prompts", "",
                   "see the step cases below; a failing step case names the past length where logits or presents "
                   "part")
    failed = [c for c in dec.proof.cases if not c.passed]
    if failed:
        c = failed[0]
        out.append(error("parity-failed", f"{len(failed)} of {len(dec.proof.cases)} step cases fail; first: batch "
                         f"{c.batch}, past {c.past}, {c.new} new token(s): {c.error or 'outputs differ'}",
                         hint="a cache length the export did not keep dynamic, or a position the mask sets wrong"))
    if dec.proof.passed:
        agree = ", ".join(f"{g.name} {sum(g.agreement)}/{g.new_tokens}" for g in dec.proof.generations)
        out.append(info("generation-proven", f"greedy generation equals model.generate token for token ({agree})"))
    if dec.variants is not None:
        out.append(_variants_info(dec.variants))
    return out + settings(dec)


def settings(dec: DecoderOutcome) -> list[Diagnostic]:
    """What the export was switched to (docs/decoders.md): the dtype, the experts, the window, other notes."""
    made, layout, out = dec.export, dec.layout, []
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


def _variants_info(made: DecoderVariants) -> Diagnostic:
    best, base = made.best, made.get("export")
    failed = ", ".join(f"{v.name} ({v.error})" for v in made.variants if not v.passed)
    rest = f"; not kept: {failed}" if failed else ""
    if best is None or base is None or not base.decode_tok_s:
        return info("decoder-variants", f"no decoder variant could be timed{rest}")
    speedup = made.speedup or 1.0
    return info("decoder-variant-best",
                f"fastest proven variant: {best.name} at {best.decode_tok_s:.1f} tokens/s decode at batch 1, "
                f"{speedup:.2f}x the export's {base.decode_tok_s:.1f} ({best.path.name if best.path else ''}){rest}")


def to_outcome(dec: DecoderOutcome, loaded: LoadedModel, command: str | None, diags: list[Diagnostic],
               timings: Mapping[str, float]) -> Outcome:
    """The report outcome of a decoder run (``decoder`` holds the records the contract has no place for)."""
    result = ExportResult(dec.path, "dynamo", dec.export.opset, dec.export.seconds, _attempts(dec), False)
    cases = tuple(_case(c, dec.layout.kv_heads, dec.layout.head_dim) for c in dec.proof.cases)
    parity = ParityResult(dec.proof.passed, dec.proof.tolerance, cases)
    return Outcome(loaded, command, tuple(diags) + tuple(diagnostics(dec)), dict(timings), export=result,
                   check=check(dec.path), parity=parity, model_path=dec.path.name, sections={SECTION: dec})
