"""Step-wise greedy generation with an exported decoder: one step at a time, so a server can stream each token
as it comes. The feeding rules are those of :func:`onnxport.decoder.prove.greedy` (the prompt on an empty
cache, then one token per step with the presents fed back as past and position ids from the mask's cumsum)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.decoder.records import CacheLayout


def check_room(layout: CacheLayout, prompt: int, new_tokens: int) -> None:
    """UsageError when a prompt of ``prompt`` tokens plus ``new_tokens`` exceeds ``layout.max_length``."""
    if prompt < 1:
        raise UsageError("the prompt is empty", "give at least one prompt token")
    if new_tokens < 1:
        raise UsageError(f"{new_tokens} new tokens asked for", "ask for at least one new token")
    if prompt + new_tokens > layout.max_length:
        raise UsageError(f"a prompt of {prompt} tokens plus {new_tokens} new ones exceeds the declared maximum of "
                         f"{layout.max_length} tokens",
                         f"shorten the prompt to {max(0, layout.max_length - new_tokens)} tokens, ask for fewer "
                         "new tokens, or export again with a larger --max-length")


def step_feeds(layout: CacheLayout, ids: np.ndarray, mask: np.ndarray, past: list[np.ndarray]) -> dict:
    """The feeds of one step: ``ids`` [batch, new] on top of ``past``, ``mask`` covering past + new."""
    feeds = {"input_ids": ids, "attention_mask": mask}
    if layout.position_ids:
        pos = np.cumsum(mask, -1) - 1
        pos[mask == 0] = 1
        feeds["position_ids"] = pos[:, -ids.shape[1]:]
    feeds.update(zip(layout.input_names[len(feeds):], past))
    return feeds


def past_dtype(sess) -> np.dtype:
    """The dtype of the session's cache inputs (float32 unless the model takes float16 or double)."""
    kinds = {"tensor(float16)": np.float16, "tensor(double)": np.float64}
    first = next((i.type for i in sess.get_inputs() if i.name.startswith("past_key_values.")), None)
    return np.dtype(kinds.get(first, np.float32))


def stream_greedy(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
                  max_new_tokens: int, eos_token_id: int | None = None) -> Iterator[np.ndarray]:
    """Greedy tokens one step at a time: yields [batch] int64 token ids per step, at most ``max_new_tokens``
    steps, and stops after the step where every row has produced ``eos_token_id`` (that step is yielded; rows
    that finished earlier keep generating, as ``generate`` does before it pads). A prompt that leaves no room
    is a UsageError before anything runs."""
    batch, prompt = input_ids.shape
    check_room(layout, prompt, max_new_tokens)
    mask = attention_mask.astype(np.int64)
    ids = input_ids.astype(np.int64)
    dtype = past_dtype(sess)
    past = [np.zeros(layout.past_shape(kind, batch, 0), dtype) for _ in range(layout.layers) for kind in ("key", "value")]
    done = np.zeros(batch, bool)
    outputs = list(layout.output_names)
    for _ in range(max_new_tokens):
        logits, *past = sess.run(outputs, step_feeds(layout, ids, mask, past))
        token, ended = greedy_token(logits, done, eos_token_id)
        yield token
        if ended:
            return
        ids = token[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)


def greedy_token(logits: np.ndarray, done: np.ndarray, eos_token_id: int | None) -> tuple[np.ndarray, bool]:
    """Each row's greedy token from the last position of ``logits``, and whether every row has now ended
    (``done`` marks in place the rows that produced ``eos_token_id``)."""
    token = logits[:, -1].argmax(-1).astype(np.int64)
    if eos_token_id is None:
        return token, False
    done |= token == eos_token_id
    return token, bool(done.all())


def stacked(steps: list[np.ndarray], batch: int) -> np.ndarray:
    """The tokens of each step as [batch, steps] token ids (no steps: [batch, 0])."""
    return np.stack(steps, axis=1) if steps else np.zeros((batch, 0), np.int64)


def generate_greedy(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
                    max_new_tokens: int, eos_token_id: int | None = None) -> np.ndarray:
    """All of :func:`stream_greedy` at once: [batch, steps] token ids."""
    return stacked(list(stream_greedy(sess, layout, input_ids, attention_mask, max_new_tokens, eos_token_id)),
                   input_ids.shape[0])
