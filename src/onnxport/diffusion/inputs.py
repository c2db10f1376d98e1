"""The inputs of a diffusers model, made up from its config: which tensors its forward takes, their shapes and
dims, and where each one goes in the call (a flat input may be one entry of a keyword dict, as SDXL's
``added_cond_kwargs``). Rules are data keyed by the forward parameter's name; a model whose required
parameter no rule knows is refused by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from onnxport.core.errors import SourceError
from onnxport.core.spec import Dim, InputSpec

BATCH = Dim("batch", 1, 4, 2)
TEXT = Dim("text", 1, 77, 8)  # text-encoder tokens (CLIP's 77 at most; T5 prompts are cut to their own length)


@dataclass(frozen=True)
class Plan:
    """How to call one model: its flat input specs (in forward order), the dims they use (defaults a --dim
    overrides), integer value ranges, where each flat input goes (``routes``: name -> (keyword, key inside that
    keyword or None)) and the keywords given as constants (``fixed``)."""

    specs: tuple[InputSpec, ...]
    dims: dict[str, Dim]
    routes: dict[str, tuple[str, str | None]]
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def setting(config: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` that ``config`` sets (not None), else None; a per-block tuple gives its first."""
    for name in names:
        value = config.get(name)
        if value is not None:
            return value[0] if isinstance(value, (tuple, list)) and value and name.endswith("_dim") else value
    return None


def _positive(config: Mapping[str, Any], *names: str) -> int:
    value = setting(config, *names)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SourceError(f"config.json: {' / '.join(names)} = {value!r} is not valid (a positive integer)",
                          "fix config.json, or save the model again with save_pretrained()")
    return value


MAX_SAMPLE = 4096  # no model's sample is larger (SD's latents are 64..128, its images 512..1024)


def sample_size(config: Mapping[str, Any], default: int = 32) -> tuple[int, int]:
    """The config's ``sample_size`` as (height, width): ``default`` when it gives none; a SourceError naming
    it when it is no size (not a positive integer or a pair of them, or over :data:`MAX_SAMPLE`)."""
    size = config.get("sample_size")
    if size is None:
        return default, default
    pair = [size, size] if isinstance(size, int) else size
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_SAMPLE for n in pair)):
        raise SourceError(f"config.json: sample_size = {str(size)[:60]!r} is not valid (a positive integer or a "
                          f"pair of them, at most {MAX_SAMPLE})", "fix config.json, or save the model again")
    return int(pair[0]), int(pair[1])





def _factor(config: Mapping[str, Any]) -> int:
    """What the latent's height and width must be multiples of: the UNet's downsamplings or the patch size."""
    levels = config.get("block_out_channels")
    if isinstance(levels, (list, tuple)) and levels and config.get("patch_size") is None:
        return 2 ** (len(levels) - 1)
    patch = config.get("patch_size")
    return patch if isinstance(patch, int) and patch > 0 else 1


