"""FLOPs of one inference of an ONNX graph at fixed input shapes: the work the roofline sets against the peak.

Counts MatMul/Gemm, Conv/ConvTranspose, ONNX and com.microsoft Attention, MultiHeadAttention and contracting
Einsums; shapes come from ONNX shape inference, else ONNX Runtime's symbolic shape inference, else one run.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxport.runtime.sessions import session


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one inference: total, per op type, and the counted nodes whose shapes stayed unknown."""

    total: int
    by_op: dict[str, int]
    unknown: tuple[str, ...] = ()


_MATMUL = {"MatMul", "MatMulInteger", "FusedMatMul", "QLinearMatMul", "DynamicQuantizeMatMul",
           "MatMulIntegerToFloat"}
_CONV = {"Conv", "ConvInteger", "FusedConv", "QLinearConv", "NhwcConv"}
_COUNTED = _MATMUL | _CONV | {"Gemm", "FusedGemm", "ConvTranspose", "Attention", "MultiHeadAttention", "Einsum"}


def _load(model: Any):
    import onnx

    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    return onnx.load(str(model), load_external_data=False)


def _static(model, shapes: dict[str, Sequence[int]]):
    """A copy of ``model`` with its inputs fixed to ``shapes`` and stale value_info removed."""
    from onnx import TensorShapeProto

    for inp in model.graph.input:
        if inp.name in shapes and inp.type.HasField("tensor_type"):
            dims = inp.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[inp.name]:
                dims.dim.append(TensorShapeProto.Dimension(dim_value=int(d)))
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    return model


