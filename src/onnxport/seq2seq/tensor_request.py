"""The source of a generate request to an encoder-decoder whose encoder takes features or pixels other than
Whisper's (:mod:`.speech_request`): the JSON list named after the encoder's input, of its dims after the batch
(Speech2Text's ``input_features`` [frames, features], a VisionEncoderDecoder's ``pixel_values`` [channels,
height, width]), with or without a leading batch of 1, checked against the layout before anything runs
(BadRequest, 400, one line)."""

from __future__ import annotations

import numpy as np

from onnxport.families.serving import BadRequest
from onnxport.seq2seq.records import Seq2SeqLayout
from onnxport.seq2seq.speech_request import _numbers

SOURCE_FIELDS = ("text_input", "input_ids", "audio", "input_features", "pixel_values")


def _expected(layout: Seq2SeqLayout) -> str:
    dims = ", ".join(f"1..{layout.max_source}" if d == "source" else str(d) for d in layout.source_dims)
    return f"'{layout.source_input}' [{dims}]"


def tensor_source(body: dict, layout: Seq2SeqLayout, model: str) -> np.ndarray:
    """The request's ``layout.source_input`` as float32 [1, *dims]; anything else a BadRequest naming the shape
    to send."""
    name = layout.source_input
    others = [field for field in SOURCE_FIELDS if field in body and field != name]
    if name not in body or others:
        also = f" ({', '.join(repr(o) for o in others)} do not apply)" if others else ""
        raise BadRequest(f"model '{model}' takes {_expected(layout)}, a JSON list of numbers{also}")
    array = _numbers(body[name], name)
    if array.ndim == len(layout.source_dims) + 1 and array.shape[0] == 1:
        array = array[0]
    fits = array.ndim == len(layout.source_dims) and all(
        1 <= n <= layout.max_source if d == "source" else n == int(d) for n, d in zip(array.shape, layout.source_dims))
    if not fits:
        raise BadRequest(f"'{name}' has shape {list(array.shape)}: send {_expected(layout)}, or with a leading 1")
    return array[None]
