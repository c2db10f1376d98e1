"""Custom operators, exported by both exporters and proven against PyTorch through ONNX Runtime.

``MyGELU`` maps to ONNX's built-in ``Gelu`` (opset 20+). ``MyCustomOp`` has no ONNX equivalent: its
``symbolic`` emits ``custom_domain::MyCustomOp`` with a float attribute, and ``my_custom_op`` below is its
ONNX Runtime implementation (numpy, run through onnxruntime-extensions). Nothing else to register: onnxport
finds the Functions the model calls and builds the dynamo exporter's translation from each ``symbolic``.

    onnxport convert examples/custom_ops.py:GeluNet -i 'x:float32[batch,16]' -d batch=1..32 --exporter dynamo
    onnxport convert examples/custom_ops.py:CustomNet -i 'x:float32[batch,16]' -d batch=1..32 --exporter torchscript
    onnxport convert examples/custom_ops.py:CustomNet -i 'x:float32[batch,16]' -d batch=1..32 --exporter dynamo

Serve or deploy the custom-domain model with the same implementation loaded: the Python one is registered
when this file is imported; a compiled one is passed with ``--custom-op-library libmyops.so``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from onnxport.runtime.ops import ort_python_op


class MyGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.erf(x / 1.41421356))

    @staticmethod
    def symbolic(g, x):
        return g.op("Gelu", x)  # ONNX's built-in Gelu (opset 20+)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1.0 + torch.erf(x / 1.41421356))
        pdf = torch.exp(-0.5 * x**2) / 2.5066282
        return grad * (cdf + x * pdf)


class MyCustomOp(torch.autograd.Function):
    """A leaky ramp with a learnable-free slope ``alpha``: no ONNX op computes exactly this."""

    @staticmethod
    def forward(ctx, x, alpha):
        return torch.where(x > 0, x, alpha * x * torch.sigmoid(x))

    @staticmethod
    def symbolic(g, x, alpha):
        return g.op("custom_domain::MyCustomOp", x, alpha_f=alpha)


@ort_python_op("custom_domain::MyCustomOp", attrs={"alpha": float})
def my_custom_op(x: np.ndarray, alpha: float) -> np.ndarray:
    """ONNX Runtime's implementation of ``custom_domain::MyCustomOp``."""
    return np.where(x > 0, x, alpha * x / (1.0 + np.exp(-x))).astype(np.float32)


class GeluNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(MyGELU.apply(self.fc1(x)))


class CustomNet(nn.Module):
    def __init__(self, width: int = 16, alpha: float = 0.2) -> None:
        super().__init__()
        self.alpha = alpha
        self.fc1 = nn.Linear(width, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(MyCustomOp.apply(MyGELU.apply(self.fc1(x)), self.alpha))