def _shape_table(model) -> dict[str, list[int | None]]:
    table: dict[str, list[int | None]] = {}
    for init in model.graph.initializer:
        table[init.name] = list(init.dims)
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            table[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return table


def _attr(node, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _prod(xs: Sequence[int]) -> int:
    return int(math.prod(xs))


def _node_flops(node, table: dict[str, list[int | None]]) -> int | None:
    """FLOPs of one node (multiply-add = 2), or None when a needed shape is unknown."""

    def shape(i: int) -> list[int] | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        s = table.get(node.input[i])
        return None if s is None or any(d is None for d in s) else s  # type: ignore[return-value]

    out = table.get(node.output[0]) if node.output else None
    out = None if out is None or any(d is None for d in out) else out
    op = node.op_type
    if op in _MATMUL or op in ("Gemm", "FusedGemm"):
        a = shape(0)
        if a is None or out is None:
            return None
        if op in ("Gemm", "FusedGemm"):
            k = a[0] if _attr(node, "transA", 0) else a[1]
        elif len(a) == 1:
            k = a[0]
        else:
            k = a[-2] if _attr(node, "transA", 0) else a[-1]
        return 2 * _prod(out) * k
    if op in _CONV:
        w = shape(3 if op == "QLinearConv" else 1)
        if w is None or out is None:
            return None
        return 2 * _prod(out) * _prod(w[1:])  # W: [Cout, Cin/groups, *kernel]
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        return None if x is None or w is None else 2 * _prod(x) * _prod(w[1:])  # W: [Cin, Cout/groups, *k]
    if op == "Attention" and node.domain in ("", "ai.onnx"):
        return _onnx_attention(node, shape(0), shape(1), shape(2))
    if op == "Attention":  # com.microsoft: packed input projection, then attention
        x, w = shape(0), shape(1)
        if x is None or w is None or len(x) != 3:
            return None
        b, s, _ = x
        sizes = _attr(node, "qkv_hidden_sizes") or [w[1] // 3] * 3
        return 2 * b * s * w[0] * w[1] + 2 * b * s * s * (sizes[0] + sizes[2])
    if op == "MultiHeadAttention":
        q, k, v = shape(0), shape(1), shape(2)
        if q is None or k is None or v is None or len(q) != 3 or len(k) != 3 or len(v) != 3:
            return None
        return 2 * q[0] * q[1] * k[1] * (q[2] + v[2])
    if op == "Einsum":
        return _einsum(str(_attr(node, "equation", b"")), [shape(i) for i in range(len(node.input))])
    return 0


def _onnx_attention(node, q: list[int] | None, k: list[int] | None, v: list[int] | None) -> int | None:
    """ONNX Attention (opset 23): Q·Kᵀ and softmax·V, with 3-D [B,S,hidden] or 4-D [B,heads,S,head] inputs."""
    if q is None or k is None or v is None:
        return None
    if len(q) == 4:
        b, heads, s, d = q
        length, dv = k[2], v[3]
        return 2 * b * heads * s * length * (d + dv)
    if len(q) == 3:
        b, s, hidden_q = q
        q_heads = _attr(node, "q_num_heads") or 1
        kv_heads = _attr(node, "kv_num_heads") or q_heads
        length = k[1]
        hidden_v = v[-1] // kv_heads * q_heads
        return 2 * b * s * length * (hidden_q + hidden_v)
    return None


def _einsum(eq: str, shapes: list[list[int] | None]) -> int | None:
    if "->" not in eq or "." in eq or any(s is None for s in shapes):
        return None
    lhs, rhs = eq.replace(" ", "").split("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for term, s in zip(terms, shapes):
        if s is None or len(term) != len(s):
            return None
        sizes.update(zip(term, s))
    contracted = set(sizes) - set(rhs)
    if not contracted or len(terms) < 2:
        return 0  # a transpose, reduction or elementwise product: not GEMM work
    return 2 * _prod(list(sizes.values()))


def _run_shapes(source: Any, model, shapes: dict[str, Sequence[int]]) -> dict[str, list[int | None]]:
    """Exact shapes of the counted nodes' tensors, by running ``source`` once in ONNX Runtime on zeros."""
    import onnx

    table = _shape_table(model)
    full = _load(source) if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
    known = {o.name for o in full.graph.output}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*model.graph.value_info, *model.graph.output]}
    wanted = [t for n in model.graph.node if n.op_type in _COUNTED for t in [*n.input, *n.output[:1]]
              if t and t in types and t not in known and any(d is None for d in table.get(t, [None]))]
    for name in dict.fromkeys(wanted):
        full.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    feeds = {}
    for inp in full.graph.input:
        if inp.name in {i.name for i in full.graph.initializer}:
            continue
        dims = shapes.get(inp.name) or [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = np.zeros(dims, onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type))
    sess = session(full, opt_level="disable")
    names = [o.name for o in sess.get_outputs()]
    for name, value in zip(names, sess.run(None, feeds)):
        table[name] = list(np.shape(value))
    return table


def _count(model, table: dict[str, list[int | None]] | None = None) -> FlopCount:
    table = table if table is not None else _shape_table(model)
    by_op: dict[str, int] = {}
    unknown: list[str] = []
    for node in model.graph.node:
        if node.op_type not in _COUNTED:
            continue
        f = _node_flops(node, table)
        if f is None:
            unknown.append(node.name or node.op_type)
            continue
        if f:
            by_op[node.op_type] = by_op.get(node.op_type, 0) + f
    return FlopCount(sum(by_op.values()), by_op, tuple(unknown))


def _symbolic_count(model) -> FlopCount | None:
    """The count on ONNX Runtime's symbolic shape inference of ``model``, or None when it fails."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception:  # noqa: BLE001 - optional second opinion
        return None
    cwd = os.getcwd()
    try:
        with tempfile.TemporaryDirectory(prefix="onnxport-symshape-") as tmp:
            os.chdir(tmp)  # when it gives up (e.g. on a custom op) it saves a model into the working dir
            try:
                return _count(SymbolicShapeInference.infer_shapes(model, auto_merge=True))
            finally:
                os.chdir(cwd)
    except Exception:  # noqa: BLE001 - optional second opinion
        return None


def flops(model: Any, shapes: dict[str, Sequence[int]]) -> FlopCount:
    """FLOPs of one inference of ``model`` (path or ModelProto) with its inputs at ``shapes``.

    Counts MatMul/Gemm (2·M·N·K), Conv (2·Cout·Hout·Wout·Cin/groups·kh·kw·batch), ConvTranspose,
    ONNX and com.microsoft Attention/MultiHeadAttention and contracting Einsums, from ONNX shape
    inference (with data propagation) after fixing the inputs; nodes inside subgraphs are not counted.
    When ONNX shape inference leaves counted nodes unknown, ONNX Runtime's symbolic shape inference is
    tried, and if shapes are still missing the graph is run once on zeros to read them.
    """
    import onnx

    base = _static(_load(model), shapes)
    try:
        inferred = onnx.shape_inference.infer_shapes(base, data_prop=True)
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer may still be countable below
        inferred = base
    best = _count(inferred)
    if best.unknown:
        other = _symbolic_count(base)
        if other is not None and len(other.unknown) < len(best.unknown):
            best = other
    if best.unknown:
        with contextlib.suppress(Exception):  # e.g. a model over 2 GB, or one ONNX Runtime cannot run
            best = _count(inferred, _run_shapes(model, inferred, shapes))
    return best
