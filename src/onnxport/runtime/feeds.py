"""The one place that turns PyTorch input tensors into an ONNX Runtime feed dictionary."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.core.spec import InputSpec

if TYPE_CHECKING:
    import torch


def input_mapping(specs: Sequence[InputSpec], onnx_inputs: Sequence[str]) -> dict[str, str]:
    """Spec name -> ONNX input name: by name when the names agree, else by position."""
    names = [s.name for s in specs]
    if set(onnx_inputs) <= set(names):  # an exporter may drop inputs the model does not use
        return {n: n for n in names if n in onnx_inputs}
    if len(onnx_inputs) == len(names):
        return dict(zip(names, onnx_inputs))
    raise UsageError(
        f"the ONNX model's inputs ({', '.join(onnx_inputs)}) do not match the model's ({', '.join(names)})",
        "name the --input entries after the ONNX inputs, in their order",
    )


@dataclass(frozen=True)
class FeedMap:
    """How the model's inputs (in spec order) feed one ONNX graph; call it with the tensors of one case."""

    specs: tuple[InputSpec, ...]
    mapping: dict[str, str]

    @classmethod
    def of(cls, specs: Sequence[InputSpec], session_or_names) -> FeedMap:
        """For an InferenceSession (or anything with ``get_inputs()``, or a list of ONNX input names)."""
        names = ([i.name for i in session_or_names.get_inputs()] if hasattr(session_or_names, "get_inputs")
                 else list(session_or_names))
        return cls(tuple(specs), input_mapping(specs, names))

    def __call__(self, tensors: Sequence[torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
        torch = sys.modules.get("torch")  # a torch tensor means torch is imported; an ONNX file alone needs none
        return {self.mapping[s.name]: (t.numpy() if torch is not None and isinstance(t, torch.Tensor) else np.asarray(t))
                for s, t in zip(self.specs, tensors) if s.name in self.mapping}
