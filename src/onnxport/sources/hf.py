"""``hf:DIR``: a local Hugging Face model directory (never downloads; no remote code unless asked)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from onnxport.core.errors import SourceError, missing_dependency, one_line
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.base import LoadedModel
from onnxport.sources.finish import declared_or, finish

TASKS = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "fill-mask": "AutoModelForMaskedLM",
    "text-generation": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
}
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def load_hf(source: str, inputs: list[InputSpec], dims: list[Dim], *, task: str | None = None,
            trust_remote_code: bool = False) -> LoadedModel:
    path = Path(source.split(":", 1)[1])
    if not path.is_dir():
        raise SourceError(f"Hugging Face model directory not found: {path}", "hf:DIR takes a local directory")
    if not (path / "config.json").is_file():
        raise SourceError(f"{path} has no config.json", "point hf: at a directory saved with save_pretrained()")
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SourceError(f"{path / 'config.json'} is not JSON ({one_line(e, 120)})",
                          "save the model again with save_pretrained(), or fix the file") from None
    if not isinstance(raw, dict) or ("model_type" not in raw and "auto_map" not in raw):
        raise SourceError(f"{path / 'config.json'} names no model_type",
                          "save the model with save_pretrained() (it writes model_type), or add \"model_type\" to "
                          "config.json by hand") from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory never needs the network
    try:
        import transformers
    except ImportError:
        raise missing_dependency("transformers", "hf") from None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
    except ValueError as e:
        raise SourceError(f"cannot read {path / 'config.json'}: {str(e).splitlines()[0][:200]}",
                          "pass --trust-remote-code if this model needs its own code (only for code you trust)") from None
    cls = _model_class(transformers, config, task)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    try:
        model = cls.from_pretrained(str(path), config=config, local_files_only=True,
                                    trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot load the model in {path}: {str(e).splitlines()[0][:200]}",
                          "the directory needs the weights saved by save_pretrained()") from None
    model.config.return_dict = True
    names = _input_names(transformers, path, model)
    specs, ranges, defaults = _specs(config, names, path)
    arch = type(model).__name__
    return finish(source, arch, "hf", model, declared_or(inputs, specs), dims, defaults, ranges=ranges,
                  extra={"model_type": getattr(config, "model_type", None), "architecture": arch})


def _model_class(transformers, config, task: str | None):
    if task:
        auto = TASKS.get(task)
        if auto is None:
            raise SourceError(f"unknown --task '{task}'", f"use one of: {', '.join(TASKS)}")
        return getattr(transformers, auto)
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


KNOWN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "pixel_mask",
                "input_values", "input_features")  # the inputs whose shape and values onnxport can make up
TOWERS = ("text_config", "vision_config", "audio_config")  # where dual encoders keep each tower's settings


def _setting(config, name: str, default=None, towers: tuple[str, ...] = TOWERS):
    """``config.NAME``, else the first tower config that has it (CLIP keeps vocab_size in text_config)."""
    value = getattr(config, name, None)
    for tower in towers:
        if value is not None:
            break
        sub = getattr(config, tower, None)
        value = getattr(sub, name, None) if sub is not None else None
    return default if value is None else value


def _preprocessor(path: Path) -> dict:
    """``preprocessor_config.json`` beside the model (sampling rate, mel bins, image size), {} when absent."""
    try:
        found = json.loads((path / "preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _input_names(transformers, path: Path, model) -> list[str]:
    """The inputs to make up for ``model``: the tokenizer's when it has one, else ``main_input_name`` with the
    text inputs forward takes beside token ids; both towers of a model that takes token ids and pixels (CLIP,
    SigLIP, ALIGN, BLIP-style). A main input onnxport cannot make up is a SourceError
    (exit 2) with the ``--input`` line to write."""
    params = inspect.signature(model.forward).parameters
    names: list[str] = []
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        names = list(getattr(tok, "model_input_names", []))
    except Exception:  # noqa: BLE001 - no tokenizer: fall back to the forward signature
        names = []
    main = getattr(model, "main_input_name", "input_ids")
    if main not in KNOWN_INPUTS and main in params:
        raise SourceError(f"onnxport cannot make up the input '{main}' of {type(model).__name__}",
                          f"describe it, e.g. -i '{main}:float32[batch,...]' (its dtype and shape, dims named) "
                          "and -d for each dim's range")
    if not names:
        names = [main]
        if main == "input_ids":
            names += [n for n in TEXT_INPUTS[1:] if n in params]
    if "input_ids" in params and "pixel_values" in params and _setting(model.config, "vision_config") is not None:
        names += [n for n in ("input_ids", "attention_mask", "pixel_values") if n not in names]  # both towers
    names = [n for n in dict.fromkeys(names) if n in params]
    order = {n: i for i, n in enumerate(KNOWN_INPUTS)}
    return sorted(names, key=lambda n: order.get(n, len(order)))


def _min_samples(config) -> int:
    """The shortest raw audio a wav2vec2-style conv feature extractor takes (at least 2 frames out of it)."""
    kernels = list(getattr(config, "conv_kernel", None) or [10, 3, 3, 3, 3, 2, 2])
    strides = list(getattr(config, "conv_stride", None) or [5, 2, 2, 2, 2, 2, 2])
    length = 2
    for k, st in reversed(list(zip(kernels, strides))):
        length = (length - 1) * st + k
    return length


def _specs(config, names: list[str], path: Path | None = None
           ) -> tuple[list[InputSpec], dict[str, tuple[int, int]], dict[str, Dim]]:
    specs: list[InputSpec] = []
    ranges: dict[str, tuple[int, int]] = {}
    pre = _preprocessor(path) if path is not None else {}
    max_len = int(_setting(config, "max_position_embeddings", 512) or 512)
    defaults = {"batch": Dim("batch", 1, 16, 2), "seq": Dim("seq", 1, min(max_len, 512), 16)}
    for n in names:
        if n in ("pixel_values", "pixel_mask"):
            size = _setting(config, "image_size", None, ("vision_config",)) or pre.get("crop_size") \
                or pre.get("size") or 224
            if isinstance(size, dict):
                size = size.get("height") or size.get("shortest_edge") or 224
            size = size if isinstance(size, int) else size[0]
            if n == "pixel_mask":
                specs.append(InputSpec(n, "int64", ("batch", size, size)))
                ranges[n] = (1, 1)
                continue
            channels = _setting(config, "num_channels", 3, ("vision_config",))
            specs.append(InputSpec(n, "float32", ("batch", channels, size, size)))
            continue
        if n == "input_values":  # raw audio (wav2vec2, HuBERT, WavLM...): one float per sample
            rate = int(pre.get("sampling_rate") or _setting(config, "sampling_rate", 16000) or 16000)
            low = _min_samples(config)
            specs.append(InputSpec(n, "float32", ("batch", "samples")))
            defaults["samples"] = Dim("samples", low, max(rate, low + 1), max(low + 1, min(rate, 4 * low + 7)))
            continue
        if n == "input_features":  # log-mel frames (Whisper, Speech2Text...)
            mels = int(_setting(config, "num_mel_bins", 0) or _setting(config, "input_feat_per_channel", 0)
                       or pre.get("feature_size") or 80)
            if str(getattr(config, "model_type", "")).startswith("whisper"):
                frames: int | str = 2 * int(_setting(config, "max_source_positions", 1500))
            else:
                frames = "frames"
                most = 4 * int(_setting(config, "max_source_positions", 1500) or 1500)
                defaults["frames"] = Dim("frames", 16, min(most, 3000), 64)
            specs.append(InputSpec(n, "float32", ("batch", mels, frames)))
            continue
        specs.append(InputSpec(n, "int64", ("batch", "seq")))
        if n == "input_ids":
            ranges[n] = (0, int(_setting(config, "vocab_size", 30000)) - 1)
        elif n == "token_type_ids":
            ranges[n] = (0, max(int(_setting(config, "type_vocab_size", 2) or 2), 1) - 1)
        elif "mask" in n:
            ranges[n] = (0, 1)
    return specs, ranges, defaults
