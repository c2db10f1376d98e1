"""``torchvision:NAME`` and ``timm:NAME`` sources (random weights; no downloads)."""

from __future__ import annotations

import dataclasses
import inspect

import torch
from torch import nn

from onnxport.core.diagnostics import Diagnostic, info
from onnxport.core.errors import SourceError, missing_dependency
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.base import LoadedModel, required_positional
from onnxport.sources.finish import Finishing, declared_or, finish

EXAMPLE_SIDE = 384  # a timm model of any size trained larger (Qwen3-VL's 768, SAM2's 896) is exported at this side:
# every check and case before the proof's own runs at the example, a 768 x 768 ViT forward costs 16 times a 384 one
IMAGE_DIMS = {
    "batch": Dim("batch", 1, 16, 2),
    "height": Dim("height", 32, 512, 224),
    "width": Dim("width", 32, 512, 240),
}


VIDEO_DIMS = {  # a clip: small by default, frames and sides widened where the weights' metadata needs more
    "batch": Dim("batch", 1, 4, 2),
    "frames": Dim("frames", 1, 16, 4),
    "height": Dim("height", 32, 160, 64),
    "width": Dim("width", 32, 160, 80),
}
SIZED = ("batch", "frames", "height", "width")  # default ranges narrowed for a model too costly to prove over them
IMAGE_PARAMS = ("image", "img")  # forward parameters that each take an image (optical flow: image1, image2)
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # the layers whose random weights lively and awake reset


def _image_inputs(channels: int, size: tuple[int, int] | None, names: tuple[str, ...] = ("image",)
                  ) -> list[InputSpec]:
    sides: tuple[int | str, int | str] = size if size is not None else ("height", "width")
    return [InputSpec(n, "float32", ("batch", channels, *sides)) for n in names]


def _weights_meta(torchvision, name: str) -> dict:
    """What the first weights of ``name`` say about its inputs (never downloaded): ``min_size`` (h, w),
    ``min_temporal_size`` (frames) and ``crop`` (h, w), the size its preprocessing hands the model."""
    try:
        weights = next(iter(torchvision.models.get_model_weights(name)))
    except (ValueError, StopIteration, KeyError):
        return {}
    meta = {k: weights.meta[k] for k in ("min_size", "min_temporal_size") if k in weights.meta}
    try:
        crop = getattr(weights.transforms(), "crop_size", None)
    except Exception:  # noqa: BLE001 - a preprocessing that cannot be built: no crop size known
        crop = None
    if crop:
        meta["crop"] = (int(crop[0]), int(crop[-1]))
    return meta


def _image_params(model: nn.Module) -> tuple[str, ...]:
    """The forward parameters without a default, when there are several and each takes an image (RAFT's
    ``image1``, ``image2``); else ("image",), one image bound to the first parameter."""
    params = required_positional(model)
    return tuple(params) if len(params) > 1 and all_images(params) else ("image",)


def all_images(names: list[str]) -> bool:
    """Every name is an image's (``image``, ``image1``, ``img2``...)."""
    return all(n.startswith(IMAGE_PARAMS) for n in names)


def _torchvision_dims(name: str, meta: dict, video: bool, flow: bool = False) -> dict[str, Dim]:
    """The default dims: an image's; a video clip's (batch, frames, height, width), each side at least the
    weights' ``min_size`` and frames their ``min_temporal_size``, the example at their crop size."""
    defaults = dict(VIDEO_DIMS if video else IMAGE_DIMS)
    if name.startswith(("inception", "googlenet")):
        defaults["height"] = Dim("height", 96, 512, 299)
        defaults["width"] = Dim("width", 96, 512, 307)
    if flow:  # RAFT: two images, each side a multiple of 8 from the weights' min_size (128) up
        low = max(meta.get("min_size", (128, 128)))
        sides = tuple(range(low, 2 * low + 1, 8))
        defaults["batch"] = Dim("batch", 1, 4, 2)
        defaults["height"] = Dim("height", low, sides[-1], low, sizes=sides, rule="multiples of 8")
        defaults["width"] = Dim("width", low, sides[-1], low + 16, sizes=sides, rule="multiples of 8")
    if not video:
        return defaults
    low_h, low_w = meta.get("min_size", (1, 1))
    for sym, low, extra in (("height", low_h, 0), ("width", low_w, 16)):
        d = defaults[sym]
        if low > d.min:
            example = meta.get("crop", (low, low))[sym == "width"] + extra
            defaults[sym] = Dim(sym, low, max(d.max, low + 32), min(max(example, low), max(d.max, low + 32)))
    frames = int(meta.get("min_temporal_size") or 1)
    if frames > defaults["frames"].min:
        defaults["frames"] = Dim("frames", frames, max(16, frames + 2), max(8, frames))
    return defaults


