"""Step-wise greedy generation with an exported decoder: one step at a time, so a server can stream each token
as it comes, under the generation config's rules (:mod:`onnxport.core.greedy`). The feeding rules are those of :func:`onnxport.decoder.prove.greedy` (the prompt on an empty
cache, then one token per step with the presents fed back as past and position ids from the mask's cumsum)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.greedy import GreedyRules
from onnxport.decoder.records import CacheLayout
from onnxport.runtime.binding import CPU_TARGET, CarriedSteps, Target


def check_room(layout: CacheLayout, prompt: int, new_tokens: int) -> None:
    """UsageError when a prompt of ``prompt`` tokens plus ``new_tokens`` exceeds ``layout.max_length``."""
    if prompt < 1:
        raise UsageError("the prompt is empty", "give at least one prompt token")
    if new_tokens < 1:
        raise UsageError(f"{new_tokens} new tokens asked for", "ask for at least one new token")
    most = layout.max_length
    if prompt + new_tokens > most:
        fits = [f"ask for at most {most - prompt} new tokens with this prompt"] if prompt < most else []
        if new_tokens < most:
            fits.append(f"shorten the prompt to {most - new_tokens} tokens for {new_tokens} new ones")
        raise UsageError(f"a prompt of {prompt} tokens plus {new_tokens} new ones exceeds the declared maximum of "
                         f"{most} tokens", "; ".join([*fits, "or export again with a larger --max-length"]))


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


def _started(layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray, max_new_tokens: int,
             rules: GreedyRules | None):
    """What every greedy loop starts from: the room checked, the ids and mask as int64, the rules (None: the
    layout's, else plain argmax) and their decoding state."""
    check_room(layout, input_ids.shape[1], max_new_tokens)
    mask = attention_mask.astype(np.int64)
    ids = input_ids.astype(np.int64)
    rules = rules if rules is not None else layout.generation or GreedyRules()
    return ids, mask, rules, rules.start(ids, max_new_tokens, mask)


def stream_greedy(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
                  max_new_tokens: int, rules: GreedyRules | None = None) -> Iterator[np.ndarray]:
    """Greedy tokens one step at a time under ``rules`` (the generation config's processors and end-of-sequence
    stop; None: the layout's, else plain argmax): yields [batch] int64 token ids per step, at most
    ``max_new_tokens`` steps, and stops after the step where every row has produced an end-of-sequence token
    (rows that finished earlier get the pad token, as ``generate`` gives them). A prompt that leaves no room is
    a UsageError before anything runs."""
    ids, mask, rules, decoding = _started(layout, input_ids, attention_mask, max_new_tokens, rules)
    batch = ids.shape[0]
    dtype = past_dtype(sess)
    past = [np.zeros(layout.past_shape(kind, batch, 0), dtype) for _ in range(layout.layers) for kind in ("key", "value")]
    outputs = list(layout.output_names)
    for _ in range(max_new_tokens):
        logits, *past = sess.run(outputs, step_feeds(layout, ids, mask, past))
        token = decoding.step(logits[:, -1])
        yield token
        if decoding.finished:
            return
        ids = token[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)


SHARED_BUFFER = ("onnxport.cache_buffer", "shared")  # metadata of a file whose past and present share one buffer


def shares_buffer(sess) -> bool:
    """Whether the session's file takes its past and returns its present in one buffer at the maximum length
    (GroupQueryAttention: the ``gqa`` variant and those built on it)."""
    key, value = SHARED_BUFFER
    return sess.get_modelmeta().custom_metadata_map.get(key) == value


def graphed(sess) -> bool:
    """Whether the session was opened with the CUDA provider's CUDA graph on."""
    options = sess.get_provider_options().get("CUDAExecutionProvider", {})
    return str(options.get("enable_cuda_graph", "0")) == "1"


def carried_steps(sess, layout: CacheLayout, batch: int, target: Target = CPU_TARGET, *,
                  shared: bool | None = None, graph: bool | None = None) -> CarriedSteps:
    """The session's cache kept on ``target``'s device, allocated once at ``layout.max_length`` for ``batch``
    rows and rebound at each step (:class:`~onnxport.runtime.binding.CarriedSteps`): per past/present pair two
    buffers, or one where the file shares them (``shared``, None: :func:`shares_buffer`); ``graph`` (None: the
    session's CUDA graph, :func:`graphed`): the one-token steps on fixed shapes and addresses, the mask padded
    to the maximum length, replayed as one CUDA graph."""
    pairs = [(f"past_key_values.{i}.{kind}", f"present.{i}.{kind}", layout.past_shape(kind, batch, layout.max_length))
             for i in range(layout.layers) for kind in ("key", "value")]
    shared = shares_buffer(sess) if shared is None else shared
    graph = shared and graphed(sess) if graph is None else graph
    return CarriedSteps(sess, target, pairs, past_dtype(sess), shared=shared, graph=graph,
                        padded=("attention_mask",))


def stream_bound(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
                 max_new_tokens: int, rules: GreedyRules | None = None, target: Target = CPU_TARGET, *,
                 steps: CarriedSteps | None = None) -> Iterator[np.ndarray]:
    """:func:`stream_greedy`'s tokens with the cache kept on ``target``'s device through IO binding
    (:func:`carried_steps`, or ``steps`` made by it for these rows): the presents are never copied to the host,
    and of the logits only each row's next token is, unless the rules change scores (then the last position's)."""
    ids, mask, rules, decoding = _started(layout, input_ids, attention_mask, max_new_tokens, rules)
    batch = ids.shape[0]
    steps = steps if steps is not None else carried_steps(sess, layout, batch, target)
    if steps.shared and not mask.all():
        raise UsageError("this file's attention (GroupQueryAttention) takes unpadded rows only",
                         "send one prompt per request, or serve the proven export")
    for _ in range(max_new_tokens):
        feeds = step_feeds(layout, ids, mask, [])
        steps.step(feeds, ids.shape[1])
        token = (decoding.take(steps.last_token()) if rules.argmax_only
                 else decoding.step(steps.last_scores()))
        yield token
        if decoding.finished:
            return
        ids = token[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)


def stacked(steps: list[np.ndarray], batch: int) -> np.ndarray:
    """The tokens of each step as [batch, steps] token ids (no steps: [batch, 0])."""
    return np.stack(steps, axis=1) if steps else np.zeros((batch, 0), np.int64)


def generate_greedy(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
                    max_new_tokens: int, rules: GreedyRules | None = None, target: Target | None = None
                    ) -> np.ndarray:
    """All of :func:`stream_greedy` at once: [batch, steps] token ids; with a ``target``, the cache kept on its
    device (:func:`stream_bound`)."""
    loop = stream_greedy(sess, layout, input_ids, attention_mask, max_new_tokens, rules) if target is None else \
        stream_bound(sess, layout, input_ids, attention_mask, max_new_tokens, rules, target)
    return stacked(list(loop), input_ids.shape[0])
