"""``torchvision:NAME`` and ``timm:NAME`` sources (random weights; no downloads)."""

from __future__ import annotations

import inspect

from torch import nn

from onnxport.core.errors import SourceError, missing_dependency
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.base import LoadedModel
from onnxport.sources.finish import Finishing, declared_or, finish

IMAGE_DIMS = {
    "batch": Dim("batch", 1, 16, 2),
    "height": Dim("height", 32, 512, 224),
    "width": Dim("width", 32, 512, 240),
}


def _image_inputs(channels: int, size: tuple[int, int] | None) -> list[InputSpec]:
    if size is None:
        return [InputSpec("image", "float32", ("batch", channels, "height", "width"))]
    return [InputSpec("image", "float32", ("batch", channels, size[0], size[1]))]


def load_torchvision(source: str, inputs: list[InputSpec], dims: list[Dim]) -> LoadedModel:
    try:
        import torchvision
    except ImportError:
        raise missing_dependency("torchvision", "vision") from None
    name = source.split(":", 1)[1]
    try:
        builder = torchvision.models.get_model_builder(name)
    except ValueError:
        known = torchvision.models.list_models()
        close = [k for k in known if name.lower()[:4] in k][:8]
        raise SourceError(f"torchvision has no model '{name}'",
                          f"e.g. {', '.join(close or known[:8])} (see torchvision.models.list_models())") from None
    kwargs = {"weights": None}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs["weights_backbone"] = None  # detection/segmentation builders default to downloading a backbone
    model = builder(**kwargs)
    fixed = getattr(model, "image_size", None)
    size = (fixed, fixed) if isinstance(fixed, int) else None
    if name.startswith("inception"):
        model.aux_logits, model.AuxLogits = False, None
    defaults = dict(IMAGE_DIMS)
    if name.startswith(("inception", "googlenet")):
        defaults["height"] = Dim("height", 96, 512, 299)
        defaults["width"] = Dim("width", 96, 512, 307)
    specs = declared_or(inputs, _image_inputs(3, size))
    if not inputs and name in torchvision.models.list_models(module=torchvision.models.detection):
        # a detector takes a list of images, and a trace unrolls its loop over them: one image per run
        specs = [InputSpec("image", "float32", (1, 3, "height", "width"))]
    return finish(source, name, "torchvision", model, specs, dims, Finishing(defaults=defaults, built_here=True))


def load_timm(source: str, inputs: list[InputSpec], dims: list[Dim]) -> LoadedModel:
    try:
        import timm
    except ImportError:
        raise missing_dependency("timm", "vision") from None
    name = source.split(":", 1)[1]
    try:
        model: nn.Module = timm.create_model(name, pretrained=False)
    except RuntimeError as e:
        raise SourceError(f"timm cannot build '{name}': {e}", "see timm.list_models() for the names") from None
    cfg = getattr(model, "pretrained_cfg", None) or {}
    channels, h, w = cfg.get("input_size", (3, 224, 224))
    fixed = bool(cfg.get("fixed_input_size", False))
    defaults = dict(IMAGE_DIMS)
    defaults["height"] = Dim("height", 32, max(512, h), h)
    defaults["width"] = Dim("width", 32, max(512, w), w + 16)
    specs = declared_or(inputs, _image_inputs(channels, (h, w) if fixed else None))
    return finish(source, name, "timm", model, specs, dims, Finishing(defaults=defaults, built_here=True))