def around(symbol: str, size: int, factor: int) -> Dim:
    """``size/2 .. 2·size`` at multiples of ``factor``, exported at ``size`` (snapped to a multiple)."""
    factor = max(1, min(factor, max(size, 1)))
    size = max(factor, size // factor * factor)
    lo = max(factor, (size // 2) // factor * factor)
    hi = max(2 * size // factor * factor, lo)
    if factor == 1:
        return Dim(symbol, max(lo, 1), hi, size)
    return Dim(symbol, lo, hi, size, sizes=tuple(range(lo, hi + 1, factor)))


@dataclass
class _Builder:
    config: Mapping[str, Any]
    params: dict[str, inspect.Parameter]
    specs: list[InputSpec] = field(default_factory=list)
    dims: dict[str, Dim] = field(default_factory=dict)
    routes: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, dtype: str, shape: tuple[int | str, ...], into: tuple[str, str | None] | None = None,
            value_range: tuple[int, int] | None = None) -> None:
        self.specs.append(InputSpec(name, dtype, shape, value_range))
        self.routes[name] = into or (name, None)
        for sym in shape:
            if isinstance(sym, str) and sym not in self.dims:
                self.dims[sym] = self._dim(sym)

    def _dim(self, sym: str) -> Dim:
        if sym == "batch":
            return BATCH
        if sym == "text":
            return TEXT
        height, width = sample_size(self.config)
        if sym == "image":  # packed latent tokens (Flux): (height/2)·(width/2) at the model's size
            n = max(4, (height // 2) * (width // 2))
            return Dim("image", max(1, n // 4), 4 * n, n)
        factor = _factor(self.config)
        limit = self.config.get("pos_embed_max_size")  # SD3: positions cropped from a table of this many patches
        if isinstance(limit, int) and limit > 0:
            # the crop's centre, (limit - patches) // 2, exports wrong for an odd patch count: even counts only
            factor *= 2
            self.notes.append(f"{sym} at multiples of {factor} (an even number of patches: the position table's "
                              "centred crop is proven there)")
        dim = around(sym, height if sym == "height" else width, factor)
        if isinstance(limit, int) and limit > 0 and dim.sizes:
            sizes = tuple(n for n in dim.sizes if n <= limit * _factor(self.config)) or dim.sizes[:1]
            dim = Dim(sym, sizes[0], sizes[-1], min(max(dim.example or sizes[0], sizes[0]), sizes[-1]), sizes=sizes)
        return dim

    @property
    def packed(self) -> bool:
        """Latents as a sequence of 2×2 patches with position ids (Flux and its kin), not as an image."""
        return "img_ids" in self.params


Rule = Callable[[_Builder], None]


def _latent(b: _Builder, name: str) -> None:
    channels = _positive(b.config, "in_channels")
    if b.packed:
        b.add(name, "float32", ("batch", "image", channels))
    else:
        b.add(name, "float32", ("batch", channels, "height", "width"))


def _timestep(b: _Builder) -> None:
    b.add("timestep", "float32", ("batch",))


def _text(b: _Builder) -> None:
    width = _positive(b.config, "encoder_hid_dim", "caption_channels", "joint_attention_dim", "cross_attention_dim")
    b.add("encoder_hidden_states", "float32", ("batch", "text", width))


def _pooled(b: _Builder) -> None:
    b.add("pooled_projections", "float32", ("batch", _positive(b.config, "pooled_projection_dim")))


def _ids(b: _Builder, name: str, tokens: str) -> None:
    b.add(name, "float32", (tokens, 3))


def _guidance(b: _Builder) -> None:
    if b.config.get("guidance_embeds"):
        b.add("guidance", "float32", ("batch",))


def _class_labels(b: _Builder) -> None:
    classes = setting(b.config, "num_class_embeds", "num_embeds_ada_norm")
    if b.config.get("class_embed_type") is None and isinstance(classes, int) and classes > 0:
        b.add("class_labels", "int64", ("batch",), value_range=(0, classes - 1))
        b.ranges["class_labels"] = (0, classes - 1)


def _timestep_cond(b: _Builder) -> None:
    dim = b.config.get("time_cond_proj_dim")
    if isinstance(dim, int) and dim > 0:
        b.add("timestep_cond", "float32", ("batch", dim))


def _added_cond(b: _Builder) -> None:
    """SDXL's pooled text embedding and its six size ids (``text_time``); PixArt's resolution and aspect ratio
    (given as None when the model takes no additional conditions)."""
    kind = b.config.get("addition_embed_type")
    if kind == "text_time":
        time_dim = _positive(b.config, "addition_time_embed_dim")
        total = _positive(b.config, "projection_class_embeddings_input_dim")
        b.add("text_embeds", "float32", ("batch", total - 6 * time_dim), into=("added_cond_kwargs", "text_embeds"))
        b.add("time_ids", "float32", ("batch", 6), into=("added_cond_kwargs", "time_ids"))
    elif kind is not None:
        raise SourceError(f"config.json: addition_embed_type {kind!r} needs inputs onnxport cannot make up",
                          "export the model as a Python module with --input for each of its inputs")
    elif "norm_type" in b.config:  # the PixArt-style transformers
        if b.config.get("use_additional_conditions") or (b.config.get("use_additional_conditions") is None
                                                         and sample_size(b.config)[0] == 128):
            b.add("resolution", "float32", ("batch", 2), into=("added_cond_kwargs", "resolution"))
            b.add("aspect_ratio", "float32", ("batch", 1), into=("added_cond_kwargs", "aspect_ratio"))
        else:
            b.fixed["added_cond_kwargs"] = {"resolution": None, "aspect_ratio": None}


def _controlnet_cond(b: _Builder) -> None:
    """A ControlNet's conditioning: an image at the pixel size (UNet ControlNets: the latent's size times the
    conditioning embedding's downsampling, so height and width are fixed there), else a latent."""
    if "conditioning_embedding_out_channels" in b.config:
        height, width = sample_size(b.config)
        scale = 2 ** (len(b.config["conditioning_embedding_out_channels"]) - 1)
        b.dims["height"] = Dim("height", height, height, height)
        b.dims["width"] = Dim("width", width, width, width)
        channels = _positive(b.config, "conditioning_channels")
        b.add("controlnet_cond", "float32", ("batch", channels, height * scale, width * scale))
        b.notes.append(f"the conditioning image is {scale}× the latent's size, so the latent is fixed at "
                       f"{height}×{width} (batch and text stay dynamic)")
    else:
        _latent(b, "controlnet_cond")


RULES: dict[str, Rule] = {
    "sample": lambda b: _latent(b, "sample"),
    "hidden_states": lambda b: _latent(b, "hidden_states"),
    "timestep": _timestep,
    "encoder_hidden_states": _text,
    "pooled_projections": _pooled,
    "img_ids": lambda b: _ids(b, "img_ids", "image"),
    "txt_ids": lambda b: _ids(b, "txt_ids", "text"),
    "guidance": _guidance,
    "class_labels": _class_labels,
    "timestep_cond": _timestep_cond,
    "added_cond_kwargs": _added_cond,
    "controlnet_cond": _controlnet_cond,
}
OPTIONAL = frozenset({"pooled_projections", "img_ids", "txt_ids", "encoder_hidden_states", "timestep",
                      "guidance", "class_labels", "timestep_cond", "added_cond_kwargs"})  # made when the config says


def plan(forward: Callable[..., Any], config: Mapping[str, Any], name: str) -> Plan:
    """The inputs of ``forward`` (a diffusers model's), made up from ``config``; a required parameter no rule
    knows is a SourceError naming it."""
    params = {p.name: p for p in list(inspect.signature(forward).parameters.values())
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
    b = _Builder(config, params)
    for pname, p in params.items():
        rule = RULES.get(pname)
        if rule is not None and p.default is p.empty:
            rule(b)
        elif rule is not None and pname in OPTIONAL:
            try:
                rule(b)
            except SourceError:  # an optional input the config gives no size for: left to its default
                continue
        elif p.default is p.empty:
            raise SourceError(f"{name}.forward() takes '{pname}', which onnxport cannot make up from config.json",
                              "export it as a Python module with --input for each of forward()'s inputs")
    return Plan(tuple(b.specs), dict(b.dims), dict(b.routes), dict(b.ranges), dict(b.fixed), tuple(b.notes))
