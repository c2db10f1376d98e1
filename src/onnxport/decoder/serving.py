"""What ``serve`` generates with for a decoder exported with its KV cache (:data:`GENERATE`, the server extension
:data:`onnxport.decoder.family.FAMILY` adds): the layout read back from the served file and report.json, the
tokenizer beside it, the generation config's rules, and the step loop
(:func:`~onnxport.decoder.generation.stream_greedy`); the extension's requests and answers are
:mod:`onnxport.decoder.extension`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.greedy import GreedyRules
from onnxport.decoder.extension import (
    NOT_A_DECODER,
    GenerateOutcome,
    GenerateRequest,
    generate,
    generate_stream,
    parse_request,
)
from onnxport.decoder.generation import check_room, stream_bound
from onnxport.decoder.records import CacheLayout
from onnxport.decoder.tokenizer import load_tokenizer
from onnxport.families.serving import Extension, ExtensionMetrics, Verb
from onnxport.runtime.binding import Target

DEFAULT_MAX_LENGTH = 128  # the export's default --max-length, for a decoder served without its report.json


@dataclass(frozen=True)
class Generator:
    """What a served decoder generates with: its cache layout, and its tokenizer when the folder has one; bound
    to its served model, it answers the generate extension (:class:`onnxport.families.serving.Bound`)."""

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
        return stop_at(recorded, self.eos_token_id)

    def to_dict(self) -> dict:
        return {"layout": self.layout.to_dict(), "tokenizer": self.tokenizer is not None,
                "eos_token_id": self.eos_token_id}

    def config_parameters(self) -> dict[str, str]:
        """What the served config says of generation: the generation config's rules applied, and those not."""
        return self.rules.config_parameters()

    def source(self, body: dict, model: str) -> np.ndarray | None:
        """A request's source when it is not a prompt of token ids: none for a decoder."""
        return None

    def check_room(self, prompt: int, new_tokens: int) -> None:
        """UsageError when the prompt and the new tokens do not fit the export's lengths."""
        check_room(self.layout, prompt, new_tokens)

    def request(self, body: object, model: str) -> GenerateRequest:
        """A generate request checked before anything runs (BadRequest)."""
        return parse_request(body, self, model)

    def start(self, request: GenerateRequest) -> GenerateOutcome:
        return GenerateOutcome(request)

    async def answer(self, sess, request: GenerateRequest, model: str, version: str,
                     outcome: GenerateOutcome) -> dict:
        """The one answer of ``/generate``."""
        return await generate(sess, self, request, model, version, outcome)

    def events(self, sess, request: GenerateRequest, model: str, version: str,
               outcome: GenerateOutcome) -> AsyncIterator[bytes]:
        """The server-sent events of ``/generate_stream``."""
        return generate_stream(sess, self, request, model, version, outcome)

    def stream(self, sess, ids: np.ndarray, max_tokens: int, rules: GreedyRules) -> Iterator[np.ndarray]:
        """Greedy tokens for the prompt ``ids`` [1, n] under ``rules``, one step at a time, the cache kept on the
        session's device through IO binding (:func:`~onnxport.decoder.generation.stream_bound`)."""
        return stream_bound(sess, self.layout, ids, np.ones_like(ids), max_tokens, rules, Target.of_session(sess))


def stop_at(rules: GreedyRules, eos: int | None) -> GreedyRules:
    """``rules`` with ``eos`` among its end-of-sequence tokens."""
    if eos is None or eos in rules.eos_token_ids:
        return rules
    return dataclasses.replace(rules, eos_token_ids=(*rules.eos_token_ids, eos))


def cache_layout(data: dict) -> CacheLayout:
    """The layout :meth:`CacheLayout.to_dict` wrote (report.json's ``decoder.layout``): the decoder family's
    ``layout`` reader. A missing or malformed field is a TypeError, KeyError or ValueError."""
    def whole(key: str) -> int:
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{key} is {value!r}, not an integer")
        return value

    optional = {k: whole(k) for k in ("value_dim", "sliding_window") if data.get(k) is not None}
    if optional.get("value_dim") == whole("head_dim"):  # to_dict writes the keys' width where values share it
        del optional["value_dim"]
    rules = data.get("generation")
    return CacheLayout(str(data["architecture"]), str(data["model_type"]), whole("layers"), whole("heads"),
                       whole("kv_heads"), whole("head_dim"), whole("vocab"), bool(data["position_ids"]),
                       whole("max_length"), generation=GreedyRules.from_dict(rules) if isinstance(rules, dict) else None,
                       **optional)


def decoder_layout(sig: Any, recorded: object = None) -> CacheLayout | None:
    """The cache layout of a served model whose inputs and outputs are named as a decoder export names them
    (None for any other model). Layers, kv heads and head dim come from the input shapes, else from the layout
    ``report.json`` recorded (``recorded``: :func:`cache_layout`'s record); the maximum length from that
    layout, else DEFAULT_MAX_LENGTH."""
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
    report = recorded.to_dict() if isinstance(recorded, CacheLayout) else {}
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


def decoder_generator(sig: Any, onnx_path: Path, recorded: object = None) -> Generator | None:
    """The generator of a served decoder (None when the model is no decoder), with the tokenizer saved in
    ``tokenizer/`` beside its ONNX file; ``recorded``: the layout report.json recorded (:func:`cache_layout`)."""
    layout = decoder_layout(sig, recorded)
    if layout is None:
        return None
    return Generator(layout, load_tokenizer(onnx_path.parent))


# Triton's generate extension, added to the server by the decoder (and, bound by its own generator, the
# encoder-decoder): its routes, its metrics and what a model that does not generate answers.
GENERATE = Extension(
    "generate", (Verb("generate"), Verb("generate_stream", stream=True)),
    ExtensionMetrics(("onnxport_generate_requests", "Generate requests by model and outcome"),
                     ("onnxport_generate_seconds", "Generate request time, first to last token"),
                     ("onnxport_generated_tokens", "Tokens generated")),
    absent="model '{model}' is not a decoder: " + NOT_A_DECODER.replace("{", "{{").replace("}", "}}"),
    usage="    a decoder with its KV cache: POST {base}/v2/models/{model}/generate and /generate_stream",
    bind=decoder_generator)
