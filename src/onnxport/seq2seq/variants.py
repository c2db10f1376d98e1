"""Optimized variants of the three proven files: ``export`` (the files themselves), ``fused`` (onnxruntime's
offline graph optimizations) and ``int8`` (weight-only MatMulNBits), each applied to all three files, judged
against PyTorch by the lowest logit cosine over the step cases and by greedy agreement with ``generate``, and
timed as decode tokens/s at batch 1. The best is the fastest passing one; the export is kept unless another
decodes at least 5 % faster (``DecoderVariants.best``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from onnxport.bench import best_of
from onnxport.core.errors import UsageError, one_line
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import copy_model, file_bytes
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.processors import PLAIN
from onnxport.decoder.records import DecoderVariant, DecoderVariants
from onnxport.decoder.variants import build_nbits, fuse_offline
from onnxport.optimize.context import Skip
from onnxport.optimize.gates import GATES
from onnxport.optimize.registry import BASELINE
from onnxport.seq2seq.feeds import decoder_ids, encoder_inputs, first_inputs, random_cache, with_past_inputs
from onnxport.seq2seq.generation import Sessions, generate_greedy, open_sessions
from onnxport.seq2seq.layout import Encoder, FirstStep, WithPast
from onnxport.seq2seq.prove import reference_generate, step_matrix
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout

SEQ2SEQ_VARIANTS = ("fused", "int8")
JUDGE_TOKENS = 16
SPEED_SOURCE = 16
SPEED_TOKENS = 16
REPEATS = 3


def variant_names(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """The variants asked for ("auto"/"all": every one); an unknown name is a UsageError."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = SEQ2SEQ_VARIANTS if names in ("auto", "all") else tuple(n.strip() for n in names.split(","))
    unknown = [n for n in names if n not in SEQ2SEQ_VARIANTS]
    if unknown:
        raise UsageError(f"--variants {','.join(unknown)}: no such encoder-decoder variant",
                         f"use auto, all or any of {', '.join(SEQ2SEQ_VARIANTS)}")
    return tuple(dict.fromkeys(names))


def _build(name: str, src: Path, dst: Path) -> tuple[str, ...]:
    """One file of variant ``name``; a file the pass has nothing to do in is copied as it is."""
    try:
        if name == "fused":
            return (f"{src.name}: {fuse_offline(src, dst, None)}",)
        return tuple(f"{src.name}: {note}" for note in build_nbits(src, dst, 8))
    except Skip as e:
        copy_model(src, dst)
        return (f"{src.name}: {e}",)


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


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm else float(np.array_equal(a, b))


def judge(sessions: Sessions, layout: Seq2SeqLayout, refs, tolerance: Tolerance) -> dict:
    """Lowest logit cosine and largest error over the step cases, whether all are within ``tolerance``, and
    the greedy tokens' agreement with PyTorch's (the share of equal tokens; steps before the first difference)."""
    steps, _, sources, want = refs
    worst, strict, cosine = 0.0, True, 1.0
    for past, inputs, logits in steps:
        sess, names = ((sessions.decoder, layout.decoder_inputs) if past == 0
                       else (sessions.with_past, layout.with_past_inputs))
        got = sess.run(["logits"], {n: t.numpy() for n, t in zip(names, inputs)})[0]
        diff = np.abs(got.astype(np.float64) - logits)
        worst = max(worst, float(diff.max(initial=0.0)))
        strict = strict and bool(np.all(diff <= tolerance.atol + tolerance.rtol * np.abs(logits)))
        cosine = min(cosine, _cosine(got, logits))
    tokens = generate_greedy(sessions, layout, sources, want.shape[1], PLAIN)
    same = [bool(np.array_equal(tokens[:, i], want[:, i])) for i in range(want.shape[1])]
    steps_agreeing = next((i for i, s in enumerate(same) if not s), len(same))
    return {"max_abs_err": worst, "strict": strict, "cosine": cosine, "top1": float(np.mean(tokens == want)),
            "greedy_steps": steps_agreeing, "greedy_tokens": len(same)}


def decode_speed(sessions: Sessions, layout: Seq2SeqLayout, batch: int = 1) -> tuple[float, float]:
    """(decode tokens/s per row, first-token ms): the best of REPEATS runs of 1 and SPEED_TOKENS + 1 tokens."""
    tokens = min(SPEED_TOKENS, layout.max_length - 1)
    inputs = [t.numpy() for t in encoder_inputs(layout, batch, min(SPEED_SOURCE, layout.max_source), seed=300)]

    def best(n: int) -> float:
        return best_of(lambda: generate_greedy(sessions, layout, inputs, n, PLAIN), REPEATS)

    first = best(1)
    return tokens / max(best(tokens + 1) - first, 1e-9), first * 1000


def _variant(name: str, folder: Path, layout: Seq2SeqLayout, refs, tolerance: Tolerance, threads: int | None,
             notes: tuple[str, ...] = ()) -> DecoderVariant:
    sessions = open_sessions(folder, paths=[folder / f for f in FILES], threads=threads)
    found = judge(sessions, layout, refs, tolerance)
    if name in (BASELINE, "fused"):  # fp32: within the proof's tolerance, and the same greedy tokens
        passed = found["strict"] and found["greedy_steps"] == found["greedy_tokens"]
        why = None if passed else "outside the fp32 tolerance or greedy tokens differ"
    else:
        passed = found["cosine"] >= GATES.cosine_min and found["top1"] >= GATES.top1_min
        why = None if passed else f"cosine {found['cosine']:.4f}, greedy tokens equal {found['top1']:.2f}"
    tok_s, first_ms = decode_speed(sessions, layout)
    size = sum(file_bytes(folder / f) for f in FILES)
    return DecoderVariant(name, folder / WITH_PAST_FILE, size, (), found["max_abs_err"], found["strict"],
                          found["cosine"], found["top1"], found["greedy_steps"], found["greedy_tokens"], tok_s,
                          first_ms, passed, why, notes)


def optimize_seq2seq(model: nn.Module, layout: Seq2SeqLayout, proven: Path, out: Path, *,
                     names: Sequence[str] | str, tolerance: Tolerance = FP32, threads: int | None = None,
                     budget_s: float | None = None, progress: Progress = noop) -> DecoderVariants:
    """The variants ``names`` of the proven files in ``proven``, each in ``out/variants/<name>/``, judged and
    timed beside the export itself."""
    refs = _references(model, layout)
    progress("timing the proven files")
    made = [_variant(BASELINE, proven, layout, refs, tolerance, threads)]
    t0 = time.perf_counter()
    for name in variant_names(names):
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            made.append(DecoderVariant(name, None, error="budget spent", notes=("not started: --budget",)))
            continue
        progress(f"building the {name} variant of the three files")
        folder = out / "variants" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            notes = tuple(n for f in FILES for n in _build(name, proven / f, folder / f))
            made.append(_variant(name, folder, layout, refs, tolerance, threads, notes))
        except Exception as e:  # noqa: BLE001 - a crashing builder is a failed variant, not a failed run
            made.append(DecoderVariant(name, None, error=one_line(e, 240)))
    return DecoderVariants(tuple(made), GATES.cosine_min, GATES.top1_min, threads, SPEED_SOURCE)
