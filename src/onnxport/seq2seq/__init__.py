"""Encoder-decoder models of every modality with their cache (T5, BART, Marian, mBART, Pegasus, LED; Whisper,
Speech2Text; VisionEncoderDecoder: TrOCR, Donut): three ONNX files in Optimum's layout (``encoder_model.onnx``,
``decoder_model.onnx``, ``decoder_with_past_model.onnx``), proven step by step and by greedy generation against
``model.generate``."""

from onnxport.seq2seq.export import export_seq2seq
from onnxport.seq2seq.flow import MAX_LENGTH, MAX_SOURCE, SEQ2SEQ_TASKS, load, run, run_model, wants_seq2seq
from onnxport.seq2seq.generation import Sessions, generate_greedy, open_sessions, stream_greedy
from onnxport.seq2seq.kind import SEQ2SEQ_VARIANTS
from onnxport.seq2seq.layout import is_seq2seq, seq2seq_layout
from onnxport.seq2seq.prove import prove_seq2seq, step_matrix
from onnxport.seq2seq.records import (
    FILES,
    Seq2SeqCase,
    Seq2SeqExport,
    Seq2SeqLayout,
    Seq2SeqOutcome,
    Seq2SeqProof,
)
from onnxport.seq2seq.stage import checked
from onnxport.seq2seq.variants import optimize_seq2seq

__all__ = [
    "FILES",
    "MAX_LENGTH",
    "MAX_SOURCE",
    "SEQ2SEQ_TASKS",
    "SEQ2SEQ_VARIANTS",
    "Seq2SeqCase",
    "Seq2SeqExport",
    "Seq2SeqLayout",
    "Seq2SeqOutcome",
    "Seq2SeqProof",
    "Sessions",
    "checked",
    "export_seq2seq",
    "generate_greedy",
    "is_seq2seq",
    "load",
    "open_sessions",
    "optimize_seq2seq",
    "prove_seq2seq",
    "run",
    "run_model",
    "seq2seq_layout",
    "step_matrix",
    "stream_greedy",
    "wants_seq2seq",
]
