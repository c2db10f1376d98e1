"""The encoder-decoder's greedy loop over its three files, written once: the encoder once, the first decoder step
on the start token and the decoder prompt (its presents hold the decoder's and the encoder's keys and values),
then one token per step with ``decoder_with_past_model``, the decoder presents fed back beside the encoder's
unchanged ones; the generation config's rules pick each token. onnxport's generation
(:mod:`onnxport.seq2seq.generation`) runs it, and so does the Triton python backend's ``model.py``
(:mod:`onnxport.seq2seq.triton_model`), beside which ``onnxport triton`` copies this file as ``greedy_loop.py``:
it imports numpy only (the sessions are onnxruntime's, the rules ``onnxport.core.greedy.GreedyRules`` or their
copy beside model.py), so that it runs there without onnxport."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

KINDS = ("decoder", "encoder")  # self-attention cache, cross-attention cache


def past_names(layers: int, prefix: str, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """``{prefix}.{i}.{kind}.{key|value}`` of every layer, in the order the files take and give them."""
    return [f"{prefix}.{i}.{kind}.{kv}" for i in range(layers) for kind in kinds for kv in ("key", "value")]


def stream(sessions: Sequence, layers: int, start_token: int, rules, feeds: dict, max_new_tokens: int
           ) -> Iterator[np.ndarray]:
    """Greedy tokens one step at a time under ``rules`` (``decoder_prompt`` and ``start(ids, max_new_tokens)``,
    whose ``step(logits)`` picks a token and says when every row has ``finished``): yields [batch] int64 ids per
    step, at most ``max_new_tokens`` steps, stopping after the step where every row has produced an
    end-of-sequence token. ``sessions``: (encoder, first decoder step, decoder with past), each with onnxruntime's
    ``run(names, feeds)``; ``feeds``: the encoder's (its ``attention_mask``, when there, masks the decoders'
    cross-attention). Only the new tokens are yielded."""
    encoder, first, with_past = sessions
    (states,) = encoder.run(["last_hidden_state"], feeds)
    masks = {"encoder_attention_mask": feeds["attention_mask"]} if "attention_mask" in feeds else {}
    ids = np.tile(np.asarray([int(start_token), *rules.decoder_prompt], np.int64), (states.shape[0], 1))
    decoding = rules.start(ids, max_new_tokens)
    logits, *presents = first.run(["logits", *past_names(layers, "present")],
                                  {"input_ids": ids, "encoder_hidden_states": states, **masks})
    own = [presents[4 * i + k] for i in range(layers) for k in (0, 1)]
    cross = [presents[4 * i + k] for i in range(layers) for k in (2, 3)]
    outputs, names = ["logits", *past_names(layers, "present", ("decoder",))], past_names(layers, "past_key_values")
    for step in range(max_new_tokens):
        if step:
            cache = [t for i in range(layers) for t in (own[2 * i], own[2 * i + 1], cross[2 * i], cross[2 * i + 1])]
            logits, *own = with_past.run(outputs, {"input_ids": ids, **masks, **dict(zip(names, cache))})
        token = decoding.step(logits[:, -1])
        yield token
        if decoding.finished:
            return
        ids = token[:, None]


def generate(sessions: Sequence, layers: int, start_token: int, rules, feeds: dict, max_new_tokens: int
             ) -> np.ndarray:
    """All of :func:`stream` at once: [batch, steps] token ids."""
    return np.stack(list(stream(sessions, layers, start_token, rules, feeds, max_new_tokens)), axis=1)
