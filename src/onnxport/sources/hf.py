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
    specs, ranges, defaults = _specs(config, names)
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


def _input_names(transformers, path: Path, model) -> list[str]:
    params = inspect.signature(model.forward).parameters
    names: list[str] = []
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        names = list(getattr(tok, "model_input_names", []))
    except Exception:  # noqa: BLE001 - no tokenizer: fall back to the forward signature
        names = []
    if not names:
        main = getattr(model, "main_input_name", "input_ids")
        names = [main] + ([n for n in TEXT_INPUTS[1:] if n in params] if main == "input_ids" else [])
    names = [n for n in names if n in params]
    order = {n: i for i, n in enumerate(TEXT_INPUTS)}
    return sorted(names, key=lambda n: order.get(n, len(order)))


def _specs(config, names: list[str]) -> tuple[list[InputSpec], dict[str, tuple[int, int]], dict[str, Dim]]:
    specs: list[InputSpec] = []
    ranges: dict[str, tuple[int, int]] = {}
    max_len = int(getattr(config, "max_position_embeddings", 512) or 512)
    defaults = {"batch": Dim("batch", 1, 16, 2), "seq": Dim("seq", 1, min(max_len, 512), 16)}
    for n in names:
        if n == "pixel_values":
            size = getattr(config, "image_size", 224)
            size = size if isinstance(size, int) else size[0]
            channels = getattr(config, "num_channels", 3)
            specs.append(InputSpec(n, "float32", ("batch", channels, size, size)))
            continue
        specs.append(InputSpec(n, "int64", ("batch", "seq")))
        if n == "input_ids":
            ranges[n] = (0, int(getattr(config, "vocab_size", 30000)) - 1)
        elif n == "token_type_ids":
            ranges[n] = (0, max(int(getattr(config, "type_vocab_size", 2) or 2), 1) - 1)
        elif "mask" in n:
            ranges[n] = (0, 1)
    return specs, ranges, defaults
