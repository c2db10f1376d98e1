"""Triton's generate extension for decoders and encoder-decoders served with their cache (the
:class:`~onnxport.families.serving.Extension` :data:`onnxport.decoder.serving.GENERATE` adds to the server):
``POST /v2/models/{m}/generate`` (one JSON answer) and ``.../generate_stream`` (server-sent events, one per token,
then a final one). Text in and out when the model folder has a ``tokenizer/``, token ids (``input_ids`` in,
``output_ids`` out) always; a speech model (Whisper) takes ``input_features`` or ``audio`` (its generator's
``source``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.greedy import GreedyRules
from onnxport.families.serving import BadRequest

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096
CHARS_PER_TOKEN = 64  # text longer than this many characters per allowed token is refused untokenized
GREEDY_VALUES = {"temperature": (0, 0.0), "do_sample": (False,), "top_k": (0, 1), "top_p": (1, 1.0)}
KNOWN_PARAMETERS = ("max_tokens", "ignore_eos", "stream", *GREEDY_VALUES)
NOT_A_DECODER = ("generate needs a decoder exported with its KV cache (inputs input_ids, attention_mask and "
                 "past_key_values.*; outputs logits and present.*)")


class Generator(Protocol):
    """What the generate extension asks of a model family's generator (its extension's ``bind`` makes one per
    served model): its layout (``vocab``, ``max_length``), its tokenizer (None: token ids only), the generation
    config's rules, a request's source when it is not a prompt of token ids (a speech model's features or
    audio), a check of the room left, and the step loop."""

    layout: Any
    tokenizer: Any

    @property
    def rules(self) -> GreedyRules: ...

    def source(self, body: dict, model: str) -> np.ndarray | None: ...

    def check_room(self, prompt: int, new_tokens: int) -> None: ...

    def stream(self, sess: Any, ids: np.ndarray, max_tokens: int, rules: GreedyRules) -> Iterator[np.ndarray]: ...

    def to_dict(self) -> dict: ...

    def config_parameters(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class GenerateRequest:
    """A checked generate request: the prompt's token ids (a speech model: its features or audio, ``source``)
    and how many to generate."""

    id: str | None
    input_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    source: np.ndarray | None = field(default=None, compare=False, repr=False)  # speech: features or audio

    def to_dict(self) -> dict:
        shape = None if self.source is None else list(self.source.shape)
        return {"id": self.id, "input_ids": list(self.input_ids), "max_tokens": self.max_tokens,
                "ignore_eos": self.ignore_eos, **({"source_shape": shape} if shape else {})}


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parameters(params: object) -> tuple[int, bool]:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    unknown = sorted(set(params) - set(KNOWN_PARAMETERS))
    if unknown:
        raise BadRequest(f"unsupported parameter(s) {unknown}; this server decodes greedily and takes "
                         f"{list(KNOWN_PARAMETERS)}")
    for key, greedy in GREEDY_VALUES.items():
        if key in params and (params[key] not in greedy or type(params[key]) not in {type(v) for v in greedy}):
            raise BadRequest(f"parameter {key}={params[key]!r} asks for sampling; this server decodes greedily "
                             f"only: leave it out or send {key}={greedy[0]!r}")
    max_tokens = params.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not _int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise BadRequest(f"parameter max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}, got {max_tokens!r}")
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"parameter ignore_eos must be true or false, got {ignore_eos!r}")
    if not isinstance(params.get("stream", False), bool):
        raise BadRequest("parameter stream must be true or false")
    return max_tokens, ignore_eos


def _prompt(body: dict, gen: Generator, model: str) -> tuple[int, ...]:
    has_text, has_ids = "text_input" in body, "input_ids" in body
    if has_text == has_ids:
        raise BadRequest("send either 'text_input' (a string) or 'input_ids' (a list of token ids)")
    if has_text:
        text = body["text_input"]
        if not isinstance(text, str):
            raise BadRequest("'text_input' must be a string")
        if gen.tokenizer is None:
            raise BadRequest(f"model '{model}' has no tokenizer: send input_ids, or export with a tokenizer")
        if len(text) > CHARS_PER_TOKEN * gen.layout.max_length:
            raise BadRequest(f"'text_input' has {len(text)} characters, far more than the {gen.layout.max_length} "
                             "tokens the model takes: shorten it")
        ids = [int(i) for i in gen.tokenizer.encode(text)]
    else:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not all(_int(i) for i in ids):
            raise BadRequest("'input_ids' must be a list of integer token ids")
    vocab = gen.layout.vocab
    bad = [i for i in ids if i < 0 or (vocab and i >= vocab)]
    if bad:
        raise BadRequest(f"the prompt holds token id {bad[0]}, outside the vocabulary 0..{vocab - 1}")
    return tuple(ids)


def parse_request(body: object, gen: Generator, model: str) -> GenerateRequest:
    """Check a generate request (BadRequest 400 for anything the client must fix, before anything runs)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with 'text_input' or 'input_ids'")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    max_tokens, ignore_eos = _parameters(body.get("parameters"))
    source = gen.source(body, model)  # a speech model's features or audio; None: a prompt of token ids
    ids = () if source is not None else _prompt(body, gen, model)
    try:
        gen.check_room(1 if source is not None else len(ids), max_tokens)
    except UsageError as e:
        raise BadRequest(f"{e.message}: {e.hint}") from None
    return GenerateRequest(request_id, ids, max_tokens, ignore_eos, source)


