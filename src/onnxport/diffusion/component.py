"""One diffusers model folder (``save_pretrained`` of a UNet, a ControlNet, a DiT transformer, a VAE): found by
its ``config.json`` (``_class_name``), loaded locally with the diffusers class it names (a model class only:
nothing else is imported or run), and called with the inputs its config implies (:mod:`.inputs`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from onnxport.core.diagnostics import info
from onnxport.core.errors import SourceError, UsageError, missing_dependency, one_line
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.core.spec import Dim, InputSpec, parse_dim, parse_input
from onnxport.diffusion.inputs import BATCH, Plan, around, plan, sample_size
from onnxport.prove import compare as judging
from onnxport.sources.base import LoadedModel, make_flat
from onnxport.sources.finish import Finishing, declared_or, finish

CONFIG = "config.json"
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a model's config is a few KB; a larger file is not one


def folder_of(source: str) -> Path:
    return Path(source.split(":", 1)[1] if source.startswith("hf:") else source)


def read_json(path: Path) -> dict | None:
    """``path`` as a JSON object, or None when it is missing, too large, not JSON or not an object."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def class_name(folder: Path) -> str | None:
    """The diffusers class a model folder's config.json names (None: not a diffusers model folder)."""
    config = read_json(folder / CONFIG)
    if config is None or "_diffusers_version" not in config:
        return None
    name = config.get("_class_name")
    return name if isinstance(name, str) else None


def diffusers_module() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder never needs the network
    try:
        import diffusers
    except ImportError:
        raise missing_dependency("diffusers", "diffusion") from None
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    return diffusers


def model_class(name: str) -> type:
    """The diffusers model class called ``name``; anything else (a pipeline, a scheduler, an unknown name) is a
    SourceError."""
    diffusers = diffusers_module()
    cls = getattr(diffusers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.ModelMixin)):
        raise SourceError(f"config.json names '{name}', which is no diffusers model class (diffusers "
                          f"{diffusers.__version__})", "point hf: at a model folder saved with save_pretrained()")
    return cls


def load_pretrained(folder: Path, name: str | None = None) -> nn.Module:
    """The diffusers model saved in ``folder``, in eval mode, from local files only."""
    name = name or class_name(folder)
    if name is None:
        raise SourceError(f"{folder / CONFIG} is no diffusers model config (no _class_name)",
                          "point hf: at a folder written by save_pretrained()")
    cls = model_class(name)
    _sized(cls, folder, name)
    try:
        model = cls.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable folder is the same user error
        raise SourceError(f"cannot load the {name} in {folder}: {one_line(e, 200)}",
                          "the folder needs config.json and the weights save_pretrained() wrote") from None
    return model.eval()


WEIGHT_FILES = ("*.safetensors", "*.bin")


def _sized(cls: type, folder: Path, name: str) -> None:
    """What config.json asks for, counted without building it (on the meta device), against the weights on disk
    and this machine's memory: a config that asks for more is one line before anything is allocated."""
    config = read_json(folder / CONFIG)
    try:
        with torch.device("meta"):
            wanted = sum(p.numel() for p in cls.from_config(config).parameters())
    except Exception as e:  # noqa: BLE001 - a config the class cannot be built from
        raise SourceError(f"config.json does not build a {name}: {one_line(e, 200)}",
                          "fix config.json, or save the model again with save_pretrained()") from None
    on_disk = sum(f.stat().st_size for pattern in WEIGHT_FILES for f in folder.glob(pattern) if f.is_file())
    if not on_disk:
        raise SourceError(f"{folder} holds no weights (*.safetensors or *.bin) for its {name}",
                          "save the model with save_pretrained(), which writes them beside config.json")
    if wanted * 2 > on_disk * 1.5 + (1 << 20):  # at least 2 bytes a parameter (fp16/bf16) must be on disk
        raise SourceError(f"config.json asks for a {name} of {wanted:,} parameters; the weights in {folder} hold "
                          f"{on_disk:,} bytes", "the config and the weights are not of one model: save it again")
    memory = _memory_bytes()
    if memory and wanted * 4 > memory:
        raise SourceError(f"the {name} has {wanted:,} parameters: {wanted * 4 / 2**30:.1f} GiB in float32, more than "
                          f"this machine's {memory / 2**30:.1f} GiB", "export it on a machine with more memory")


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class Component(nn.Module):
    """A diffusers model called with flat tensors: each input goes to its keyword (or to a key inside one, as
    SDXL's ``added_cond_kwargs``), with the plan's constant keywords added."""

    def __init__(self, model: nn.Module, routes: Mapping[str, tuple[str, str | None]],
                 fixed: Mapping[str, Any], call: Callable[..., Any] | None = None) -> None:
        super().__init__()
        self.model = model
        self._routes = dict(routes)
        self._fixed = dict(fixed)
        self._call = call

    def forward(self, **inputs: torch.Tensor) -> Any:
        kwargs: dict[str, Any] = copy.deepcopy(self._fixed)
        for name, tensor in inputs.items():
            keyword, key = self._routes[name]
            if key is None:
                kwargs[keyword] = tensor
            else:
                kwargs.setdefault(keyword, {})[key] = tensor
        return (self._call or self.model)(**kwargs)


