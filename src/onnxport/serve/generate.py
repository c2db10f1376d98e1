"""Triton's generate extension for decoders and encoder-decoders served with their cache: ``POST
/v2/models/{m}/generate`` (one JSON answer) and ``.../generate_stream`` (server-sent events, one per token, then
a final one). Text in and out when the model folder has a ``tokenizer/``, token ids (``input_ids`` in,
``output_ids`` out) always; a speech model (Whisper) takes ``input_features`` or ``audio`` (:mod:`.speech`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxport import families
from onnxport.core.errors import UsageError
from onnxport.core.greedy import GreedyRules
from onnxport.decoder.generation import check_room, stream_greedy
from onnxport.decoder.records import CacheLayout
from onnxport.decoder.tokenizer import load_tokenizer
from onnxport.seq2seq.generation import Sessions, open_sessions
from onnxport.seq2seq.generation import check_room as seq2seq_room
from onnxport.seq2seq.generation import stream_greedy as seq2seq_stream
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout
from onnxport.serve.models import Signature, output_folder
from onnxport.serve.protocol import BadRequest
from onnxport.serve.speech import load_feature_extractor, log_mel, speech_source

DEFAULT_MAX_LENGTH = 128  # the export's default --max-length, for a decoder served without its report.json
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096
CHARS_PER_TOKEN = 64  # text longer than this many characters per allowed token is refused untokenized
GREEDY_VALUES = {"temperature": (0, 0.0), "do_sample": (False,), "top_k": (0, 1), "top_p": (1, 1.0)}
KNOWN_PARAMETERS = ("max_tokens", "ignore_eos", "stream", *GREEDY_VALUES)
NOT_A_DECODER = ("generate needs a decoder exported with its KV cache (inputs input_ids, attention_mask and "
                 "past_key_values.*; outputs logits and present.*)")


@dataclass(frozen=True)
class Generator:
    """What a served decoder generates with: its cache layout, and its tokenizer when the folder has one."""

    layout: CacheLayout
    tokenizer: object | None = None

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return eos if isinstance(eos, int) else None

    @property
    def rules(self) -> GreedyRules:
        """The generation config's rules the export recorded (none: plain greedy), stopping at the tokenizer's
        end-of-sequence token as well (as text-generation servers do)."""
        recorded = getattr(self.layout, "generation", None) or GreedyRules()
        return _stop_at(recorded, self.eos_token_id)

    def to_dict(self) -> dict:
        return {"layout": self.layout.to_dict(), "tokenizer": self.tokenizer is not None,
                "eos_token_id": self.eos_token_id}

    def config_parameters(self) -> dict[str, str]:
        """What the served config says of generation: the generation config's rules applied, and those not."""
        rules = self.rules
        return {"onnxport_generation_applied": ", ".join(rules.applied) or "none (plain greedy)",
                "onnxport_generation_not_applied": ", ".join(rules.not_applied) or "none"}

    def check_room(self, prompt: int, new_tokens: int) -> None:
        """UsageError when the prompt and the new tokens do not fit the export's lengths."""
        check_room(self.layout, prompt, new_tokens)

    def stream(self, sess, ids: np.ndarray, max_tokens: int, rules: GreedyRules) -> Iterator[np.ndarray]:
        """Greedy tokens for the prompt ``ids`` [1, n] under ``rules``, one step at a time."""
        return stream_greedy(sess, self.layout, ids, np.ones_like(ids), max_tokens, rules)


def _stop_at(rules: GreedyRules, eos: int | None) -> GreedyRules:
    """``rules`` with ``eos`` among its end-of-sequence tokens."""
    if eos is None or eos in rules.eos_token_ids:
        return rules
    return dataclasses.replace(rules, eos_token_ids=(*rules.eos_token_ids, eos))


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


