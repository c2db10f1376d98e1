"""What ``serve`` generates with for an encoder-decoder served from its three files
(:data:`EXTENSION`, the generate extension :data:`onnxport.seq2seq.family.FAMILY` adds to the server, bound by
:func:`seq2seq_generator`): the layout report.json recorded, the tokenizer and a speech model's feature extractor
from the output folder, a speech request's source, and the step loop
(:func:`~onnxport.seq2seq.generation.stream_greedy`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.greedy import GreedyRules
from onnxport.core.outdir import served_output_folder
from onnxport.decoder.serving import GENERATE, Generator, stop_at
from onnxport.decoder.tokenizer import load_tokenizer
from onnxport.seq2seq.generation import Sessions, open_sessions
from onnxport.seq2seq.generation import check_room as seq2seq_room
from onnxport.seq2seq.generation import stream_greedy as seq2seq_stream
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout
from onnxport.seq2seq.speech import load_feature_extractor, log_mel
from onnxport.seq2seq.speech_request import speech_source
from onnxport.seq2seq.tensor_request import tensor_source


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
        return stop_at(self.layout.rules, super().eos_token_id)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "feature_extractor": self.extractor is not None}

    def source(self, body: dict, model: str) -> np.ndarray | None:
        """The source a request sends (checked: BadRequest): Whisper's features or audio, another encoder's
        features or pixels; None for a prompt of token ids."""
        if self.layout.speech:
            return speech_source(body, self.layout, self.extractor, model)
        return None if self.layout.source_input == "input_ids" else tensor_source(body, self.layout, model)

    def check_room(self, prompt: int, new_tokens: int) -> None:
        if prompt < 1:
            raise UsageError("the prompt is empty", "give at least one source token")
        if prompt > self.layout.max_source:
            raise UsageError(f"a source of {prompt} tokens exceeds the declared maximum of {self.layout.max_source}",
                             "shorten the source")
        seq2seq_room(self.layout, new_tokens, self.rules)

    def stream(self, sess, ids: np.ndarray, max_tokens: int, rules: GreedyRules) -> Iterator[np.ndarray]:
        """Greedy tokens for the source ``ids`` [1, n] (speech: features [1, mel_bins, frames], or audio [n];
        another encoder's features or pixels [1, *dims], a mask of ones beside a source whose length varies)."""
        if self.layout.source_input == "input_ids":
            return seq2seq_stream(self.sessions, self.layout, [ids, np.ones_like(ids)], max_tokens, rules)
        source = log_mel(self.extractor, ids) if self.layout.speech and ids.ndim == 1 else ids
        length = source.shape[1 + self.layout.source_dims.index("source")] if self.layout.dynamic else 0
        masks = [np.ones((1, length), np.int64)] if self.layout.encoder_mask else []
        return seq2seq_stream(self.sessions, self.layout, [source, *masks], max_tokens, rules)


def seq2seq_generator(sig: Any, onnx_path: Path, layout: object = None) -> Seq2SeqGenerator | None:
    """The generator of ``decoder_with_past_model.onnx`` served beside ``encoder_model.onnx`` and
    ``decoder_model.onnx`` (the proven files, or a variant's in ``variants/<name>/``), with the layout
    report.json's ``seq2seq.layout`` recorded (``layout``, read back by the family; None for any other model);
    the tokenizer, and a speech model's feature extractor, come from the output folder."""
    names = {t.name for t in sig.inputs}
    if not isinstance(layout, Seq2SeqLayout) or "past_key_values.0.decoder.key" not in names:
        return None
    if onnx_path.name != WITH_PAST_FILE or not all((onnx_path.parent / n).is_file() for n in FILES):
        return None
    folder = served_output_folder(onnx_path)
    extractor = load_feature_extractor(folder, layout) if layout.speech else None
    return Seq2SeqGenerator(layout, load_tokenizer(folder), open_sessions(onnx_path.parent), extractor)


EXTENSION = replace(GENERATE, bind=seq2seq_generator)  # the decoder's generate extension, for the three files
