"""The proof of an encoder-decoder with its cache: each step case (sources of several lengths, padded rows,
decoder past 0 … max-1) against PyTorch, then greedy generation by the three files under the generation config's
rules against ``model.generate`` token for token."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.greedy import PLAIN, GreedyRules
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.prove import on_target, reference_config
from onnxport.decoder.records import GenerationCheck
from onnxport.prove.judging import RunResults, compare_accuracy, run_cases
from onnxport.prove.references import Ran, run_each
from onnxport.runtime.binding import CPU_TARGET, Target
from onnxport.runtime.sessions import OnDevice
from onnxport.seq2seq.feeds import (
    decoder_ids,
    encoder_inputs,
    first_inputs,
    padded_lengths,
    random_cache,
    with_past_inputs,
)
from onnxport.seq2seq.generation import Sessions, generate_greedy
from onnxport.seq2seq.layout import Encoder, FirstStep, WithPast
from onnxport.seq2seq.records import Seq2SeqCase, Seq2SeqLayout, Seq2SeqProof

NEW_TOKENS = 32
Case = tuple[int, int, int, int, bool]  # batch, source, past, new, padded


def step_matrix(layout: Seq2SeqLayout) -> list[Case]:
    """(batch, source, past, new, padded) cases: sources of 1, an odd number and ``max_source`` tokens (speech:
    its one length); the first step (past 0) of one and several tokens, up to ``max_length``; one and several
    new tokens on a decoder cache of 1, an odd number and nearly ``max_length`` tokens; batch 1, and batch 3
    with right-padded source rows."""
    top, n = layout.max_length, layout.max_length
    sources = sorted({1, min(7, layout.max_source), layout.max_source}) if layout.dynamic else [layout.max_source]
    odd, longest = sources[len(sources) // 2], sources[-1]
    several = min(4, top - 1)
    cases: list[Case] = [(1, s, 0, 1, False) for s in sources]
    cases += [(3, odd, 0, min(5, n), True), (3, longest, 0, n, True), (1, longest, 0, n, False)]
    for past in sorted({1, min(9, top - several), top - several}):
        cases += [(1, odd, past, 1, False), (3, longest, past, several, True), (3, odd, past, 1, True)]
    cases.append((1, longest, top - 1, 1, False))
    return list(dict.fromkeys(c for c in cases if c[2] + c[3] <= top))


def _feeds(layout: Seq2SeqLayout, case: Case, states: np.ndarray, enc: tuple, seed: int) -> tuple:
    """A step's decoder inputs: the first step on the encoder's output, or new tokens on a random cache."""
    batch, _, past, new, _ = case
    mask = enc[1] if layout.encoder_mask else None
    ids = decoder_ids(layout, batch, new, seed)
    if past == 0:
        return tuple(first_inputs(layout, ids, torch.from_numpy(states), mask))
    return tuple(with_past_inputs(layout, ids, mask, random_cache(layout, batch, past, states.shape[1], seed)))


def step_cases(sessions: Sessions, wrappers: tuple[nn.Module, ...], layout: Seq2SeqLayout, tolerance: Tolerance,
               seed: int) -> tuple[Seq2SeqCase, ...]:
    """Every :func:`step_matrix` case, run then judged: the encoder on the case's sources, then one decoder step
    (the first, or one on a random cache) fed PyTorch's encoder output. PyTorch's outputs
    (:func:`~onnxport.prove.references.run_each`) and onnxruntime's (:func:`~onnxport.prove.judging.run_cases`)
    first, then each case compared by :func:`~onnxport.prove.judging.compare_accuracy`: the encoder's output,
    the logits and the presents each (the one comparison every variant is judged by)."""
    matrix = step_matrix(layout)
    encs = [tuple(encoder_inputs(layout, b, s, padded=p, seed=seed + i)) for i, (b, s, _, _, p) in enumerate(matrix)]
    states = run_each(wrappers[0], encs)
    got_states = run_cases(lambda enc: sessions.encoder.run(["last_hidden_state"], {
        n: t.numpy() for n, t in zip(layout.encoder_inputs, enc)}), encs, matrix)
    feeds = [None if ran.outputs is None else _feeds(layout, case, ran.outputs[0], encs[i], seed + i)
             for i, (case, ran) in enumerate(zip(matrix, states))]
    want = [ran if feed is None else run_each(wrappers[1 if case[2] == 0 else 2], [feed])[0]
            for case, feed, ran in zip(matrix, feeds, states)]

    def decode(step: tuple[Case, tuple]) -> list:
        case, feed = step
        sess, names = ((sessions.decoder, layout.decoder_inputs) if case[2] == 0
                       else (sessions.with_past, layout.with_past_inputs))
        return sess.run(None, {n: t.numpy() for n, t in zip(names, feed)})

    got = run_cases(decode, list(zip(matrix, feeds)), matrix)
    return tuple(judged_step(layout, case, got_states.outputs[i], got.outputs[i], states[i], want[i], tolerance,
                             got_states.error(i) or got.error(i)) for i, case in enumerate(matrix))


def judged_step(layout: Seq2SeqLayout, case: Case, got_states: tuple | None, got: tuple | None, states: Ran,
                want: Ran, tolerance: Tolerance, why: str | None = None) -> Seq2SeqCase:
    """One step case judged: onnxruntime's encoder output and decoder outputs against PyTorch's (None: it failed,
    ``why``)."""
    inf = float("inf")
    past_shape = layout.past_shape(case[0], case[2])

    def failed(error: str) -> Seq2SeqCase:
        return Seq2SeqCase(*case, inf, inf, inf, False, one_line(error, 240), inf, past_shape)

    for ran in (states, want):
        if ran.outputs is None:
            return failed(f"PyTorch fails on this step: {ran.error}")
    if got_states is None or got is None:
        return failed(why or "onnxruntime fails")
    pairs = ((tuple(got_states), tuple(states.outputs)), (tuple(got[:1]), tuple(want.outputs[:1])),
             (tuple(got[1:]), tuple(want.outputs[1:])))
    wrong = next(((g.shape, w.shape) for mine, ref in pairs for g, w in zip(mine, ref) if g.shape != w.shape), None)
    if wrong is not None:
        return failed(f"shape {list(wrong[0])} where PyTorch gives {list(wrong[1])}")
    label = (", ".join(map(str, case)),)
    enc, logits, presents = (compare_accuracy(RunResults(label, (mine,)), RunResults(label, (ref,)), tolerance,
                                              cosine_of=None) for mine, ref in pairs)
    return Seq2SeqCase(*case, enc.max_abs_err, logits.max_abs_err, presents.max_abs_err,
                       enc.within and logits.within and presents.within, None,
                       max(enc.max_rel_err, logits.max_rel_err, presents.max_rel_err), past_shape)


def prove_seq2seq(model: nn.Module, layout: Seq2SeqLayout, sessions: Sessions, *, tolerance: Tolerance = FP32,
                  new_tokens: int = NEW_TOKENS, seed: int = 0, target: Target = CPU_TARGET) -> Seq2SeqProof:
    """Every :func:`step_matrix` case, then greedy generation (one row; a batch of three with padded sources);
    PyTorch on ``target``'s device (the model moved there and back), ``sessions`` opened on its providers."""
    with on_target(model, target) as moved:
        return _proven(moved, layout, sessions, tolerance, new_tokens, seed, target)


