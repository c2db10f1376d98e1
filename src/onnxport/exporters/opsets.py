"""Which opsets the installed exporters and onnxruntime support."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TypeVar

import onnx

from onnxport.runtime.placement import CPU_PROVIDER, Placement
from onnxport.runtime.sessions import session

MIN_OPSET = 17


@functools.lru_cache(maxsize=1)
def onnxruntime_max_opset() -> int:
    """The newest default-domain opset the installed onnxruntime accepts (probed once)."""
    from onnx import helper

    for version in range(onnx.defs.onnx_opset_version(), MIN_OPSET - 1, -1):
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        ir = min(onnx.IR_VERSION, 10)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=ir)
        try:
            session(model)
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


# --------------------------------------------------------------------------- choosing a lower opset


T = TypeVar("T")


def lower_opsets(versions: Iterable[int], build: Callable[[int], T | None], why_not: Callable[[int, T], str | None]
                 ) -> tuple[tuple[int, T] | None, list[tuple[int, T, str]]]:
    """Try ``versions`` in order (newest first): ``build(version)`` makes the export (None: it failed, stop),
    ``why_not(version, made)`` says why it is not good enough (None: keep it).

    Returns ((version, what build made) of the first good one, or None) and the rejected tries with their
    reasons. Both opset fallbacks of the export use it: onnxruntime cannot run the export, and on a GPU the
    export's placement leaves compute nodes on the CPU."""
    rejected: list[tuple[int, T, str]] = []
    for version in versions:
        made = build(version)
        if made is None:
            break
        reason = why_not(version, made)
        if reason is None:
            return (version, made), rejected
        rejected.append((version, made, reason))
    return None, rejected


def op_version(op_type: str, opset: int) -> int | None:
    """The version of default-domain operator ``op_type`` in ``opset`` (MaxPool at opset 23 -> 22); None for
    an operator of another domain (ONNX Runtime's fused and layout ops)."""
    try:
        return int(onnx.defs.get_schema(op_type, opset, "").since_version)
    except Exception:  # noqa: BLE001 - onnx raises SchemaError for unknown ops
        return None


def candidate_opsets(opset: int, op_types: Iterable[str], floor: int = MIN_OPSET) -> list[int]:
    """The opsets below ``opset`` (newest first) worth an export because one of ``op_types`` has another
    version there: MaxPool on the CPU at opset 23 (MaxPool-22) -> [21] (MaxPool-12, unchanged down to 17)."""
    ops = [op for op in dict.fromkeys(op_types) if op_version(op, opset) is not None]
    out: list[int] = []
    last = tuple(op_version(op, opset) for op in ops)
    for version in range(opset - 1, floor - 1, -1):
        now = tuple(op_version(op, version) for op in ops)
        if now != last:
            out.append(version)
            last = now
    return out


def placement_problem(placed: Placement | None, opset: int) -> str | None:
    """Why an export at ``opset`` is not good enough for the GPU it will run on (None when it is): compute
    nodes that onnxruntime left on the CPU, with the operator versions it has no GPU kernel for."""
    if placed is None or not placed.cpu_compute_nodes:
        return None
    nodes = placed.cpu_compute_nodes
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    verb = "runs" if len(nodes) == 1 else "run"
    versions = [f"{op}-{v}" for op in placed.compute_op_types if (v := op_version(op, opset)) is not None]
    gpu = "CUDA" if "CUDAExecutionProvider" in placed.providers_used else "GPU"
    why = f": this onnxruntime has no {gpu} kernel for {', '.join(versions)}" if versions else ""
    if not any(p != CPU_PROVIDER for p in placed.providers_used):
        why = ": the session uses no GPU provider"
    return f"opset {opset}: {shown} {verb} on the CPU{why}"