class VaeEncoder(nn.Module):
    """An autoencoder's encoder: image -> the latent distribution's parameters (mean and log-variance), the
    deterministic part of ``encode`` (sampling stays with the caller, as in Optimum's ``vae_encoder``)."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, sample: torch.Tensor) -> dict[str, torch.Tensor]:
        encoded = self.vae.encode(sample)
        dist = getattr(encoded, "latent_dist", None)
        if dist is None:  # a deterministic encoder (AutoencoderTiny): the latents themselves
            return {"latents": encoded.latents}
        return {"latent_parameters": dist.parameters}


class VaeDecoder(nn.Module):
    """An autoencoder's decoder: latent -> image."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sample": self.vae.decode(latent_sample).sample}


def vae_plans(config: Mapping[str, Any]) -> dict[str, Plan]:
    """The two halves of an autoencoder (``vae_encoder``, ``vae_decoder``): the image at the config's sample
    size, the latent at that size over the encoder's downsampling."""
    size = sample_size(config, 64)[0]
    levels = config.get("block_out_channels")
    factor = 2 ** (len(levels) - 1) if isinstance(levels, (list, tuple)) and levels else 8
    image = {"batch": BATCH, "height": around("height", size, factor), "width": around("width", size, factor)}
    latent_size = max(2, size // factor)
    latent = {"batch": BATCH, "height": around("height", latent_size, 1), "width": around("width", latent_size, 1)}
    channels = config.get("in_channels") or 3
    latent_channels = config.get("latent_channels") or 4
    return {
        "vae_encoder": Plan((InputSpec("sample", "float32", ("batch", channels, "height", "width")),), image,
                            {"sample": ("sample", None)}),
        "vae_decoder": Plan((InputSpec("latent_sample", "float32", ("batch", latent_channels, "height", "width")),),
                            latent, {"latent_sample": ("latent_sample", None)}),
    }


AUTOENCODER_PARTS: dict[str, type[nn.Module]] = {"vae_encoder": VaeEncoder, "vae_decoder": VaeDecoder}


def is_autoencoder(model: nn.Module) -> bool:
    return callable(getattr(model, "encode", None)) and callable(getattr(model, "decode", None))


def loaded(source: str, module: nn.Module, made: Plan, name: str, *, inputs: Sequence[InputSpec | str] | None,
           dims: Sequence[Dim | str] | None, compare: Any = None, extra: Mapping[str, Any] | None = None) -> LoadedModel:
    """The LoadedModel of ``module`` called as ``made`` says (declared --input / --dim win)."""
    specs = [s if isinstance(s, InputSpec) else parse_input(s) for s in inputs or ()]
    declared = [d if isinstance(d, Dim) else parse_dim(d) for d in dims or ()]
    module.eval()
    notes = tuple(info("made-up-inputs", note) for note in dict.fromkeys(made.notes))
    lm = finish(source, name, "diffusers", module, declared_or(specs, list(made.specs)), declared,
                Finishing(defaults=made.dims, ranges=made.ranges, diagnostics=notes,
                          extra={"model_type": None, "architecture": name, "library": "diffusers",
                                 **dict(extra or {})}))
    rules = compare if isinstance(compare, dict) else judging.parse_rules(compare)
    return judging.resolve(lm, rules)


def load(source: str, *, inputs: Sequence[InputSpec | str] | None = None, dims: Sequence[Dim | str] | None = None,
         compare: Any = None, part: str | None = None, **_: object) -> LoadedModel:
    """A diffusers model folder as one exportable model: the model itself, or one half of an autoencoder
    (``part``: ``vae_encoder`` / ``vae_decoder``; the encoder when not given)."""
    folder = folder_of(source)
    name = class_name(folder)
    model = load_pretrained(folder, name)
    assert name is not None
    if is_autoencoder(model):
        part = part or "vae_encoder"
        made = vae_plans(model.config)[part]
        return loaded(source, AUTOENCODER_PARTS[part](model), made, name, inputs=inputs, dims=dims, compare=compare,
                      extra={"part": part})
    made = plan(model.forward, model.config, name)
    module = Component(model, made.routes, made.fixed)
    if not inputs and not dims:
        made = within_reach(module, made)
    try:
        return loaded(source, module, made, name, inputs=inputs, dims=dims, compare=compare)
    except UsageError as first:
        square = squared(made)
        if inputs or square is None:
            raise
        try:  # some models run on square latents only (DiT unpatchifies by the square root of the token count)
            return loaded(source, module, square, name, inputs=inputs, dims=dims, compare=compare)
        except UsageError:
            raise first from None


def _runs(call: nn.Module, specs: tuple[InputSpec, ...], sizes: dict[str, int]) -> bool:
    try:
        with torch.inference_mode():
            call(*make_inputs(specs, sizes, seed=0))
    except Exception:  # noqa: BLE001 - any failure means: not at these sizes
        return False
    return True


def within_reach(module: nn.Module, made: Plan) -> Plan:
    """``made`` with each dim's largest size one the model runs at, the others at their export size (a position
    table holds so many patches: AuraFlow's, SD3's); a dim cut short is noted. The model is run once per dim
    when it runs at the largest size, as it does for most."""
    base = export_sizes(made.dims)
    call = make_flat(module, made.specs)
    dims, notes = dict(made.dims), list(made.notes)
    for sym, dim in made.dims.items():
        sizes = list(dim.sizes or range(dim.min, dim.max + 1))
        if sym == "batch" or len(sizes) < 2 or _runs(call, made.specs, {**base, sym: sizes[-1]}):
            continue
        # sizes[lo] runs (the export size's side), sizes[hi] does not
        lo, hi = max((i for i, n in enumerate(sizes) if n <= base[sym]), default=0), len(sizes) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _runs(call, made.specs, {**base, sym: sizes[mid]}) else (lo, mid)
        kept = tuple(n for n in sizes if n <= sizes[lo])
        dims[sym] = Dim(sym, kept[0], kept[-1], min(dim.example or kept[-1], kept[-1]),
                        sizes=kept if dim.sizes else None)
        notes.append(f"{sym} up to {kept[-1]}: the PyTorch model fails at {sizes[hi]} (its position table ends there)")
    return dataclasses.replace(made, dims=dims, notes=tuple(notes))


def squared(made: Plan) -> Plan | None:
    """``made`` with the latent's width tied to its height (one dim, ``height``), or None when it has no pair."""
    if "height" not in made.dims or "width" not in made.dims:
        return None
    specs = tuple(dataclasses.replace(s, shape=tuple("height" if d == "width" else d for d in s.shape))
                  for s in made.specs)
    dims = {k: v for k, v in made.dims.items() if k != "width"}
    return dataclasses.replace(made, specs=specs, dims=dims, notes=(
        *made.notes, "the model runs on square latents only (it fails when height and width differ): one dim, "
                     "height, sizes both"))
