"""Optimized variants of the three proven files: ``export`` (the files themselves), ``fused`` (onnxruntime's
offline graph optimizations) and ``int8`` (weight-only MatMulNBits), each applied to all three files, judged
against PyTorch by the lowest logit cosine over the step cases and by greedy agreement with ``generate``, and
timed as decode tokens/s at batch 1. The best is the fastest passing one; the export is kept unless another
decodes at least 5 % faster (``DecoderVariants.best``)."""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from onnxport.bench import best_of
from onnxport.core.errors import DiskFull, disk_full, one_line
from onnxport.core.greedy import PLAIN
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import copy_model, file_bytes
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.records import DecoderVariant, DecoderVariants
from onnxport.decoder.variants import build_nbits, fuse_offline
from onnxport.decoder.variants import policy as decoder_policy
from onnxport.optimize import registry
from onnxport.optimize.context import BuildOutcome
from onnxport.optimize.gates import GATES
from onnxport.optimize.passes import Budget, Built, Unmade, VariantPass, build_into, each_variant
from onnxport.optimize.registry import BASELINE, register, register_judge
from onnxport.optimize.result import SkipReason
from onnxport.prove.judging import (
    Policy,
    RunResults,
    compare_accuracy,
    run_cases,
    token_agreement,
    varying_record,
    verdict,
)
from onnxport.runtime.binding import CPU_TARGET, Target
from onnxport.seq2seq.feeds import decoder_ids, encoder_inputs, first_inputs, random_cache, with_past_inputs
from onnxport.seq2seq.generation import Sessions, generate_greedy, open_sessions
from onnxport.seq2seq.kind import SEQ2SEQ
from onnxport.seq2seq.layout import Encoder, FirstStep, WithPast
from onnxport.seq2seq.prove import reference_generate, step_matrix
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout

JUDGE_TOKENS = 16
SPEED_SOURCE = 16
SPEED_TOKENS = 16
REPEATS = 3


def _fused(src: Path, dst: Path, ctx: object) -> BuildOutcome:
    return BuildOutcome(notes=(f"{src.name}: {fuse_offline(src, dst, None)}",))


def _int8(src: Path, dst: Path, ctx: object) -> BuildOutcome:
    return BuildOutcome(notes=tuple(f"{src.name}: {note}" for note in build_nbits(src, dst, 8)))


register(SEQ2SEQ, "fused", _fused)
register(SEQ2SEQ, "int8", _int8)


def build_files(name: str, proven: Path, folder: Path) -> tuple[str, ...]:
    """Variant ``name`` of each of the three files of ``proven`` into ``folder`` (each by
    :func:`~onnxport.optimize.passes.build_into`); a file the pass has nothing to do in is copied as it is.
    A builder that fails raises RuntimeError (the variant's error)."""
    notes: list[str] = []
    for file in FILES:
        made = build_into(registry.builder(SEQ2SEQ, name), proven / file, folder / file, None)
        if made.skip is not None:
            copy_model(proven / file, folder / file)
            notes.append(f"{file}: {made.skip}")
        elif made.outcome is None:
            raise RuntimeError(f"{file}: {made.error}")
        else:
            notes.extend(made.outcome.notes)
    return tuple(notes)


def _references(model: nn.Module, layout: Seq2SeqLayout) -> tuple[list, list, list, np.ndarray]:
    """PyTorch's step cases (inputs and logits per file) and its greedy tokens for a padded batch of sources."""
    wrappers = (Encoder(model, layout).eval(), FirstStep(model, layout).eval(), WithPast(model, layout).eval())
    steps = []
    with torch.inference_mode():
        for i, (batch, source, past, new, padded) in enumerate(step_matrix(layout)):
            enc = encoder_inputs(layout, batch, source, padded=padded, seed=i)
            states, mask = wrappers[0](*enc), enc[1] if layout.encoder_mask else None
            ids = decoder_ids(layout, batch, new, i)
            inputs = (first_inputs(layout, ids, states, mask) if past == 0 else
                      with_past_inputs(layout, ids, mask, random_cache(layout, batch, past, states.shape[1], i)))
            steps.append((past, inputs, wrappers[1 if past == 0 else 2](*inputs)[0].numpy()))
    sources = encoder_inputs(layout, 3, min(7, layout.max_source), padded=True, seed=200)
    tokens = min(JUDGE_TOKENS, layout.max_length)
    return steps, sources, [t.numpy() for t in sources], reference_generate(model, layout, sources, tokens)


def step_runs(sessions: Sessions, layout: Seq2SeqLayout, refs) -> tuple[RunResults, RunResults]:
    """(the variant's logits on each step case, PyTorch's): the first-step file at past 0, the with-past file
    after it."""
    steps = refs[0]
    labels = [f"step {i} (past {past})" for i, (past, _, _) in enumerate(steps)]

    def run(step) -> list[np.ndarray]:
        past, inputs, _ = step
        sess, names = ((sessions.decoder, layout.decoder_inputs) if past == 0
                       else (sessions.with_past, layout.with_past_inputs))
        return sess.run(["logits"], {n: t.numpy() for n, t in zip(names, inputs)})

    return run_cases(run, steps, labels), RunResults.of(labels, [(logits,) for _, _, logits in steps])


