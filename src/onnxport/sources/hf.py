"""``hf:DIR``: a local Hugging Face model directory (never downloads; no remote code unless asked)."""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path

import torch

from onnxport.core.diagnostics import Diagnostic, warning
from onnxport.core.errors import OnnxportError, SourceError, missing_dependency
from onnxport.core.samples import make_inputs
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources import validate
from onnxport.sources.base import LoadedModel
from onnxport.sources.finish import Finishing, declared_or, finish
from onnxport.sources.hf_media import NAFLEX, audio_tower_inputs, media_spec, naflex
from onnxport.sources.tokenizer_files import load_tokenizer

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
    model = hf_model(path, task=task, trust_remote_code=trust_remote_code, cache=False)
    import transformers

    config = model.config
    model.config.return_dict = True
    names = _input_names(transformers, path, model)
    specs, ranges, defaults = _specs(config, names, path, tokens=_position_limit(model))
    arch = type(model).__name__
    return finish(source, arch, "hf", model, declared_or(inputs, specs), dims,
                  Finishing(defaults=defaults, ranges=ranges, diagnostics=_unknown_architecture(config, arch, task),
                            extra={"model_type": getattr(config, "model_type", None), "architecture": arch}))


def made_up_inputs(model) -> tuple[list[InputSpec], dict[str, tuple[int, int]], dict[str, Dim]] | None:
    """The inputs ``hf:DIR`` makes up, for a transformers model handed over as Python (a factory returning
    ``AutoModel.from_config(...)``, a subclass of a PreTrainedModel): from its forward signature and config, as
    for a saved folder without tokenizer or processor files; None when it is not a transformers model. An input
    onnxport cannot make up is the same SourceError (exit 2) with the ``--input`` lines to write."""
    transformers = sys.modules.get("transformers")  # not imported: the model cannot be one
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return None
    model.config.return_dict = True
    names = _input_names(transformers, Path(os.devnull), model)
    return _specs(model.config, names, None, tokens=_position_limit(model))


def _unknown_architecture(config, loaded: str, task: str | None) -> tuple[Diagnostic, ...]:
    """A warning where config.json's ``architectures`` names no class this transformers has, so the model was
    loaded through the auto class (its base model: a head saved in the weights is left out)."""
    named = [a for a in getattr(config, "architectures", None) or [] if isinstance(a, str)]
    if task or not named or loaded in named or getattr(config, "auto_map", None):
        return ()
    return (warning("architecture-unknown", f"config.json names {', '.join(n[:60] for n in named[:3])}, which "
                                            f"this transformers has no class for: loaded as {loaded}, without a "
                                            "head the weights may hold",
                    hint="pass --task to choose the head, or fix 'architectures' in config.json"),)


def hf_model(path: Path, *, task: str | None = None, trust_remote_code: bool = False, cache: bool = True):
    """The model saved in the local directory ``path``, offline, with the class its config names (``task``: that
    task's auto class); ``cache`` False turns the config's ``use_cache`` off (a plain forward returns no cache).
    A directory, config or weights that do not load is a SourceError; no transformers, a missing dependency."""
    if not path.is_dir():
        raise SourceError(f"Hugging Face model directory not found: {path}", "hf:DIR takes a local directory")
    if not (path / "config.json").is_file():
        raise SourceError(f"{path} has no config.json", "point hf: at a directory saved with save_pretrained()")
    raw = validate.read_json(path / "config.json")
    if isinstance(raw, dict) and "_diffusers_version" in raw:  # reached with --input: the plain forward
        raise SourceError(f"{path} holds a diffusers model ({raw.get('_class_name')}), whose inputs --input cannot "
                          "bind here", "leave --input out: onnxport makes its inputs up from config.json "
                          "(docs/diffusion.md); or give it as a Python module (file.py:factory) with --input")
    if not isinstance(raw, dict) or ("model_type" not in raw and "auto_map" not in raw):
        raise SourceError(f"{path / 'config.json'} names no model_type",
                          "save the model with save_pretrained() (it writes model_type), or add \"model_type\" to "
                          "config.json by hand") from None
    validate.check_folder(path)  # values, sizes against the weights and the memory: before anything is built
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory never needs the network
    try:
        import transformers
    except ImportError:
        raise missing_dependency("transformers", "hf") from None
    with validate.loading(path):
        return _from_pretrained(transformers, path, task, trust_remote_code, cache)


def _from_pretrained(transformers, path: Path, task: str | None, trust_remote_code: bool, cache: bool):
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
    except ValueError as e:
        raise SourceError(f"cannot read {path / 'config.json'}: {str(e).splitlines()[0][:200]}",
                          "pass --trust-remote-code if this model needs its own code (only for code you trust)") from None
    cls = _model_class(transformers, config, task)
    validate.check_vocabulary(config, path)
    if not cache and hasattr(config, "use_cache"):
        config.use_cache = False
    try:
        return cls.from_pretrained(str(path), config=config, local_files_only=True,
                                   trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot load the model in {path}: {str(e).splitlines()[0][:200]}",
                          "the directory needs the weights saved by save_pretrained()") from None


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


