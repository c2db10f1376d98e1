"""Variant gates that can fail (issue 51): a random-weight CNN predicts one class for every input, so its raw
cosine and top-1 pass any file that keeps the head's constant vector; the gates judge the outputs centred by
PyTorch's mean over the inputs. The variants here are the export with its weights rounded as bf16 and int8 round
them (what the variants' arithmetic does to the part of the logits that varies)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from onnxport.api import load_model
from onnxport.core.records import FP32
from onnxport.core.samples import validation_cases
from onnxport.exporters.chain import export
from onnxport.optimize import policy
from onnxport.optimize.passes import choose_best
from onnxport.prove.references import references

CNN = textwrap.dedent('''
    import torch
    from torch import nn


    class RandomCNN(nn.Module):
        """Random weights: its logits are the head's bias (one class first for every input) plus a small part."""

        def __init__(self, bias: float = 4.0, gain: float = 1.0):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.head = nn.Linear(32, 10)
            with torch.no_grad():
                self.head.weight.mul_(gain)
                self.head.bias.copy_(torch.linspace(-1.0, 1.0, 10) * bias)

        def forward(self, x):
            x = torch.relu(self.conv(x))
            return self.head(torch.relu(self.conv2(x)).mean((2, 3)))


    class TrainedLike(RandomCNN):
        """The same layers read at one pixel: logits that vary with the input, several classes predicted."""

        def __init__(self):
            super().__init__(bias=0.0, gain=3.0)

        def forward(self, x):
            return self.head(self.conv2(torch.relu(self.conv(x)))[:, :, 8, 8])
''')


def _bf16(a: np.ndarray) -> np.ndarray:
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def _int8(a: np.ndarray) -> np.ndarray:
    scale = np.abs(a).max() / 127
    return (np.round(a / scale) * scale).astype(np.float32)


def _rounded(model: Path, dst: Path, rounding) -> Path:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(model)
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.ndim > 1:
            init.CopyFrom(numpy_helper.from_array(rounding(a), init.name))
    onnx.save(m, dst)
    return dst


def _proofs(tmp: Path, cls: str) -> dict:
    src = tmp / "cnn.py"
    src.write_text(CNN)
    loaded = load_model(f"{src}:{cls}", inputs=["x:float32[batch,3,16,16]"])
    result = export(loaded, tmp / "model.onnx", exporter="torchscript")
    model = Path(getattr(result, "path", tmp / "model.onnx"))
    refs = references(loaded, validation_cases(loaded.dims))
    return {name: policy.prove(loaded, name, _rounded(model, tmp / f"{name}.onnx", rounding), refs, FP32)
            for name, rounding in (("openvino-bf16", _bf16), ("int8", _int8))}


@pytest.fixture(scope="module")
def random_cnn(tmp_path_factory):
    return _proofs(tmp_path_factory.mktemp("random_cnn"), "RandomCNN")


def test_random_weight_cnn_variants_that_move_the_centred_logits_are_rejected(random_cnn):
    for name, proof in random_cnn.items():
        by = {m.name: m for m in proof.metrics}
        assert by["cosine"].passed and by["top1_agreement"].value == 1.0, name  # the raw gates pass: they cannot tell
        assert proof.varying["cannot_tell"]["top-1 (raw)"].startswith("PyTorch predicts one class"), name
        assert not proof.passed and "(centred)" in proof.reason, (name, proof.reason)
        assert not by["cosine (centred)"].passed, name
    int8 = random_cnn["int8"]
    assert int8.varying["top1_centred"] < 1.0  # it flips the centred prediction of some inputs


def test_a_variant_rejected_by_the_centred_gate_is_not_chosen(random_cnn):
    from onnxport.optimize import Variant

    entries = [Variant("export", "model.onnx", True, speedup=1.0)]
    entries += [Variant(n, f"{n}.onnx", p.passed, reason=p.reason, speedup=3.0) for n, p in random_cnn.items()]
    assert choose_best(entries, lambda e: e.speedup).name == "export"


def test_trained_like_cnn_keeps_its_passing_variants(tmp_path):
    for name, proof in _proofs(tmp_path, "TrainedLike").items():
        assert proof.passed, (name, proof.reason)
        names = {m.name for m in proof.metrics}
        assert {"cosine", "top1_agreement", "cosine (centred)", "top1_agreement (centred)"} <= names
        assert proof.varying["reference_classes"] > 1 and not proof.varying["cannot_tell"]
