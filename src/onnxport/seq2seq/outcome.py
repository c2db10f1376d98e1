"""An encoder-decoder run in the report's terms: its export as an ExportResult, its step cases as parity cases,
the generations as diagnostics, so ``report.json`` keeps its contract and gains a ``seq2seq`` section."""

from __future__ import annotations

from collections.abc import Mapping

from onnxport.core.diagnostics import Diagnostic, error, info
from onnxport.core.records import Attempt, CaseResult, ExportResult, Failure, ParityResult
from onnxport.decoder.outcome import diverged
from onnxport.prove.check import check
from onnxport.report.build import Outcome
from onnxport.seq2seq.records import Seq2SeqCase, Seq2SeqOutcome
from onnxport.sources.base import LoadedModel

SECTION = "seq2seq"  # report.json's section of the family's own records


def _case(c: Seq2SeqCase, heads: int, head_dim: int) -> CaseResult:
    label = (f"batch {c.batch}, source {c.source}{' (padded rows)' if c.padded else ''}, past {c.past}, "
             f"{c.new} new ({c.file})")
    shapes = {"encoder input": [c.batch, c.source], "input_ids": [c.batch, c.new],
              "past_key_values.0.decoder.key": [c.batch, heads, c.past, head_dim]}
    return CaseResult(label, shapes, "random", c.max_abs_err, 0.0, c.passed, c.error,
                      {"last_hidden_state": {"max_abs_err": c.max_abs_err_encoder, "passed": c.passed},
                       "logits": {"max_abs_err": c.max_abs_err_logits, "passed": c.passed},
                       "presents": {"max_abs_err": c.max_abs_err_presents, "passed": c.passed}},
                      sizes={"batch": c.batch, "source": c.source, "past": c.past, "seq": c.new},
                      failure=None if c.passed else Failure.MISMATCH)


def diagnostics(made: Seq2SeqOutcome) -> list[Diagnostic]:
    """What the proof found, the failing generation first."""
    out = diverged(made.proof.generations, "sources", " with the three files",
                   "see the step cases below; a failing case names the file and the lengths")
    failed = [c for c in made.proof.cases if not c.passed]
    if failed:
        c = failed[0]
        out.append(error("parity-failed", f"{len(failed)} of {len(made.proof.cases)} step cases fail; first: "
                         f"{c.file}, batch {c.batch}, source {c.source}, past {c.past}, {c.new} new token(s): "
                         f"{c.error or 'outputs differ'}",
                         hint="a length the export did not keep dynamic, or a mask the padding sets wrong"))
    if made.proof.passed:
        agree = ", ".join(f"{g.name} {sum(g.agreement)}/{g.new_tokens}" for g in made.proof.generations)
        out.append(info("generation-proven", "greedy generation with encoder_model, decoder_model and "
                        f"decoder_with_past_model equals model.generate token for token ({agree})"))
    return out


def to_outcome(made: Seq2SeqOutcome, loaded: LoadedModel, command: str | None, diags: list[Diagnostic],
               timings: Mapping[str, float]) -> Outcome:
    """The report outcome of an encoder-decoder run (``seq2seq`` holds the records the contract has no place
    for); the export's path is the decoder with past, the file every generated token runs."""
    path = made.paths[2]
    note = (f"encoder-decoder cache: {made.layout.layers} layers, {made.layout.heads} heads, up to "
            f"{made.layout.max_length} decoder tokens; files {', '.join(p.name for p in made.paths)}")
    tried = tuple(Attempt("dynamo", False, 0.0, made.export.opset, reason) for reason in made.export.tried)
    attempts = (*tried, Attempt("dynamo", True, made.export.seconds, made.export.opset, note=note))
    result = ExportResult(path, "dynamo", made.export.opset, made.export.seconds, attempts, False)
    cases = tuple(_case(c, made.layout.heads, made.layout.head_dim) for c in made.proof.cases)
    parity = ParityResult(made.proof.passed, made.proof.tolerance, cases)
    return Outcome(loaded, command, tuple(diags) + tuple(diagnostics(made)), dict(timings), export=result,
                   check=check(path), parity=parity, model_path=path.name, sections={SECTION: made})
