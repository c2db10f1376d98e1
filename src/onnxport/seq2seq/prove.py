"""The proof of an encoder-decoder with its cache: each step case (sources of several lengths, padded rows,
decoder past 0 … max-1) against PyTorch, then greedy generation by the three files against
``model.generate`` token for token."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.records import FP32, Tolerance
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
    sources = [layout.max_source] if layout.speech else sorted({1, min(7, layout.max_source), layout.max_source})
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
        ok = ok and bool(np.all(diff <= tolerance.atol + tolerance.rtol * np.abs(w)))
    return worst, ok, None


def step_case(sessions: Sessions, wrappers: tuple[nn.Module, ...], layout: Seq2SeqLayout, case: Case,
              tolerance: Tolerance, seed: int) -> Seq2SeqCase:
    """The encoder on the case's sources, then one decoder step (the first, or one on a random cache) fed
    PyTorch's encoder output: onnxruntime against the PyTorch model at each file."""
    batch, source, past, new, padded = case
    enc = encoder_inputs(layout, batch, source, padded=padded, seed=seed)
    mask = None if layout.speech else enc[1]
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
    if new_tokens > layout.max_length:
        raise UsageError(f"--max-length {layout.max_length} leaves no room for {new_tokens} generated tokens",
                         f"give --max-length {new_tokens} or more")
    source = min(7, layout.max_source)
    one = encoder_inputs(layout, 1, source, seed=seed + 101)
    batch = encoder_inputs(layout, 3, source, padded=True, seed=seed + 102)
    lengths = (layout.max_source,) * 3 if layout.speech else tuple(padded_lengths(3, source))
    gens = (generation_check("one row", sessions, model, layout, one, (lengths[0],), new_tokens),
            generation_check("padded batch", sessions, model, layout, batch, lengths, new_tokens))
    return Seq2SeqProof(tolerance, cases, gens)


def generation_check(name: str, sessions: Sessions, model: nn.Module, layout: Seq2SeqLayout, inputs: list,
                     lengths: tuple[int, ...], new_tokens: int) -> GenerationCheck:
    """``new_tokens`` greedy tokens by :func:`generate_greedy` against ``model.generate(do_sample=False)``."""
    return GenerationCheck.of(name, lengths, new_tokens, lambda: (
        generate_greedy(sessions, layout, [t.numpy() for t in inputs], new_tokens),
        reference_generate(model, layout, inputs, new_tokens)))


PLAIN_GREEDY = dict(do_sample=False, num_beams=1, min_new_tokens=0, use_cache=True,
                    eos_token_id=None, bos_token_id=None, temperature=None, top_p=None, top_k=None,
                    forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0,
                    encoder_no_repeat_ngram_size=0, repetition_penalty=1.0, bad_words_ids=None,
                    suppress_tokens=None, begin_suppress_tokens=None, forced_decoder_ids=None,
                    renormalize_logits=False, length_penalty=1.0)


def reference_generate(model: nn.Module, layout: Seq2SeqLayout, inputs: list, new_tokens: int) -> np.ndarray:
    """``model.generate`` greedy, exactly ``new_tokens`` tokens after the start token: [batch, new_tokens]. The
    generation config is swapped for plain greedy decoding (no end-of-sequence stop, no forced, suppressed or
    banned tokens: the exported files give the logits, the loop takes their argmax). Whisper's own
    ``generate`` (language detection, timestamps) is bypassed for transformers' generic one."""
    from transformers import GenerationMixin

    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=new_tokens, decoder_start_token_id=layout.start_token, pad_token_id=0,
                  **PLAIN_GREEDY)
    saved = model.generation_config
    model.generation_config = config  # unset fields fall back to the model's: its eos must not be there
    kw = ({"input_features": inputs[0]} if layout.speech
          else {"input_ids": inputs[0], "attention_mask": inputs[1]})
    try:
        with torch.inference_mode():
            out = GenerationMixin.generate(model, **kw, generation_config=config)
    finally:
        model.generation_config = saved
    return out[:, 1:].numpy()
