"""Library code patched while exporting: each patch applies only when its target is in the model, is undone
after the export, is recorded, and makes the export match eager where the unpatched one does not."""

import math
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torchvision.models.detection.transform as tv_transform
from torch import nn

from onnxport.exporters import patches


def _eager_size(h: int, w: int, min_size: int, max_size: int) -> tuple[int, int]:
    """What torchvision's eager resize computes (Python floats)."""
    scale = min(min_size / min(h, w), max_size / max(h, w))
    return math.floor(h * scale), math.floor(w * scale)


class _Transform(nn.Module):
    """Only the detector's transform: normalize, resize, pad to a multiple of 32."""

    def __init__(self, min_size: int = 320, max_size: int = 640) -> None:
        super().__init__()
        self.transform = tv_transform.GeneralizedRCNNTransform(min_size, max_size, [0.485, 0.456, 0.406],
                                                               [0.229, 0.224, 0.225])

    def forward(self, image: torch.Tensor):
        images, _ = self.transform(list(image))
        return images.tensors


def _loaded(model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(model=model, flat=model)


def test_a_patch_applies_only_when_its_target_is_in_the_model():
    with patches.applied(_loaded(nn.Sequential(nn.Linear(2, 2))), "torchscript") as diags:
        assert diags == []
        assert not hasattr(tv_transform._resize_image_and_masks, "__wrapped__")


def test_a_patch_is_recorded_and_undone_after_the_export():
    original = tv_transform._resize_image_and_masks
    with patches.applied(_loaded(_Transform()), "torchscript") as diags:
        assert tv_transform._resize_image_and_masks is not original
        assert tv_transform._resize_image_and_masks.__wrapped__ is original
    assert tv_transform._resize_image_and_masks is original
    assert [d.code for d in diags] == ["export-patch"]
    assert diags[0].severity == "info"
    assert "torchvision-rcnn-resize" in diags[0].message and "float32" in diags[0].message


def test_a_patch_is_undone_when_the_export_fails():
    original = tv_transform._resize_image_and_masks
    with pytest.raises(RuntimeError), patches.applied(_loaded(_Transform()), "torchscript"):
        raise RuntimeError("the exporter failed")
    assert tv_transform._resize_image_and_masks is original


def test_a_patch_applies_only_to_the_exporters_it_fixes():
    with patches.applied(_loaded(_Transform()), "dynamo") as diags:
        assert diags == []


def test_the_patched_resize_size_is_eager_s_at_every_size():
    sizes = [(h, w) for h in range(32, 200, 3) for w in range(32, 700, 7)] + [(32, 77), (32, 71), (64, 640)]
    for min_size, max_size in ((320, 640), (800, 1333)):
        got = [tuple(patches.traced_resize_size(torch.tensor(s), min_size, max_size).tolist()) for s in sizes]
        want = [_eager_size(h, w, min_size, max_size) for h, w in sizes]
        assert got == want


def test_eager_is_untouched_by_the_patch():
    model = _Transform().eval()
    x = torch.randn(1, 3, 32, 77)
    with torch.no_grad():
        before = model(x)
        with patches.applied(_loaded(model), "torchscript"):
            during = model(x)
    assert torch.equal(before, during)


def _export(model: nn.Module, path, size: tuple[int, int]) -> None:
    torch.onnx.export(model, (torch.randn(1, 3, *size),), str(path), dynamo=False, input_names=["image"],
                      output_names=["batched"], dynamic_axes={"image": {2: "h", 3: "w"}, "batched": {2: "H", 3: "W"}},
                      opset_version=17)


def test_the_traced_detector_transform_resizes_like_eager_with_the_patch(tmp_path):
    """At 32×77 eager resizes to 265×639; the traced float32 size is 265×640 (the image entering the backbone
    differs: error ~15 after padding). Patched, the ONNX image is eager's."""
    model = _Transform().eval()
    path = tmp_path / "transform.onnx"
    with patches.applied(_loaded(model), "torchscript"):
        _export(model, path, (224, 240))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for h, w in ((32, 77), (32, 71), (224, 225), (64, 640), (77, 32)):
        x = torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            want = model(x).numpy()
        got = sess.run(None, {"image": x.numpy()})[0]
        assert got.shape == want.shape
        resized = _eager_size(h, w, 320, 640)
        # the resized image itself (not only its padded batch): the same pixels, up to the resize kernel's rounding
        assert np.abs(got[..., :resized[0], :resized[1]] - want[..., :resized[0], :resized[1]]).max() < 1e-3
        assert not got[..., resized[0]:, :].any() and not got[..., resized[1]:].any()  # the padding


class _Pool(nn.Module):
    """AlexNet's and VGG's head: adaptive average pooling to 6 x 6, whatever the feature map's size."""

    def __init__(self, size=(6, 6)) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(size)

    def forward(self, x):
        return self.pool(x)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_adaptive_pooling_is_exported_for_every_size(tmp_path, exporter):
    """Patched, the export pools right at sizes whose windows differ from the example's (13 -> 6 overlaps,
    7 and 29 do not divide); a global pool is left to the exporter."""
    model, path = _Pool().eval(), tmp_path / "pool.onnx"
    with patches.applied(_loaded(model), exporter) as diags:
        if exporter == "dynamo":
            side = torch.export.Dim("side", min=6, max=64)
            torch.onnx.export(model, (torch.randn(2, 3, 13, 13),), path, dynamo=True,
                              dynamic_shapes=({2: side, 3: side},))
        else:
            torch.onnx.export(model, (torch.randn(2, 3, 13, 13),), path, dynamo=False, input_names=["x"],
                              dynamic_axes={"x": {2: "h", 3: "w"}})
    assert [d.code for d in diags] == ["export-patch"]
    sess = ort.InferenceSession(str(path))
    sides = [13, 7, 29, 6] if exporter == "dynamo" else [(13, 13), (7, 29), (31, 12), (6, 6)]
    for s in sides:
        h, w = (s, s) if isinstance(s, int) else s
        x = torch.randn(2, 3, h, w)
        got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-5)
    whole = torch.randn(2, 3, 5, 7)
    assert torch.equal(patches._dynamic_adaptive_avg_pool(torch.nn.functional.adaptive_avg_pool2d)(whole, 1),
                       torch.nn.functional.adaptive_avg_pool2d(whole, 1))


@pytest.mark.parametrize(("size", "patched"), [(1, False), ((1, 1), False), ((None, 4), False), (6, True),
                                                 ((2, 3), True)])
def test_only_a_pool_whose_windows_depend_on_the_input_size_is_patched(size, patched):
    """A global pool (ResNet's head) exports right at every size: no patch, no diagnostic for it."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(size))
    with patches.applied(_loaded(model), "torchscript") as diags:
        assert [d.code for d in diags] == (["export-patch"] if patched else [])


def test_the_model_is_as_found_before_and_after_each_export():
    """What the check runs cached is dropped before an export, and what the export cached (traced or fake
    tensors) never reaches a later run."""
    from onnxport.api import load_model
    from tests.conftest import MODELS

    lm = load_model(f"{MODELS}:CachedGrid")
    assert lm.model.shape is not None  # the example run's cache
    with patches.applied(lm, "dynamo"):
        assert lm.model.shape is None and not hasattr(lm.model, "grid")
        lm.model.shape, lm.model.grid = (1,), "a fake tensor"
    assert lm.model.shape is None and not hasattr(lm.model, "grid")
