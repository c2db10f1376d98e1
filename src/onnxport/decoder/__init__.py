"""Decoder language models with a KV cache: one ONNX model taking ``past_key_values.{i}.key/.value`` and
returning ``logits`` and ``present.{i}.key/.value``, proven step by step and by greedy generation."""

from onnxport.decoder.export import export_decoder
from onnxport.decoder.flow import CACHE_TASKS, MAX_LENGTH, run, run_model, wants_cache
from onnxport.decoder.layout import CachedDecoder, cache_layout, is_causal_lm
from onnxport.decoder.prove import greedy, prove_decoder, step_matrix
from onnxport.decoder.records import (
    CacheLayout,
    CacheVariants,
    DecoderExport,
    DecoderOutcome,
    DecoderProof,
    DecoderVariant,
    DecoderVariants,
    GenerationCheck,
    StepCase,
)
from onnxport.decoder.variants import VARIANT_NAMES, decode_speed, optimize_decoder

__all__ = [
    "CACHE_TASKS",
    "MAX_LENGTH",
    "CacheLayout",
    "CacheVariants",
    "CachedDecoder",
    "DecoderExport",
    "DecoderOutcome",
    "DecoderProof",
    "GenerationCheck",
    "DecoderVariant",
    "DecoderVariants",
    "StepCase",
    "VARIANT_NAMES",
    "cache_layout",
    "decode_speed",
    "export_decoder",
    "greedy",
    "is_causal_lm",
    "optimize_decoder",
    "prove_decoder",
    "run",
    "run_model",
    "step_matrix",
    "wants_cache",
]