class TextPieces:
    """Text for a growing list of token ids, piece by piece: each piece is what the whole decode gained, held
    back while it ends in an incomplete character, so that the pieces always join into the whole text."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._gain(final=False)

    def flush(self) -> str:
        return self._gain(final=True)

    def _gain(self, *, final: bool) -> str:
        text = self.text()
        if (text.endswith("\ufffd") and not final) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


def tokens(sess, gen: Generator, req: GenerateRequest) -> Iterator[int]:
    """The generated token ids, one at a time, under the generation config's rules; an end-of-sequence token ends
    it unseen unless ``ignore_eos``."""
    rules = gen.rules.without_eos() if req.ignore_eos else gen.rules
    ids = np.asarray([req.input_ids], np.int64) if req.source is None else req.source
    for step in gen.stream(sess, ids, req.max_tokens, rules):
        token = int(step[0])
        if token in rules.eos_token_ids:
            return
        yield token


async def _steps(sess, gen: Generator, req: GenerateRequest) -> AsyncIterator[int]:
    """:func:`tokens` with each step run in a worker thread (the event loop keeps serving)."""
    loop = asyncio.get_running_loop()
    it = tokens(sess, gen, req)
    done = object()
    try:
        while (token := await loop.run_in_executor(None, next, it, done)) is not done:
            yield token
    finally:
        with contextlib.suppress(ValueError):  # still running in its thread (the client left): it ends there
            it.close()


def _head(model: str, version: str, req: GenerateRequest) -> dict:
    head = {"model_name": model, "model_version": version}
    if req.id is not None:
        head["id"] = req.id
    return head


class GenerateOutcome:
    """What one generate request did, for the metrics: its start, its tokens and why it stopped."""

    def __init__(self, req: GenerateRequest) -> None:
        self.start = time.perf_counter()
        self.count = 0
        self.req = req
        self.error: str | None = None

    @property
    def finish_reason(self) -> str:
        return "length" if self.count >= self.req.max_tokens else "stop"

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


async def generate(sess, gen: Generator, req: GenerateRequest, model: str, version: str,
                   outcome: GenerateOutcome) -> dict:
    """The whole answer of ``/generate``: ``output_ids``, ``text_output`` (with a tokenizer), ``finish_reason``."""
    ids = []
    async for token in _steps(sess, gen, req):
        ids.append(token)
        outcome.count += 1
    answer = {**_head(model, version, req), "output_ids": ids, "finish_reason": outcome.finish_reason}
    if gen.tokenizer is not None:
        pieces = TextPieces(gen.tokenizer)
        pieces.ids = ids
        answer["text_output"] = pieces.text()
    return answer


def sse(payload: dict, event: str | None = None) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    kind = f"event: {event}\n" if event else ""
    return f"{kind}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def generate_stream(sess, gen: Generator, req: GenerateRequest, model: str, version: str,
                          outcome: GenerateOutcome) -> AsyncIterator[bytes]:
    """The events of ``/generate_stream``: one per token (``output_ids`` [token], ``text_output`` its piece of
    text), then a final one (``final``: true, ``finish_reason``, the rest of the text). A failure after the
    stream started is an ``error`` event."""
    head = _head(model, version, req)
    pieces = TextPieces(gen.tokenizer) if gen.tokenizer is not None else None
    try:
        async for token in _steps(sess, gen, req):
            event = {**head, "index": outcome.count, "output_ids": [token]}
            if pieces is not None:
                event["text_output"] = pieces.push(token)
            outcome.count += 1
            yield sse(event)
    except Exception as e:  # noqa: BLE001 - the status line is sent: the error goes as an event
        outcome.error = f"generation failed after {outcome.count} token(s): {type(e).__name__}: {str(e)[:300]}"
        yield sse({**head, "error": outcome.error}, "error")
        return
    final = {**head, "output_ids": [], "finish_reason": outcome.finish_reason, "final": True}
    if pieces is not None:
        final["text_output"] = pieces.flush()
    yield sse(final)
