"""The decoder's variant kind (:mod:`onnxport.optimize.registry`): its names, declared from this package before
anything slow runs; :mod:`onnxport.decoder.variants` registers their builders and the kind's judge."""

from __future__ import annotations

from onnxport.optimize.registry import declare

DECODER_VARIANTS = ("fused", "int8", "int4", "gqa", "fp16", "cuda-graph")
CPU_DEFAULT = ("fused", "int8", "int4")  # "all" / "auto" on the CPU; a CUDA target adds the others
DECODER = declare("decoder", DECODER_VARIANTS, default=CPU_DEFAULT, label="decoder ")
