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
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from onnxport.bench import best_of
from onnxport.core.errors import DiskFull, UsageError, disk_full, one_line
from onnxport.core.greedy import PLAIN
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import copy_model, file_bytes
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.records import DecoderVariant, DecoderVariants
from onnxport.decoder.variants import build_nbits, cosine, fuse_offline
from onnxport.optimize import registry
from onnxport.optimize.context import BuildOutcome
from onnxport.optimize.gates import GATES
from onnxport.optimize.passes import Budget, build_into, each_variant
from onnxport.optimize.registry import AUTO, BASELINE, SEQ2SEQ, SEQ2SEQ_VARIANTS, register, register_judge
from onnxport.optimize.result import SkipReason
from onnxport.seq2seq.feeds import decoder_ids, encoder_inputs, first_inputs, random_cache, with_past_inputs
from onnxport.seq2seq.generation import Sessions, generate_greedy, open_sessions
from onnxport.seq2seq.layout import Encoder, FirstStep, WithPast
from onnxport.seq2seq.prove import reference_generate, step_matrix
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout

JUDGE_TOKENS = 16
SPEED_SOURCE = 16
SPEED_TOKENS = 16
REPEATS = 3


def variant_names(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """The variants asked for (None: none; "auto"/"all": every one of the encoder-decoder kind); an unknown
    name is a UsageError (:func:`onnxport.optimize.registry.parse_names`)."""
    if names is None:
        return ()
    if names in (AUTO, [AUTO]):
        names = "all"
    items = names.split(",") if isinstance(names, str) else list(names)
    rest = [n.strip() for n in items if n.strip() and n.strip() != BASELINE]
    unknown = [n for n in rest if n not in registry.kind(SEQ2SEQ).names and n != "all"]
    if unknown:
        raise UsageError(f"--variants {','.join(unknown)}: no such encoder-decoder variant",
                         f"use auto, all or any of {', '.join(SEQ2SEQ_VARIANTS)}")
    wanted = registry.parse_names(rest, SEQ2SEQ) if rest else []
    return tuple(n for n in SEQ2SEQ_VARIANTS if n in wanted)


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
            states, mask = wrappers[0](*enc), None if layout.speech else enc[1]
            ids = decoder_ids(layout, batch, new, i)
            inputs = (first_inputs(layout, ids, states, mask) if past == 0 else
                      with_past_inputs(layout, ids, mask, random_cache(layout, batch, past, states.shape[1], i)))
            steps.append((past, inputs, wrappers[1 if past == 0 else 2](*inputs)[0].numpy()))
    sources = encoder_inputs(layout, 3, min(7, layout.max_source), padded=True, seed=200)
    tokens = min(JUDGE_TOKENS, layout.max_length)
    return steps, sources, [t.numpy() for t in sources], reference_generate(model, layout, sources, tokens)


class Judged(NamedTuple):
    """What the judge found of one variant's three files."""

    max_abs_err: float
    strict: bool  # every step case within the tolerance
    cosine: float  # the lowest logit cosine over the step cases
    top1: float  # the share of greedy tokens equal to PyTorch's
    greedy_steps: int  # steps before the first greedy token that differs
    greedy_tokens: int


def compare(sessions: Sessions, layout: Seq2SeqLayout, refs, tolerance: Tolerance) -> Judged:
    """Lowest logit cosine and largest error over the step cases, whether all are within ``tolerance``, and
    the greedy tokens' agreement with PyTorch's (the share of equal tokens; steps before the first difference)."""
    steps, _, sources, want = refs
    worst, strict, lowest = 0.0, True, 1.0
    for past, inputs, logits in steps:
        sess, names = ((sessions.decoder, layout.decoder_inputs) if past == 0
                       else (sessions.with_past, layout.with_past_inputs))
        got = sess.run(["logits"], {n: t.numpy() for n, t in zip(names, inputs)})[0]
        diff = np.abs(got.astype(np.float64) - logits)
        worst = max(worst, float(diff.max(initial=0.0)))
        strict = strict and bool(np.all(diff <= tolerance.atol + tolerance.rtol * np.abs(logits)))
        lowest = min(lowest, cosine(got, logits))
    tokens = generate_greedy(sessions, layout, sources, want.shape[1], PLAIN)
    same = [bool(np.array_equal(tokens[:, i], want[:, i])) for i in range(want.shape[1])]
    steps_agreeing = next((i for i, s in enumerate(same) if not s), len(same))
    return Judged(worst, strict, lowest, float(np.mean(tokens == want)), steps_agreeing, len(same))


def decode_speed(sessions: Sessions, layout: Seq2SeqLayout, batch: int = 1) -> tuple[float, float]:
    """(decode tokens/s per row, first-token ms): the best of REPEATS runs of 1 and SPEED_TOKENS + 1 tokens."""
    tokens = min(SPEED_TOKENS, layout.max_length - 1)
    inputs = [t.numpy() for t in encoder_inputs(layout, batch, min(SPEED_SOURCE, layout.max_source), seed=300)]

    def best(n: int) -> float:
        return best_of(lambda: generate_greedy(sessions, layout, inputs, n, PLAIN), REPEATS)

    first = best(1)
    return tokens / max(best(tokens + 1) - first, 1e-9), first * 1000


def judge(name: str, folder: Path, layout: Seq2SeqLayout, refs, tolerance: Tolerance, threads: int | None,
          notes: tuple[str, ...] = ()) -> DecoderVariant:
    """Re-prove the three files in ``folder`` against ``refs`` and time their decode (the encoder-decoder kind's
    judge): fp32 variants within the tolerance with the same greedy tokens, the others by the gates."""
    sessions = open_sessions(folder, paths=[folder / f for f in FILES], threads=threads)
    found = compare(sessions, layout, refs, tolerance)
    if name in (BASELINE, "fused"):  # fp32: within the proof's tolerance, and the same greedy tokens
        passed = found.strict and found.greedy_steps == found.greedy_tokens
        why = None if passed else "outside the fp32 tolerance or greedy tokens differ"
    else:
        passed = found.cosine >= GATES.cosine_min and found.top1 >= GATES.top1_min
        why = None if passed else f"cosine {found.cosine:.4f}, greedy tokens equal {found.top1:.2f}"
    tok_s, first_ms = decode_speed(sessions, layout)
    size = sum(file_bytes(folder / f) for f in FILES)
    return DecoderVariant(name, folder / WITH_PAST_FILE, size, (), found.max_abs_err, found.strict, found.cosine,
                          found.top1, found.greedy_steps, found.greedy_tokens, tok_s, first_ms, passed, why, notes)


register_judge(SEQ2SEQ, judge)


def optimize_seq2seq(model: nn.Module, layout: Seq2SeqLayout, proven: Path, out: Path, *,
                     names: Sequence[str] | str, tolerance: Tolerance = FP32, threads: int | None = None,
                     budget_s: float | None = None, progress: Progress = noop) -> DecoderVariants:
    """The variants ``names`` of the proven files in ``proven``, each in ``out/variants/<name>/``, judged and
    timed beside the export itself, by the loop every kind's variants go through
    (:func:`~onnxport.optimize.passes.each_variant`: in order, none started after ``budget_s``)."""
    budget = Budget(time.perf_counter(), budget_s)
    refs = _references(model, layout)
    judged = functools.partial(registry.judge(SEQ2SEQ), layout=layout, refs=refs, tolerance=tolerance,
                               threads=threads)

    def one(name: str, say: Progress) -> DecoderVariant:
        if name == BASELINE:
            say("timing the proven files")
            return judged(name, proven)
        say(f"building the {name} variant of the three files")
        folder = out / "variants" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            return judged(name, folder, notes=build_files(name, proven, folder))
        except Exception as e:  # noqa: BLE001 - a crashing builder is a failed variant, not a failed run
            if disk_full(e):
                raise DiskFull() from e
            return DecoderVariant(name, None, error=one_line(e, 240))

    def skipped(name: str, why: str, reason: SkipReason) -> DecoderVariant:
        return DecoderVariant(name, None, passed=False, error=why, skip_reason=reason)

    # the export is judged whatever the budget: the others are timed against it
    made = [one(BASELINE, progress), *each_variant(variant_names(names), one, skipped, progress, budget)]
    return DecoderVariants(tuple(made), GATES.cosine_min, GATES.top1_min, threads, SPEED_SOURCE)