def _proven(model: nn.Module, layout: Seq2SeqLayout, sessions: Sessions, tolerance: Tolerance, new_tokens: int,
            seed: int, target: Target) -> Seq2SeqProof:
    wrappers = tuple(OnDevice(w, target.torch_device) if target.gpu else w for w in (
        Encoder(model, layout).eval(), FirstStep(model, layout).eval(), WithPast(model, layout).eval()))
    cases = step_cases(sessions, wrappers, layout, tolerance, seed)
    prompt = len(layout.rules.decoder_prompt)
    if new_tokens > layout.max_length or prompt >= layout.max_length:
        raise UsageError(f"--max-length {layout.max_length} leaves no room for {new_tokens} generated tokens",
                         f"give --max-length {new_tokens + prompt} or more")
    new_tokens = min(new_tokens, layout.max_length - prompt)  # Whisper's prompt tokens take their room
    source = min(7, layout.max_source)
    one = encoder_inputs(layout, 1, source, seed=seed + 101)
    batch = encoder_inputs(layout, 3, source, padded=True, seed=seed + 102)
    lengths = tuple(padded_lengths(3, source)) if layout.dynamic else (layout.max_source,) * 3
    rules = layout.rules
    gens = (generation_check("one row", sessions, model, layout, one, (lengths[0],), new_tokens, rules),
            generation_check("padded batch", sessions, model, layout, batch, lengths,
                             new_tokens, rules.without_eos()))
    return Seq2SeqProof(tolerance, cases, gens, device=target.device)


def generation_check(name: str, sessions: Sessions, model: nn.Module, layout: Seq2SeqLayout, inputs: list,
                     lengths: tuple[int, ...], new_tokens: int, rules: GreedyRules) -> GenerationCheck:
    """``new_tokens`` greedy tokens by :func:`generate_greedy` under ``rules`` against ``model.generate`` with
    the model's generation config (its end-of-sequence stop only when ``rules`` keep it)."""
    return GenerationCheck.of(name, lengths, new_tokens, lambda: (
        generate_greedy(sessions, layout, [t.numpy() for t in inputs], new_tokens, rules),
        reference_generate(model, layout, inputs, new_tokens, rules)))


def reference_generate(model: nn.Module, layout: Seq2SeqLayout, inputs: list, new_tokens: int,
                       rules: GreedyRules = PLAIN) -> np.ndarray:
    """``model.generate`` greedy under the model's generation config (:func:`reference_config`), the decoder
    started on the start token and ``rules.decoder_prompt``: [batch, steps] new token ids (fewer than
    ``new_tokens`` when every row ended). Whisper's own ``generate`` (language detection, timestamps, long-form
    segments) is bypassed for transformers' generic one, given Whisper's prompt tokens."""
    from transformers import GenerationMixin

    config = reference_config(model.generation_config, new_tokens, rules)
    config.update(decoder_start_token_id=layout.start_token)
    saved = model.generation_config
    model.generation_config = config  # unset fields fall back to the model's: its eos must not be there
    device = next(model.parameters()).device
    kw = {name: t.to(device) for name, t in zip(layout.encoder_inputs, inputs)}
    start = torch.tensor([[layout.start_token, *rules.decoder_prompt]] * inputs[0].shape[0], dtype=torch.long,
                         device=device)
    try:
        with torch.inference_mode():
            out = GenerationMixin.generate(model, **kw, decoder_input_ids=start, generation_config=config)
    finally:
        model.generation_config = saved
    return out[:, start.shape[1]:].cpu().numpy()
