"""Models of the third-party libraries users export most, built from their own configs with random weights
(nothing downloaded) and handed to onnxport as Python factories: ``onnxport export
benchmarks/_thirdparty_models.py:yolo11n`` with no ``--input`` (the image is guessed from the first
convolution). ``benchmarks/catalogue.py --library thirdparty`` sweeps every factory of ``MODELS``.

Each library is imported inside its factories, so the list reads without them installed:
``pip install ultralytics segmentation-models-pytorch``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def _yolo(config: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import os

        os.environ.setdefault("YOLO_OFFLINE", "1")  # no update or font checks over the network
        import ultralytics

        kind = ultralytics.RTDETR if config.startswith("rtdetr") else ultralytics.YOLO
        return kind(config).model  # the nn.Module, built from the yaml (random weights)

    build.__doc__ = f"ultralytics {config} (random weights)"
    return build


def _smp(arch: str, encoder: str = "resnet18") -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import segmentation_models_pytorch as smp

        return getattr(smp, arch)(encoder_name=encoder, encoder_weights=None, classes=3)

    build.__doc__ = f"segmentation_models_pytorch {arch} on {encoder} (random weights)"
    return build


MODELS: dict[str, Callable[[], nn.Module]] = {
    # ultralytics: detection, segmentation, pose, oriented boxes, classification; YOLO11, YOLO26, YOLOv8, RT-DETR
    "yolo11n": _yolo("yolo11n.yaml"),
    "yolo11n_seg": _yolo("yolo11n-seg.yaml"),
    "yolo11n_pose": _yolo("yolo11n-pose.yaml"),
    "yolo11n_obb": _yolo("yolo11n-obb.yaml"),
    "yolo11n_cls": _yolo("yolo11n-cls.yaml"),
    "yolo26n": _yolo("yolo26n.yaml"),
    "yolo26n_seg": _yolo("yolo26n-seg.yaml"),
    "yolov8n": _yolo("yolov8n.yaml"),
    "rtdetr_l": _yolo("rtdetr-l.yaml"),
    # segmentation_models_pytorch: every architecture, a small encoder
    "smp_unet": _smp("Unet"),
    "smp_unetplusplus": _smp("UnetPlusPlus"),
    "smp_fpn": _smp("FPN"),
    "smp_pspnet": _smp("PSPNet"),
    "smp_linknet": _smp("Linknet"),
    "smp_manet": _smp("MAnet"),
    "smp_pan": _smp("PAN"),
    "smp_deeplabv3": _smp("DeepLabV3"),
    "smp_deeplabv3plus": _smp("DeepLabV3Plus"),
    "smp_upernet": _smp("UPerNet"),
    "smp_segformer": _smp("Segformer", "mit_b0"),
    "smp_unet_effnet": _smp("Unet", "efficientnet-b0"),
}
globals().update(MODELS)  # each factory importable by name: _thirdparty_models.py:yolo11n
