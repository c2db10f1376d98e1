"""A diffusers source made of several models: a whole pipeline folder (``model_index.json``: text encoders,
the denoiser, the autoencoder, a ControlNet) or an autoencoder alone (its encoder and decoder), each part
exported into Optimum's layout (``text_encoder/``, ``unet/`` or ``transformer/``, ``vae_encoder/``,
``vae_decoder/``) and proven alone by the one pipeline."""

from __future__ import annotations

from pathlib import Path

from onnxport.core.errors import SourceError
from onnxport.diffusion.component import CONFIG, class_name, folder_of, read_json
from onnxport.families import Part

INDEX = "model_index.json"
LIBRARIES = ("diffusers", "transformers")  # the parts that are models; tokenizers and schedulers have no weights
DENOISERS = ("unet", "transformer", "prior", "decoder")  # the part a pipeline's report is headed by
AUTOENCODER_CLASSES = ("AutoencoderKL", "AsymmetricAutoencoderKL", "AutoencoderTiny", "ConsistencyDecoderVAE")
HALVES = ("vae_encoder", "vae_decoder")


def is_pipeline(folder: Path) -> bool:
    return read_json(folder / INDEX) is not None


def _autoencoder(source: str, main: bool) -> tuple[Part, ...]:
    return tuple(Part(half, source, {"part": half}, main=main and half == "vae_decoder") for half in HALVES)


def parts(source: str) -> tuple[Part, ...]:
    """The models of ``source``: a pipeline folder's (in model_index.json's order, the autoencoder as its two
    halves), an autoencoder's two halves, or () for a single model."""
    folder = folder_of(source)
    index = read_json(folder / INDEX)
    if index is None:
        name = class_name(folder)
        return _autoencoder(source, True) if name in AUTOENCODER_CLASSES else ()
    found: list[Part] = []
    for key, value in index.items():
        if key.startswith("_") or not (isinstance(value, list) and len(value) == 2 and value[0] in LIBRARIES):
            continue
        sub = folder / key
        if not (sub.is_dir() and (sub / CONFIG).is_file()) or "/" in key or key in (".", ".."):
            continue  # a missing tokenizer, safety checker or feature extractor is fine
        if value[1] in AUTOENCODER_CLASSES:
            found += _autoencoder(f"hf:{sub}", False)
        else:
            found.append(Part(key, f"hf:{sub}", main=key in DENOISERS))
    if not found:
        raise SourceError(f"{folder / INDEX} names no model folder this directory holds",
                          "point hf: at a pipeline saved with save_pretrained(), or at one of its model folders")
    return tuple(found)
