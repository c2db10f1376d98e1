"""Which opsets the installed exporters and onnxruntime support."""

from __future__ import annotations

import functools

import onnx

MIN_OPSET = 17


@functools.lru_cache(maxsize=1)
def onnxruntime_max_opset() -> int:
    """The newest default-domain opset the installed onnxruntime accepts (probed once)."""
    import onnxruntime as ort
    from onnx import helper

    for version in range(onnx.defs.onnx_opset_version(), MIN_OPSET - 1, -1):
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        ir = min(onnx.IR_VERSION, 10)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=ir)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception:  # noqa: BLE001 - a refusal means this opset is too new
            continue
    return MIN_OPSET


def exporter_max_opset(exporter: str) -> int:
    """The newest opset an exporter of the installed torch can write."""
    from torch.onnx import _constants

    if exporter == "torchscript":
        return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 17))
    return int(getattr(_constants, "ONNX_MAX_OPSET", 18))


def default_opset(exporter: str) -> int:
    """The newest opset both ``exporter`` and onnxruntime support, at least 17."""
    return max(MIN_OPSET, min(exporter_max_opset(exporter), onnxruntime_max_opset()))