def _one_size(meta: dict, video: bool) -> dict[str, int]:
    """The sizes to try when the model fails at the example sizes: the weights' crop size (and their least
    frames for a clip): a model built for one size only (MaxViT, MViT) runs there."""
    crop = meta.get("crop") or meta.get("min_size")
    sizes = {"height": int(crop[0]), "width": int(crop[1])} if crop and min(crop) > 1 else {}
    if video and sizes and int(meta.get("min_temporal_size") or 1) > 1:
        sizes["frames"] = int(meta["min_temporal_size"])
    return sizes


def lively(model: nn.Module) -> tuple[Diagnostic, ...]:
    """Random weights a proof can tell from others: a Linear or convolution whose weight the library initialises
    to all zeros (torchvision's ViT head, timm's Hiera head: the trained weights replace them) makes every output
    the same for every input, which no comparison can tell a right file from a wrong one by. Such modules get
    PyTorch's default initialisation (seeded like the rest), said in one note; models with weights of the
    user's are never touched (this runs on torchvision:/timm: names only)."""
    reset = []
    for name, m in model.named_modules():
        weight = getattr(m, "weight", None)
        if isinstance(m, _LAYERS) and weight is not None and weight.numel() \
                and not weight.detach().any():
            m.reset_parameters()
            reset.append(name or type(m).__name__)
    if not reset:
        return ()
    shown = ", ".join(reset[:4]) + (f" and {len(reset) - 4} more" if len(reset) > 4 else "")
    return (info("random-weights-lively", f"{shown}: all-zero initial weights (replaced by trained ones in a real "
                 "checkpoint) given PyTorch's default random initialisation, so the outputs depend on the inputs "
                 "and the proof can tell a right file from a wrong one"),)


LOUD = 1e4  # outputs beyond this with random weights: activations that grew layer by layer (Inception's std 0.1)


def unlike(lm: LoadedModel) -> str | None:
    """Why random weights make outputs no proof can judge, else None: the same for two random inputs at the
    export sizes (by shapes, or values within 1e-4 of their magnitude and 1e-6; GoogLeNet's std-0.01 layers make
    every activation vanish by the last one), an output holding one value throughout for both (SSDlite's tied
    scores), or over :data:`LOUD` (activations that grew layer by layer: float32
    rounding then changes the answer itself, so PyTorch and any file differ by more than any tolerance)."""
    sizes = export_sizes(lm.dims)
    with torch.inference_mode():
        a, b = (lm.flat(*make_inputs(lm.inputs, sizes, seed=seed)) for seed in (0, 1))
    floats = [x for x in a if x.is_floating_point() and x.numel()]
    loudest = max((float(x.abs().max()) for x in floats), default=0.0)
    if loudest > LOUD:
        return f"as large as {loudest:.1e}"
    for x, y in zip(a, b):
        if x.is_floating_point() and x.numel() > 1 and bool((x == x.reshape(-1)[0]).all()) \
                and bool((y == y.reshape(-1)[0]).all()):
            return "one value throughout (tied scores: no order to compare)"
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return None
        if x.numel() and not x.is_floating_point() and not torch.equal(x, y):
            return None
        if x.numel() and x.is_floating_point():
            scale = float(x.abs().max()) or 1.0
            if float((x.double() - y.double()).abs().max()) > max(1e-4 * scale, 1e-6):
                return None
    return "the same for every input"


