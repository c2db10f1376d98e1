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
from onnxport.decoder.prove import reference_config
from onnxport.decoder.records import GenerationCheck
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


def _errors(got, want, tolerance: Tolerance) -> tuple[float, bool, str | None]:
    """The largest absolute error over pairs of arrays, whether all are within ``tolerance``, a shape error."""
    worst, ok = 0.0, True
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return float("inf"), False, f"shape {list(g.shape)} where PyTorch gives {list(w.shape)}"
        diff = np.abs(g.astype(np.float64) - w)
        worst = max(worst, float(diff.max(initial=0.0)))
        ok = ok and bool(np.all(tolerance.within(diff, w)))
    return worst, ok, None


def step_case(sessions: Sessions, wrappers: tuple[nn.Module, ...], layout: Seq2SeqLayout, case: Case,
              tolerance: Tolerance, seed: int) -> Seq2SeqCase:
    """The encoder on the case's sources, then one decoder step (the first, or one on a random cache) fed
    PyTorch's encoder output: onnxruntime against the PyTorch model at each file."""
    batch, source, past, new, padded = case
    enc = encoder_inputs(layout, batch, source, padded=padded, seed=seed)
    mask = enc[1] if layout.encoder_mask else None
    ids = decoder_ids(layout, batch, new, seed)
    try:
        with torch.inference_mode():
            states = wrappers[0](*enc)
            if past == 0:
                inputs = first_inputs(layout, ids, states, mask)
            else:
                inputs = with_past_inputs(layout, ids, mask, random_cache(layout, batch, past, states.shape[1], seed))
            want = [t.float().numpy() for t in wrappers[1 if past == 0 else 2](*inputs)]
        names = layout.encoder_inputs
        got_states = sessions.encoder.run(["last_hidden_state"], {n: t.numpy() for n, t in zip(names, enc)})
        sess, names = ((sessions.decoder, layout.decoder_inputs) if past == 0
                       else (sessions.with_past, layout.with_past_inputs))
        got = sess.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
    except Exception as e:  # noqa: BLE001 - recorded as the case's failure
        inf = float("inf")
        return Seq2SeqCase(batch, source, past, new, padded, inf, inf, inf, False, one_line(e, 240))
    enc_err, enc_ok, why = _errors(got_states, [states.numpy()], tolerance)
    logit_err, logit_ok, why_l = _errors(got[:1], want[:1], tolerance)
    cache_err, cache_ok, why_c = _errors(got[1:], want[1:], tolerance)
    return Seq2SeqCase(batch, source, past, new, padded, enc_err, logit_err, cache_err,
                       enc_ok and logit_ok and cache_ok, why or why_l or why_c)


def prove_seq2seq(model: nn.Module, layout: Seq2SeqLayout, sessions: Sessions, *, tolerance: Tolerance = FP32,
                  new_tokens: int = NEW_TOKENS, seed: int = 0) -> Seq2SeqProof:
    """Every :func:`step_matrix` case, then greedy generation (one row; a batch of three with padded sources)."""
    wrappers = (Encoder(model, layout).eval(), FirstStep(model, layout).eval(), WithPast(model, layout).eval())
    cases = tuple(step_case(sessions, wrappers, layout, c, tolerance, seed + i)
                  for i, c in enumerate(step_matrix(layout)))
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
    return Seq2SeqProof(tolerance, cases, gens)


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
    kw = dict(zip(layout.encoder_inputs, inputs))
    start = torch.tensor([[layout.start_token, *rules.decoder_prompt]] * inputs[0].shape[0], dtype=torch.long)
    try:
        with torch.inference_mode():
            out = GenerationMixin.generate(model, **kw, decoder_input_ids=start, generation_config=config)
    finally:
        model.generation_config = saved
    return out[:, start.shape[1]:].numpy()