def decoder_layout(sig: Signature, report_layout: object = None) -> CacheLayout | None:
    """The cache layout of a served model whose inputs and outputs are named as a decoder export names them
    (None for any other model). Layers, kv heads and head dim come from the input shapes, else from
    ``report.json``'s ``decoder.layout``; the maximum length from that layout, else DEFAULT_MAX_LENGTH."""
    inputs = {t.name: t for t in sig.inputs}
    outputs = {t.name for t in sig.outputs}
    layers = sum(1 for name in inputs if name.startswith("past_key_values.") and name.endswith(".key"))
    position_ids = "position_ids" in inputs
    expected = ({"input_ids", "attention_mask"} | ({"position_ids"} if position_ids else set())
                | {f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")})
    wanted_out = {"logits"} | {f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")}
    if layers < 1 or set(inputs) != expected or not wanted_out <= outputs:
        return None
    if any(inputs[n].dtype != "int64" for n in expected if not n.startswith("past_key_values.")):
        return None
    report = report_layout if isinstance(report_layout, dict) else {}
    shape = inputs["past_key_values.0.key"].shape or ()
    logits = next(t for t in sig.outputs if t.name == "logits").shape or ()

    def dim(dims: tuple, index: int, key: str) -> int | None:
        value = dims[index] if -len(dims) <= index < len(dims) else None
        value = value if isinstance(value, int) and value > 0 else report.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    kv_heads, head_dim = dim(shape, 1, "kv_heads"), dim(shape, 3, "head_dim")
    if len(shape) != 4 or kv_heads is None or head_dim is None:
        return None
    max_length = report.get("max_length")
    max_length = max_length if isinstance(max_length, int) and max_length > 1 else DEFAULT_MAX_LENGTH
    value = inputs["past_key_values.0.value"].shape or ()
    value_dim = dim(value, 3, "value_dim") if len(value) == 4 else None  # latent attention: values of their own width
    rules = report.get("generation")
    return CacheLayout(str(report.get("architecture", "")), str(report.get("model_type", "")), layers,
                       dim((), 0, "heads") or kv_heads, kv_heads, head_dim, dim(logits, -1, "vocab") or 0,
                       position_ids, max_length, value_dim=value_dim if value_dim != head_dim else None,
                       generation=GreedyRules.from_dict(rules) if isinstance(rules, dict) else None)


def load_generator(sig: Signature, onnx_path: Path, report_layout: object = None) -> Generator | None:
    """The generator of a served model that generates (None for any other model): the one the first model
    family's ``generator`` builds for it (:mod:`onnxport.families`)."""
    for family in families.families():
        make = family.generator_function()
        if make is not None and (gen := make(sig, onnx_path, report_layout)) is not None:
            return gen
    return None


def decoder_generator(sig: Signature, onnx_path: Path, report_layout: object = None) -> Generator | None:
    """The generator of a served decoder (None when the model is no decoder), with the tokenizer saved in
    ``tokenizer/`` beside its ONNX file."""
    layout = decoder_layout(sig, report_layout)
    if layout is None:
        return None
    return Generator(layout, load_tokenizer(onnx_path.parent))


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
    speech = isinstance(gen, Seq2SeqGenerator) and gen.layout.speech
    source = speech_source(body, gen.layout, gen.extractor, model) if speech else None
    ids = () if speech else _prompt(body, gen, model)
    try:
        gen.check_room(1 if speech else len(ids), max_tokens)
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


# --------------------------------------------------------------------------- encoder-decoders (docs/seq2seq.md)


@dataclass(frozen=True)
class Seq2SeqGenerator(Generator):
    """An encoder-decoder served from its three files (``layout``: a :class:`~onnxport.seq2seq.Seq2SeqLayout`):
    the prompt is the source (text or token ids; a speech model's log-mel features or audio, turned into
    features by ``extractor``), the answer the decoder's greedy tokens from ``decoder_start_token_id``."""

    sessions: Sessions | None = None
    extractor: object | None = None  # speech: Whisper's feature extractor, when the folder has one

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token ``model.generate`` stops at (recorded by the export), else the tokenizer's."""
        eos = getattr(self.layout, "eos_token", None)
        return eos if isinstance(eos, int) else super().eos_token_id

    @property
    def rules(self) -> GreedyRules:
        return _stop_at(self.layout.rules, super().eos_token_id)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "feature_extractor": self.extractor is not None}

    def check_room(self, prompt: int, new_tokens: int) -> None:
        if prompt < 1:
            raise UsageError("the prompt is empty", "give at least one source token")
        if prompt > self.layout.max_source:
            raise UsageError(f"a source of {prompt} tokens exceeds the declared maximum of {self.layout.max_source}",
                             "shorten the source")
        seq2seq_room(self.layout, new_tokens, self.rules)

    def stream(self, sess, ids: np.ndarray, max_tokens: int, rules: GreedyRules) -> Iterator[np.ndarray]:
        """Greedy tokens for the source ``ids`` [1, n] (speech: features [1, mel_bins, frames], or audio [n])."""
        if not self.layout.speech:
            return seq2seq_stream(self.sessions, self.layout, [ids, np.ones_like(ids)], max_tokens, rules)
        features = log_mel(self.extractor, ids) if ids.ndim == 1 else ids
        return seq2seq_stream(self.sessions, self.layout, [features], max_tokens, rules)


def seq2seq_generator(sig: Signature, onnx_path: Path, report_layout: object = None) -> Seq2SeqGenerator | None:
    """The generator of ``decoder_with_past_model.onnx`` served beside ``encoder_model.onnx`` and
    ``decoder_model.onnx`` (the proven files, or a variant's in ``variants/<name>/``), with report.json's
    ``seq2seq.layout`` (None for any other model); the tokenizer, and a speech model's feature extractor, come
    from the output folder."""
    names = {t.name for t in sig.inputs}
    if not isinstance(report_layout, dict) or "past_key_values.0.decoder.key" not in names:
        return None
    try:
        layout = Seq2SeqLayout.from_dict(report_layout)
    except (TypeError, KeyError, ValueError):
        return None
    if onnx_path.name != WITH_PAST_FILE or not all((onnx_path.parent / n).is_file() for n in FILES):
        return None
    folder = output_folder(onnx_path)
    extractor = load_feature_extractor(folder, layout) if layout.speech else None
    return Seq2SeqGenerator(layout, load_tokenizer(folder), open_sessions(onnx_path.parent), extractor)