def awake(lm: LoadedModel) -> LoadedModel:
    """``lm`` whose outputs a proof can judge: when the library's random initialisation makes them
    :func:`unlike` (scaled for training; trained weights replace it), every Linear and convolution gets He's
    initialisation (seeded; it keeps the activations' scale from layer to layer), with its batch norms'
    statistics measured on a random batch when that alone is not enough, said in a ``random-weights-lively``
    note; a model still unlike gets the library's weights back (its proof says why). For ``torchvision:``/
    ``timm:`` names only: the user's weights are never touched."""
    why = unlike(lm)
    if why is None:
        return lm
    layers = [m for m in lm.model.modules() if isinstance(m, _LAYERS)]
    kept = [m.weight.detach().clone() for m in layers]
    torch.manual_seed(0)
    for m in layers:
        nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
    he = "every Linear and convolution got a variance-keeping random initialisation (He, fan in)"
    norms = ("its batch norms got the statistics of a random batch (as training would give them), so each "
             "normalises its input")
    if unlike(lm) is None:
        how = he
    elif _calibrated(lm):  # both: a detector's heads score above its threshold only on normalised features
        how = f"{he} and {norms}"
    else:  # no better (ConvMixer's residual sums grow with any weights): the library's weights back, its batch
        with torch.no_grad():  # norms' statistics measured instead
            for m, w in zip(layers, kept):
                m.weight.copy_(w)
        if not _calibrated(lm):
            return lm
        how = norms
    note = info("random-weights-lively", f"with the library's random initialisation (scaled for training: trained "
                f"weights replace it) the outputs were {why}, so {how}, and the proof can tell a right file from a "
                "wrong one")
    return dataclasses.replace(lm, diagnostics=(*lm.diagnostics, note))


def _calibrated(lm: LoadedModel) -> bool:
    """Whether measuring every batch norm's running statistics on one random batch at the export sizes (a residual
    network's sums otherwise grow block by block: ResNet-101's outputs near 1e5) makes the outputs judgeable;
    the statistics go back as they were when it does not."""
    norms = [m for m in lm.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return False
    kept = [(m.running_mean.clone(), m.running_var.clone(), m.momentum) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: one batch sets the statistics
        m.train()
    try:
        with torch.no_grad():
            lm.flat(*make_inputs(lm.inputs, export_sizes(lm.dims), seed=2))
    except Exception:  # noqa: BLE001 - norms that cannot run in train mode here: no statistics measured
        pass
    for m, (_, _, momentum) in zip(norms, kept):
        m.eval()
        m.momentum = momentum
    if unlike(lm) is None:
        return True
    with torch.no_grad():
        for m, (mean, var, _) in zip(norms, kept):
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
    return False


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
    notes = lively(model)
    fixed = getattr(model, "image_size", None)
    size = (fixed, fixed) if isinstance(fixed, int) else None
    if name.startswith("inception"):
        model.aux_logits, model.AuxLogits = False, None
    video = name in torchvision.models.list_models(module=torchvision.models.video)
    meta = _weights_meta(torchvision, name)
    if video:  # a clip: [batch, channels, frames, height, width]
        made = [InputSpec("video", "float32", ("batch", 3, "frames", "height", "width"))]
    else:
        made = _image_inputs(3, size, _image_params(model))
    specs = declared_or(inputs, made)
    if not inputs and name in torchvision.models.list_models(module=torchvision.models.detection):
        # a detector takes a list of images, and a trace unrolls its loop over them: one image per run
        specs = [InputSpec("image", "float32", (1, 3, "height", "width"))]
    flow = name in torchvision.models.list_models(module=torchvision.models.optical_flow)
    more = Finishing(defaults=_torchvision_dims(name, meta, video, flow), built_here=True, diagnostics=notes,
                     one_size=None if inputs or dims else _one_size(meta, video), sized=SIZED,
                     fixed_at=_one_size(meta, video))
    return awake(finish(source, name, "torchvision", model, specs, dims, more))


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
    eh, ew = (h, w) if fixed else (min(h, EXAMPLE_SIDE), min(w, EXAMPLE_SIDE))
    defaults["height"] = Dim("height", 32, max(512, h), eh)
    defaults["width"] = Dim("width", 32, max(512, w), ew + 16)
    specs = declared_or(inputs, _image_inputs(channels, (h, w) if fixed else None))
    return awake(finish(source, name, "timm", model, specs, dims,
                        Finishing(defaults=defaults, built_here=True, diagnostics=lively(model), sized=SIZED,
                                  fixed_at={"height": h, "width": w})))