KNOWN_INPUTS = ("input_ids", "bbox", "attention_mask", "token_type_ids", "pixel_values", "pixel_mask", *NAFLEX,
                "input_values", "input_features", "is_longer", "decoder_input_ids")  # those onnxport can make up, in this order
TEXT_AFTER_IDS = ("bbox", "attention_mask", "token_type_ids")  # beside input_ids, where forward takes them
TOWERS = ("text_config", "vision_config", "audio_config", "encoder", "decoder")  # sub-configs with a tower's settings
VISION = ("vision_config", "encoder")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")
BOX_MAX = 1000  # LayoutLM-style boxes: corners on a 0..1000 grid


def _setting(config, name: str, default=None, towers: tuple[str, ...] = TOWERS):
    """``config.NAME``, else the first tower config that has it (CLIP keeps vocab_size in text_config)."""
    value = getattr(config, name, None)
    for tower in towers:
        if value is not None:
            break
        sub = getattr(config, tower, None)
        value = getattr(sub, name, None) if sub is not None else None
    return default if value is None else value


def _json(path: Path) -> dict:
    """A JSON object file, {} when absent or unreadable."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _preprocessor(path: Path) -> dict:
    """``preprocessor_config.json`` beside the model (sampling rate, mel bins, image size), {} when absent."""
    return _json(path / "preprocessor_config.json")


def _has_tokenizer(path: Path) -> bool:
    """Whether tokenizer files were saved beside the model (transformers builds an empty one from the config
    alone, whose input names say nothing about this model)."""
    return any((path / f).is_file() for f in TOKENIZER_FILES)


def _orders_boxes() -> bool:
    """Whether the generated values of a ``bbox`` input are boxes (x0 <= x1, y0 <= y1): LayoutLM indexes
    embeddings with x1 - x0 and y1 - y0, so unordered corners fail in PyTorch."""
    (t,) = make_inputs((InputSpec("bbox", "int64", (64, 4), (0, BOX_MAX)),), {}, seed=0)
    return bool((t[:, :2] <= t[:, 2:]).all())


def _input_names(transformers, path: Path, model) -> list[str]:
    """The inputs to make up for ``model``, from its forward signature and ``main_input_name``: the text inputs
    beside token ids (the saved tokenizer's list when there is one; ``bbox`` for layout models), ``pixel_mask``
    beside pixels (DETR-style), both towers of a model that takes token ids and pixels (CLIP, SigLIP, ALIGN,
    BLIP-style), ``decoder_input_ids`` of an encoder-decoder's plain forward (VisionEncoderDecoder). A main or
    required input onnxport cannot make up is a SourceError (exit 2) with the ``--input`` lines to write."""
    params = inspect.signature(model.forward).parameters
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    if main not in KNOWN_INPUTS and main in params:
        raise _cannot_make_up(main, model, path, [n for n in KNOWN_INPUTS if n in params and n != main][:3])
    names = [main]
    if "input_ids" in params and "pixel_values" in params and _setting(config, "vision_config") is not None:
        names += ["input_ids", "pixel_values"]  # both towers
    if "input_ids" in params:
        names += audio_tower_inputs(config, params)  # CLAP: the audio tower's, from its own config
    if "input_ids" in names:
        text = list(TEXT_AFTER_IDS)
        if _has_tokenizer(path):
            try:
                tok = load_tokenizer(path)
                text = ["bbox", *getattr(tok, "model_input_names", text)]
            except OnnxportError:  # an unreadable tokenizer: the forward signature decides
                pass
        names += [n for n in text if n != "bbox" or _orders_boxes()]
    if "pixel_values" in names:
        names += ["pixel_mask", *(NAFLEX if naflex(config) else ())]
    if getattr(config, "is_encoder_decoder", False):
        names.append("decoder_input_ids")
    names = [n for n in dict.fromkeys(names) if n in params]
    required = [p.name for p in params.values() if p.default is p.empty and p.name != "self"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names]
    if required:
        raise _cannot_make_up(required[0], model, path, names)
    order = {n: i for i, n in enumerate(KNOWN_INPUTS)}
    return sorted(names, key=lambda n: order.get(n, len(order)))


def _cannot_make_up(name: str, model, path: Path, known: list[str]) -> SourceError:
    """Exit 2 naming the input, with the ``--input`` lines to write: an --input replaces every input made up,
    so the hint lists those onnxport can make up and a line to complete for ``name``."""
    known = [n for n in known if n != name and n in KNOWN_INPUTS]
    try:
        made, ranges, _ = _specs(model.config, known, path)
    except Exception:  # noqa: BLE001 - the hint then names the unknown input alone
        made, ranges = [], {}
    specs = [InputSpec(s.name, s.dtype, s.shape, ranges.get(s.name)) for s in made]
    lines = " ".join(f"-i '{s}'" for s in specs)
    return SourceError(f"onnxport cannot make up the input '{name}' of {type(model).__name__}",
                       f"give every input ({'an --input replaces those made up: ' + lines + ' ' if lines else ''}"
                       f"-i '{name}:float32[batch,...]'), '{name}' with its dtype and shape (dims named), and -d "
                       "for each named dim's range")


def _min_samples(config) -> int:
    """The shortest raw audio a wav2vec2-style conv feature extractor takes (at least 2 frames out of it)."""
    kernels = list(getattr(config, "conv_kernel", None) or [10, 3, 3, 3, 3, 2, 2])
    strides = list(getattr(config, "conv_stride", None) or [5, 2, 2, 2, 2, 2, 2])
    length = 2
    for k, st in reversed(list(zip(kernels, strides))):
        length = (length - 1) * st + k
    return length


def _image_size(config, pre: dict) -> tuple[int, int]:
    """(height, width) of the pixels: the config's (or vision tower's) ``image_size``, which position embeddings
    fix; else the image processor's crop or resize size; else 224."""
    size = _setting(config, "image_size", None, VISION)
    if size is None:
        size = pre.get("crop_size") if pre.get("do_center_crop", "crop_size" in pre) else None
        size = size or pre.get("size") or 224
    if isinstance(size, dict):
        edge = size.get("shortest_edge") or size.get("height") or size.get("width") or 224
        return int(size.get("height") or edge), int(size.get("width") or edge)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def _position_limit(model) -> int | None:
    """The most tokens position embeddings offset past their padding index take (RoBERTa, MPNet: positions
    start at ``padding_idx + 1``, so 514 positions hold 512 tokens); None where no embedding is offset."""
    limits = [m.num_embeddings - m.padding_idx - 1 for name, m in model.named_modules()
              if name.endswith("position_embeddings") and isinstance(m, torch.nn.Embedding)
              and m.padding_idx is not None and m.padding_idx >= 0]
    return min(limits) if limits else None


