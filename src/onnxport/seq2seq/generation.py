"""Step-wise greedy generation with the three exported files (the loop: :mod:`onnxport.seq2seq.greedy_loop`, which
the Triton python backend runs too): the sessions, the encoder's feeds checked against the layout, the room the
decoder's cache leaves; the generation config's rules (:mod:`onnxport.core.greedy`) pick each token."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.greedy import GreedyRules
from onnxport.decoder.generation import stacked
from onnxport.seq2seq.greedy_loop import stream
from onnxport.seq2seq.records import DECODER_FILE, ENCODER_FILE, WITH_PAST_FILE, Seq2SeqLayout, final_name


class Sessions(NamedTuple):
    """onnxruntime sessions of the three files."""

    encoder: object
    decoder: object
    with_past: object


def open_sessions(folder: str | Path, proven: bool = True, providers: Sequence[str] | None = None,
                  paths: Sequence[Path] | None = None, **kw) -> Sessions:
    """Sessions of the three files in ``folder`` (``proven`` False: the ``*.unverified.onnx`` ones), or of
    ``paths`` (encoder, decoder, with past) when given."""
    from onnxport.runtime.sessions import session

    files = paths or [Path(folder) / final_name(n, proven) for n in (ENCODER_FILE, DECODER_FILE, WITH_PAST_FILE)]
    return Sessions(*(session(p, providers=list(providers or ["CPUExecutionProvider"]), **kw) for p in files))


def check_room(layout: Seq2SeqLayout, new_tokens: int, rules: GreedyRules | None = None) -> None:
    """UsageError when ``new_tokens`` (after the start token and the decoder prompt of ``rules``) exceed the
    decoder's ``max_length``."""
    if new_tokens < 1:
        raise UsageError(f"{new_tokens} new tokens asked for", "ask for at least one new token")
    prompt = len((rules or layout.rules).decoder_prompt)
    if prompt + new_tokens > layout.max_length:
        after = f" after the {prompt} tokens of the decoder prompt" if prompt else ""
        raise UsageError(f"{new_tokens} new tokens{after} exceed the declared maximum of {layout.max_length} "
                         "decoder tokens", "ask for fewer new tokens, or export again with a larger --max-length")


def encoder_feeds(layout: Seq2SeqLayout, inputs: Sequence[np.ndarray]) -> dict:
    """The encoder's feeds (:attr:`Seq2SeqLayout.encoder_inputs`, in order; a global attention mask left out is
    none, as ``generate`` without one); a dynamic source that is empty or longer than ``max_source`` is a
    UsageError."""
    main = np.asarray(inputs[0])
    if layout.dynamic:
        length = main.shape[1 + layout.source_dims.index("source")]
        if length < 1:
            raise UsageError("the source is empty", "give at least one source token")
        if length > layout.max_source:
            unit = "tokens" if layout.source_input == "input_ids" else "frames"
            raise UsageError(f"a source of {length} {unit} exceeds the declared maximum of {layout.max_source}",
                             "shorten the source")
    feeds = {layout.source_input: main.astype(np.int64 if layout.source_input == "input_ids" else np.float32)}
    for name, value in zip(layout.encoder_inputs[1:], inputs[1:]):
        feeds[name] = np.asarray(value).astype(np.int64)
    if layout.global_attention and "global_attention_mask" not in feeds:
        feeds["global_attention_mask"] = np.zeros(main.shape[:2], np.int64)
    return feeds


def stream_greedy(sessions: Sessions, layout: Seq2SeqLayout, inputs: Sequence[np.ndarray], max_new_tokens: int,
                  rules: GreedyRules | None = None) -> Iterator[np.ndarray]:
    """Greedy tokens one step at a time under ``rules`` (the generation config's processors, end-of-sequence
    stop and decoder prompt; None: the layout's): yields [batch] int64 ids per step, at most ``max_new_tokens``
    steps, stopping after the step where every row has produced an end-of-sequence token (rows that ended
    earlier get the pad token). ``inputs``: the encoder's (ids and mask, features, or pixels). The first decoder step
    runs on the start token and the decoder prompt; only the new tokens are yielded."""
    rules = rules if rules is not None else layout.rules
    check_room(layout, max_new_tokens, rules)
    yield from stream(sessions, layout.layers, layout.start_token, rules, encoder_feeds(layout, inputs),
                      max_new_tokens)


def generate_greedy(sessions: Sessions, layout: Seq2SeqLayout, inputs: Sequence[np.ndarray], max_new_tokens: int,
                    rules: GreedyRules | None = None) -> np.ndarray:
    """All of :func:`stream_greedy` at once: [batch, steps] token ids."""
    return stacked(list(stream_greedy(sessions, layout, inputs, max_new_tokens, rules)), inputs[0].shape[0])