def policy(name: str, tolerance: Tolerance) -> Policy:
    """The encoder-decoder kind's policy for variant ``name``: the decoder kind's
    (:func:`onnxport.decoder.variants.policy`), whose fp32 variants here must give the same greedy tokens too,
    and whose top-1 is the share of greedy tokens equal to PyTorch's."""
    found = decoder_policy(name, tolerance)
    return replace(found, tokens=found.elementwise, top1_name="greedy tokens equal")


def decode_speed(sessions: Sessions, layout: Seq2SeqLayout, batch: int = 1) -> tuple[float, float]:
    """(decode tokens/s per row, first-token ms): the best of REPEATS runs of 1 and SPEED_TOKENS + 1 tokens."""
    tokens = min(SPEED_TOKENS, layout.max_length - 1)
    inputs = [t.numpy() for t in encoder_inputs(layout, batch, min(SPEED_SOURCE, layout.max_source), seed=300)]

    def best(n: int) -> float:
        return best_of(lambda: generate_greedy(sessions, layout, inputs, n, PLAIN), REPEATS)

    first = best(1)
    return tokens / max(best(tokens + 1) - first, 1e-9), first * 1000


def judge(name: str, folder: Path, layout: Seq2SeqLayout, refs, tolerance: Tolerance, threads: int | None,
          notes: tuple[str, ...] = (), *, target: Target = CPU_TARGET) -> DecoderVariant:
    """Re-prove the three files in ``folder`` against ``refs`` and time their decode (the encoder-decoder kind's
    judge): its runs first (the step cases' logits, greedy tokens for a padded batch), then one comparison
    (:func:`~onnxport.prove.judging.compare_accuracy`) and one verdict."""
    sessions = open_sessions(folder, paths=[folder / f for f in FILES], threads=threads,
                             providers=list(target.providers))
    got, want = step_runs(sessions, layout, refs)
    _, _, sources, tokens_want = refs
    own = generate_greedy(sessions, layout, sources, tokens_want.shape[1], PLAIN)
    tokens = token_agreement(own, tokens_want)
    found = replace(compare_accuracy(got, want, tolerance), top1=tokens.share)
    judged = verdict(found, policy(name, tolerance), tokens)
    tok_s, first_ms = decode_speed(sessions, layout)
    size = sum(file_bytes(folder / f) for f in FILES)
    return DecoderVariant(name, folder / WITH_PAST_FILE, size, (), found.max_abs_err, found.within, found.cosine,
                          tokens.share, tokens.steps, tokens.total, tok_s, first_ms, judged.passed, judged.reason,
                          notes, metrics=judged.metrics, varying=varying_record(found.varying, tokens))


register_judge(SEQ2SEQ, judge)


def _build_three(name: str, proven: Path, folder: Path) -> Built:
    """:func:`build_files` into a fresh ``folder``, as one build (a builder that fails: its error)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        notes = build_files(name, proven, folder)
    except Exception as e:  # noqa: BLE001 - a crashing builder is a failed variant, not a failed run
        if disk_full(e):
            raise DiskFull() from e
        return Built(folder, None, time.perf_counter() - t0, error=one_line(e, 240))
    return Built(folder, BuildOutcome(notes=notes, path=folder), time.perf_counter() - t0)


def _unmade(why: Unmade) -> DecoderVariant:
    return DecoderVariant(why.name, None, error=why.why, notes=why.notes, skip_reason=why.reason)


def variant_pass(name: str, proven: Path, folder: Path, judged) -> VariantPass[DecoderVariant]:
    """Variant ``name`` of the three files as a pass: built into ``folder`` (the proven files themselves for the
    baseline), judged by the encoder-decoder kind's judge (``judged(name, folder, notes=...)``)."""
    build = None if name == BASELINE else functools.partial(_build_three, name, proven, folder)
    return VariantPass(name, proven, build, lambda made: judged(name, made.file, notes=made.outcome.notes), _unmade)


def optimize_seq2seq(model: nn.Module, layout: Seq2SeqLayout, proven: Path, out: Path, *,
                     names: Sequence[str] | str, tolerance: Tolerance = FP32, threads: int | None = None,
                     budget_s: float | None = None, progress: Progress = noop,
                     target: Target = CPU_TARGET) -> DecoderVariants:
    """The variants ``names`` of the proven files in ``proven``, each in ``out/variants/<name>/``, judged and
    timed beside the export itself, by the loop every kind's variants go through
    (:func:`~onnxport.optimize.passes.each_variant`: in order, none started after ``budget_s``), on ``target``'s
    providers (PyTorch's references on the CPU)."""
    budget = Budget(time.perf_counter(), budget_s)
    refs = _references(model, layout)
    judged = functools.partial(registry.judge(SEQ2SEQ), layout=layout, refs=refs, tolerance=tolerance,
                               threads=threads, target=target)

    def one(name: str, say: Progress) -> DecoderVariant:
        say("timing the proven files" if name == BASELINE else f"building the {name} variant of the three files")
        return variant_pass(name, proven, out / "variants" / name, judged)()

    def skipped(name: str, why: str, reason: SkipReason) -> DecoderVariant:
        return DecoderVariant(name, None, passed=False, error=why, skip_reason=reason)

    # the export is judged whatever the budget: the others are timed against it
    made = [one(BASELINE, progress), *each_variant(registry.chosen(names, SEQ2SEQ), one, skipped, progress, budget)]
    return DecoderVariants(tuple(made), GATES.cosine_min, GATES.top1_min, threads, SPEED_SOURCE,
                           device=target.device)
