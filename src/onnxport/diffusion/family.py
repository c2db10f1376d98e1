"""The diffusion family's registration (docs/architecture.md, "Model families"; docs/diffusion.md): a diffusers
model folder in ``hf:DIR`` (``config.json`` with ``_class_name``: a UNet, a ControlNet, a DiT transformer, an
autoencoder), exported by the one pipeline's stages with inputs made up from its config."""

from __future__ import annotations

from collections.abc import Callable

from onnxport.core.errors import UsageError
from onnxport.core.options import Options
from onnxport.diffusion import denoise
from onnxport.diffusion.component import class_name, folder_of, load
from onnxport.diffusion.parts import is_pipeline, parts
from onnxport.families import PIPELINE_STAGES, Family
from onnxport.optimize import MODEL

# The options a diffusers folder cannot take: (the option, whether it is set, why), checked before the load.
REFUSED: tuple[tuple[str, Callable[[Options], bool], str], ...] = (
    ("--max-length", lambda o: o.export.max_length is not None,
     "it sets a causal language model's KV cache; a diffusion model has none"),
    ("--model-args", lambda o: bool(o.load.model_args), "the folder's config.json builds the model"),
    ("--weights", lambda o: o.load.weights is not None, "the folder's own weights are loaded"),
    ("--task", lambda o: o.load.task is not None, "a diffusers model has one forward"),
    ("--trust-remote-code", lambda o: o.load.trust_remote_code, "diffusers model classes are loaded, never code"),
)


def wants_diffusion(source: str, task: str | None) -> bool:
    """Whether ``source`` is an ``hf:DIR`` holding a diffusers model (its config.json names the class) or a whole
    pipeline (model_index.json)."""
    folder = folder_of(source)
    if not source.startswith("hf:") and not folder.is_dir():  # a folder given as it is loads as hf:DIR too
        return False
    return class_name(folder) is not None or is_pipeline(folder)


def refused(options: Options) -> Options:
    """``options`` when a diffusers folder takes them all; else a UsageError naming the option and why."""
    for flag, given, why in REFUSED:
        if given(options):
            raise UsageError(f"{flag} does not apply to a diffusers model folder: {why}", f"drop {flag}")
    return options


FAMILY = Family("diffusion", PIPELINE_STAGES, detects=wants_diffusion, refuse=refused, device_first=True,
                load=load, variant_kind=MODEL, scratch=True, parts=parts,
                joint=denoise.prove)
