"""The encoder-decoder's variant kind (:mod:`onnxport.optimize.registry`): its names, declared from this package
before anything slow runs; :mod:`onnxport.seq2seq.variants` registers their builders (each run on the three
files) and the kind's judge."""

from __future__ import annotations

from onnxport.optimize.registry import declare

SEQ2SEQ_VARIANTS = ("fused", "int8")
SEQ2SEQ = declare("seq2seq", SEQ2SEQ_VARIANTS, label="encoder-decoder ")
