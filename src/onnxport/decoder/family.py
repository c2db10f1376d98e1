"""The decoder family's registration (docs/architecture.md, "Model families"): a causal LM in ``hf:DIR``
exported with its KV cache."""

from __future__ import annotations

from onnxport.core.options import Options
from onnxport.decoder.applies import refuse_for_decoder
from onnxport.decoder.flow import wants_cache
from onnxport.decoder.kind import DECODER
from onnxport.decoder.outcome import SECTION
from onnxport.decoder.serving import cache_layout
from onnxport.decoder.stage import stage
from onnxport.families import Family, Stage


def _refused(options: Options) -> Options:
    """``options`` when a decoder takes them all; else a UsageError naming the option and why."""
    refuse_for_decoder(options)
    return options


FAMILY = Family(
    "decoder", (Stage("export_and_proof", stage, checkpoint=True),), detects=wants_cache, refuse=_refused,
    load_task="text-generation", check_seq=False, variant_kind=DECODER, section=SECTION,
    layout=cache_layout, extension="onnxport.decoder.serving:GENERATE",
)
