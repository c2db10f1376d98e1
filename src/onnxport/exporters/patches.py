"""Library code known to export wrong, patched while exporting.

Each patch is small, tested, and applied only when its target is in the model; the patches applied to an
export are recorded (report.json ``export.patches``)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from onnxport.core.diagnostics import Diagnostic, info
from onnxport.sources.base import LoadedModel

CODE = "export-patch"


@dataclass(frozen=True)
class Patch:
    """One library function replaced for the duration of an export.

    ``module``/``attr`` name the function replaced; ``target`` is the class (``module:Name``) whose presence in
    the model makes the patch apply; ``exporters`` the exporter bases ("dynamo", "torchscript") it fixes;
    ``make(original)`` returns the replacement."""

    name: str
    fixes: str
    target: str
    module: str
    attr: str
    exporters: tuple[str, ...]
    make: Callable[[Callable], Callable]
    needs: Callable[[nn.Module], bool] | None = None  # of an instance of the target: whether it needs the patch

    def targets(self, model: nn.Module) -> bool:
        """Whether ``model`` holds an instance of the target class (or of a subclass of it) that needs it."""
        mod_name, cls_name = self.target.split(":")
        if mod_name not in sys.modules:  # never imported: no instance of it can exist
            return False
        cls = getattr(sys.modules[mod_name], cls_name, None)
        return isinstance(cls, type) and any(isinstance(m, cls) and (self.needs is None or self.needs(m))
                                             for m in model.modules())


PATCHES: dict[str, Patch] = {}


def register(patch: Patch) -> Patch:
    if patch.name in PATCHES:
        raise ValueError(f"patch '{patch.name}' is registered twice")
    PATCHES[patch.name] = patch
    return patch


def applicable(model: nn.Module, exporter: str) -> list[Patch]:
    """The registered patches for ``exporter`` whose target is in ``model``."""
    return [p for p in PATCHES.values() if exporter in p.exporters and p.targets(model)]


@contextlib.contextmanager
def applied(loaded: LoadedModel, exporter: str) -> Iterator[list[Diagnostic]]:
    """The patches whose target is in ``loaded`` applied for one export by ``exporter`` (its base: "dynamo" or
    "torchscript"), the model's attributes put back as they were before any run (``as_found``) before it (the
    check runs' caches dropped: the export computes them from its inputs) and after it (what the export cached,
    traced or fake tensors, never reaches a later run); yields the diagnostics that record them (info, code
    ``export-patch``)."""
    as_found = getattr(loaded.flat, "as_found", None) or (lambda: None)  # a model that is its own flat: none
    as_found()
    with contextlib.ExitStack() as stack:
        stack.callback(as_found)
        diags = []
        for patch in applicable(loaded.model, exporter):
            stack.enter_context(_replaced(patch))
            diags.append(info(CODE, f"{patch.name} patched while exporting ({exporter}): {patch.fixes}",
                              hint=f"{patch.module}.{patch.attr} is replaced only during the export"))
        yield diags


@contextlib.contextmanager
def _replaced(patch: Patch) -> Iterator[None]:
    owner = importlib.import_module(patch.module)
    original = getattr(owner, patch.attr)
    setattr(owner, patch.attr, patch.make(original))
    try:
        yield
    finally:
        setattr(owner, patch.attr, original)


# --------------------------------------------------------------------------- torchvision detection resize


def traced_resize_size(shape: torch.Tensor, min_size: float, max_size: float) -> torch.Tensor:
    """The size torchvision's eager ``_resize_image_and_masks`` resizes an image of ``shape`` [2] (H, W) to,
    as tensor ops: ``floor(side * min(min_size / short, max_size / long))`` in float64, as eager computes it
    with Python floats (the traced branch computes it in float32, one pixel off at some sizes)."""
    sides = shape.to(torch.float64)
    extremes = torch.stack([sides.min(), sides.max()])  # 1-D: the exporter keeps 0-dim operands in float32
    limits = extremes * 0 + torch.stack([extremes[0] * 0 + float(min_size), extremes[1] * 0 + float(max_size)])
    # true divisions (``number / tensor`` is a reciprocal and a product: two roundings)
    scale = torch.div(limits, extremes).amin(dim=0, keepdim=True)
    return torch.floor(sides * scale).to(torch.int64)


def _exact_resize(original: Callable) -> Callable:
    def resize(image, self_min_size, self_max_size, target=None, fixed_size=None):
        if fixed_size is not None or not torch._C._get_tracing_state():
            return original(image, self_min_size, self_max_size, target, fixed_size)
        size = traced_resize_size(torch.onnx.operators.shape_as_tensor(image)[-2:], self_min_size, self_max_size)
        out_size = [size[0], size[1]]
        image = torch.nn.functional.interpolate(image[None], size=out_size, mode="bilinear",
                                                align_corners=False)[0]
        if target is not None and "masks" in target:
            masks = torch.nn.functional.interpolate(target["masks"][:, None].float(), size=out_size)[:, 0]
            target["masks"] = masks.byte()
        return image, target

    resize.__wrapped__ = original
    return resize


RCNN_RESIZE = register(Patch(
    name="torchvision-rcnn-resize",
    fixes="GeneralizedRCNNTransform's resize size computed in float64 as in eager (the traced branch computes "
          "it in float32: at some image sizes the image entering the backbone is one pixel larger or smaller)",
    target="torchvision.models.detection.transform:GeneralizedRCNNTransform",
    module="torchvision.models.detection.transform",
    attr="_resize_image_and_masks",
    exporters=("torchscript",),
    make=_exact_resize,
))


# --------------------------------------------------------------------------- adaptive average pooling


def _pool_matrix(size, out: int, like: torch.Tensor) -> torch.Tensor:
    """[out, size]: row i averages input positions floor(i*size/out) .. ceil((i+1)*size/out) - 1, the windows
    of adaptive average pooling, computed from ``size`` at run time."""
    i = torch.arange(out, device=like.device)
    start = torch.div(i * size, out, rounding_mode="floor")
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode="floor")
    j = torch.arange(size, device=like.device)
    inside = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
    return inside.to(like.dtype) / (end - start)[:, None].to(like.dtype)


def _windowed(output_size: int | tuple) -> bool:
    """Whether adaptive pooling to ``output_size`` has windows that depend on the input size (not a global pool)."""
    out = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    return None not in out and out != (1, 1)


def _dynamic_adaptive_avg_pool(original: Callable) -> Callable:
    def adaptive_avg_pool2d(input, output_size):  # noqa: A002 - torch's own parameter name
        out = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
        if not _windowed(output_size) or input.dim() not in (3, 4):
            return original(input, output_size)  # a global pool exports as one at every size
        rows = _pool_matrix(input.shape[-2], out[0], input)
        cols = _pool_matrix(input.shape[-1], out[1], input)
        return torch.matmul(torch.matmul(rows, input), cols.transpose(0, 1))

    adaptive_avg_pool2d.__wrapped__ = original
    return adaptive_avg_pool2d


ADAPTIVE_AVG_POOL = register(Patch(
    name="adaptive-avg-pool",
    fixes="adaptive average pooling to a size other than 1 written as two products with averaging matrices "
          "built from the input's size at run time (the exporters write its windows for the example size only: "
          "wrong at every size whose feature map does not divide evenly the same way)",
    target="torch.nn.modules.pooling:AdaptiveAvgPool2d",
    module="torch.nn.functional",
    attr="adaptive_avg_pool2d",
    exporters=("dynamo", "torchscript"),
    make=_dynamic_adaptive_avg_pool,
    needs=lambda pool: _windowed(pool.output_size),  # a global pool (ResNet's) exports right at every size
))
