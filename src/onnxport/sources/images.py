"""A folder of images as samples: decoded with Pillow, preprocessed the way the source's weights expect.

* ``torchvision:NAME``: the eval transform of the model's weights (``weights.DEFAULT.transforms()``: resize,
  center crop, ImageNet normalization) — the models are built with ``weights=None``, so this is the transform
  the weights would bring; models without weights get the standard ImageNet eval transform at their size;
* ``timm:NAME``: ``timm.data.resolve_data_config`` + ``create_transform`` (eval);
* ``hf:DIR``: the folder's Hugging Face image processor;
* anything else, or to override: ``--preprocess file.py:function``, ``function(PIL.Image) -> array or tensor``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import BadSamples, UsageError, missing_dependency, one_line
from onnxport.core.spec import InputSpec
from onnxport.sources.base import LoadedModel

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Transform = Callable[[Any], Any]


def image_files(folder: Path) -> list[Path]:
    """The files in ``folder`` whose suffix Pillow reads as an image, by name (hidden files left out)."""
    from PIL import Image

    known = {s.lower() for s in Image.registered_extensions()}
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in known)


def image_input(folder: Path, loaded: LoadedModel) -> InputSpec:
    """The model's one image input ([batch,] channels, height, width, float)."""
    specs = loaded.inputs
    if len(specs) != 1 or not specs[0].dtype.startswith(("float", "bfloat")) or len(specs[0].shape) not in (3, 4):
        raise BadSamples(folder, "a folder of images feeds a model with one float image input [batch, C, H, W]; "
                                 "this one takes " + ", ".join(str(s) for s in specs), "give the inputs as a .npz")
    return specs[0]


def read_images(folder: Path, loaded: LoadedModel, preprocess: str | None, batched: bool):
    """(rows, where, detail): every image of ``folder`` decoded and preprocessed into the input's layout."""
    spec = image_input(folder, loaded)
    files = image_files(folder)
    if not files:
        raise BadSamples(folder, "holds no image files", "put .png/.jpg/... files in the folder")
    transform, detail = (_user_transform(preprocess) if preprocess else source_transform(folder, loaded))
    dims = spec.shape[1:] if batched else spec.shape
    mode = "L" if dims[0] == 1 else "RGB"
    rows = []
    for f in files:
        img = decode(folder, f, mode)
        try:
            out = transform(img)
        except Exception as e:  # noqa: BLE001 - the transform (the user's own, often) fails on this image
            who = f"--preprocess {preprocess}" if preprocess else "the preprocessing"
            raise BadSamples(folder, f"{f.name}: {who} raises {one_line(e, 160, typed=True)}",
                             "check the image and the preprocessing function") from None
        rows.append((_as_array(folder, f, out, spec, len(dims)),))
    return rows, tuple(f.name for f in files), detail


def decode(folder: Path, f: Path, mode: str):
    """The image in ``f`` decoded by Pillow into ``mode`` (RGB or L)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(f) as img:
            img.load()
            return img.convert(mode)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadSamples(folder, f"{f.name}: Pillow cannot decode it ({one_line(e, 160)})",
                         "remove the file or replace it with a valid image") from None


def _as_array(folder: Path, f: Path, out: Any, spec: InputSpec, rank: int) -> np.ndarray:
    arr = out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)
    if arr.ndim == rank + 1 and arr.shape[0] == 1:
        arr = arr[0]  # the function gave a batch of one
    if arr.dtype.kind not in "fiu":
        raise BadSamples(folder, f"{f.name}: the preprocessing gave a {arr.dtype} array, not numbers",
                         "return a float array or tensor [C, H, W]")
    return arr.astype(np.float32 if spec.dtype == "bfloat16" else spec.dtype, copy=False)


# --------------------------------------------------------------------------- transforms


def _user_transform(preprocess: str) -> tuple[Transform, dict]:
    from onnxport.sources.python import import_file

    file, name = preprocess.rsplit(":", 1)
    module = import_file(file, what="--preprocess file")
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"--preprocess {preprocess}: '{name}' is not a function in {file}",
                         "name a function taking a PIL.Image and returning an array or tensor [C, H, W]")
    return fn, {"transform": f"--preprocess {preprocess}"}


def source_transform(folder: Path, loaded: LoadedModel) -> tuple[Transform, dict]:
    """The preprocessing the source's weights expect (see the module docstring)."""
    if loaded.kind == "torchvision":
        return _torchvision(loaded)
    if loaded.kind == "timm":
        import timm.data

        cfg = timm.data.resolve_data_config({}, model=loaded.model)
        return timm.data.create_transform(**cfg, is_training=False), {
            "transform": "timm resolve_data_config + create_transform (eval)",
            "input_size": list(cfg["input_size"]), "crop_pct": cfg.get("crop_pct")}
    if loaded.kind == "hf":
        return _hf_processor(folder, loaded)
    raise BadSamples(folder, f"onnxport does not know how {loaded.source} preprocesses images",
                     "pass --preprocess file.py:function (function(PIL.Image) -> array or tensor [C, H, W])")


def _torchvision(loaded: LoadedModel) -> tuple[Transform, dict]:
    import torchvision
    from torchvision import transforms

    try:
        preset = torchvision.models.get_model_weights(loaded.name).DEFAULT.transforms()
    except (ValueError, AttributeError, KeyError):  # a builder without published weights
        preset = None
    if preset is not None:
        return preset, {"transform": f"{loaded.name} weights' eval transform (torchvision)",
                        "resize": list(preset.resize_size), "crop": list(preset.crop_size)}
    size = getattr(loaded.model, "image_size", 224)
    crop = size if isinstance(size, int) else 224
    tf = transforms.Compose([transforms.Resize(crop * 256 // 224), transforms.CenterCrop(crop), transforms.ToTensor(),
                             transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    return tf, {"transform": "ImageNet eval transform", "resize": [crop * 256 // 224], "crop": [crop]}


def _hf_processor(folder: Path, loaded: LoadedModel) -> tuple[Transform, dict]:
    try:
        import transformers
    except ImportError:
        raise missing_dependency("transformers", "hf") from None
    where = loaded.source.split(":", 1)[1]
    try:
        proc = transformers.AutoImageProcessor.from_pretrained(where, local_files_only=True)
    except Exception:  # noqa: BLE001 - no processor saved with the model
        raise BadSamples(folder, f"{where} holds no Hugging Face image processor",
                         "save one beside the model (preprocessor_config.json), or pass --preprocess file.py:function") from None

    def run(img):
        return proc(images=img, return_tensors="np")["pixel_values"][0]

    return run, {"transform": f"{type(proc).__name__} from {where}"}