def _text_max(config, path: Path | None, tokens: int | None = None) -> int:
    """The longest token sequence: the model's positions (``tokens`` where they are offset), the tokenizer's
    ``model_max_length``, 512 at most."""
    most = tokens or int(_setting(config, "max_position_embeddings", 512) or 512)
    saved = _json(path / "tokenizer_config.json").get("model_max_length") if path is not None else None
    if isinstance(saved, int) and 0 < saved < most:
        most = saved
    return max(1, min(most, 512))


def _specs(config, names: list[str], path: Path | None = None, tokens: int | None = None
           ) -> tuple[list[InputSpec], dict[str, tuple[int, int]], dict[str, Dim]]:
    """The specs of ``names``, their value ranges and their dims' default ranges; ``tokens``: the most tokens
    the position embeddings take, where not ``max_position_embeddings``."""
    specs: list[InputSpec] = []
    ranges: dict[str, tuple[int, int]] = {}
    pre = _preprocessor(path) if path is not None else {}
    seq = _text_max(config, path, tokens)
    defaults = {"batch": Dim("batch", 1, 16, 2), "seq": Dim("seq", 1, seq, min(16, seq))}
    for n in names:
        media = media_spec(config, n)  # a clip, a spectrogram, an audio tower's features
        if media is not None:
            specs.append(media[0])
            defaults.update(media[1])
            continue
        if n in ("pixel_values", "pixel_mask"):
            height, width = _image_size(config, pre)
            if n == "pixel_mask":  # 1 where the image is, 0 on padding (rows padded on the right)
                specs.append(InputSpec(n, "int64", ("batch", height, width)))
                ranges[n] = (0, 1)
                continue
            channels = _setting(config, "num_channels", 3, VISION)
            specs.append(InputSpec(n, "float32", ("batch", channels, height, width)))
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
        if n == "bbox":  # one box per token: x0, y0, x1, y1 on LayoutLM's 0..1000 grid
            most = int(_setting(config, "max_2d_position_embeddings", BOX_MAX + 1) or BOX_MAX + 1) - 1
            specs.append(InputSpec(n, "int64", ("batch", "seq", 4)))
            ranges[n] = (0, min(BOX_MAX, most))
            continue
        if n == "decoder_input_ids":  # an encoder-decoder's plain forward: the target tokens so far
            decoder = getattr(config, "decoder", None) or config
            most = int(getattr(decoder, "max_position_embeddings", None) or 512)
            specs.append(InputSpec(n, "int64", ("batch", "target")))
            ranges[n] = (0, int(_setting(decoder, "vocab_size", 30000)) - 1)
            defaults["target"] = Dim("target", 1, min(most, 512), min(8, most))
            continue
        specs.append(InputSpec(n, "int64", ("batch", "seq")))
        if n == "input_ids":
            ranges[n] = (0, int(_setting(config, "vocab_size", 30000)) - 1)
        elif n == "token_type_ids":
            ranges[n] = (0, max(int(_setting(config, "type_vocab_size", 2) or 2), 1) - 1)
        elif "mask" in n:
            ranges[n] = (0, 1)
    return specs, ranges, defaults
