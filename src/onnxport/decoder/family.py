"""The decoder family's registration (docs/architecture.md, "Model families"): a causal LM in ``hf:DIR``
exported with its KV cache, run through the one pipeline's stages with its parts (:mod:`onnxport.decoder.hooks`)."""

from __future__ import annotations

from onnxport.core.options import Options
from onnxport.decoder.applies import refuse_for_decoder
from onnxport.decoder.flow import wants_cache
from onnxport.decoder.hooks import HOOKS
from onnxport.decoder.kind import DECODER
from onnxport.decoder.outcome import SECTION
from onnxport.decoder.serving import cache_layout
from onnxport.families import PIPELINE_STAGES, Family


def _refused(options: Options) -> Options:
    """``options`` when a decoder takes them all; else a UsageError naming the option and why."""
    refuse_for_decoder(options)
    return options


FAMILY = Family(
    "decoder", PIPELINE_STAGES, detects=wants_cache, refuse=_refused,
    load_task="text-generation", check_seq=False, variant_kind=DECODER, section=SECTION,
    layout=cache_layout, extension="onnxport.decoder.serving:GENERATE",
    scratch=True, hooks=HOOKS,  # the one pipeline's stages, its export, proof, variants and section through HOOKS
    gpu_session={"provider": "CUDAExecutionProvider", "use_tf32": False},  # proven there (no TensorRT, no graph)
)
