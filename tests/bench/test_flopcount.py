"""FLOP counting on small hand-built ONNX graphs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxport.bench import flops


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _w(name, *shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_flops_matmul_chain_with_dynamic_batch():
    m = _model([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("MatMul", ["r", "w2"], ["y"])],
               [_vi("x", ["batch", 3, 4])], [_vi("y", ["batch", 3, 2])], [_w("w1", 4, 6), _w("w2", 6, 2)])
    count = flops(m, {"x": [2, 3, 4]})
    assert count.total == 2 * (2 * 3) * 6 * 4 + 2 * (2 * 3) * 2 * 6
    assert count.by_op == {"MatMul": count.total} and count.unknown == ()
    assert flops(m, {"x": [5, 3, 4]}).total == 2 * 15 * 6 * 4 + 2 * 15 * 2 * 6


def test_flops_gemm_transposed():
    m = _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1)],
               [_vi("a", ["m", 4])], [_vi("y", ["m", 5])], [_w("b", 5, 4), _w("c", 5)])
    assert flops(m, {"a": [3, 4]}).total == 2 * 3 * 5 * 4


def test_flops_conv_with_groups_and_stride():
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1], strides=[2, 2])],
               [_vi("x", ["n", 4, 8, 8])], [_vi("y", ["n", 6, "h", "w"])], [_w("w", 6, 2, 3, 3)])
    # out [2, 6, 4, 4]; 2 * Cout * Hout * Wout * Cin/groups * kh * kw * batch
    assert flops(m, {"x": [2, 4, 8, 8]}).total == 2 * 6 * 4 * 4 * 2 * 3 * 3 * 2


def test_flops_onnx_attention():
    q, k, v = _vi("q", [1, 2, 5, 4]), _vi("k", [1, 2, 7, 4]), _vi("v", [1, 2, 7, 3])
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"])], "g", [q, k, v],
                              [_vi("y", None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    # Q·Kᵀ: 2·B·H·S·L·D, then probs·V: 2·B·H·S·L·Dv
    assert flops(m, {}).total == 2 * 1 * 2 * 5 * 7 * 4 + 2 * 1 * 2 * 5 * 7 * 3


def test_flops_microsoft_attention():
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=2)
    graph = helper.make_graph([node], "g", [_vi("x", ["b", "s", 8])], [_vi("y", None)],
                              [_w("w", 8, 24), _w("b", 24)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    b, s = 2, 5
    assert flops(m, {"x": [b, s, 8]}).total == 2 * b * s * 8 * 24 + 2 * b * s * s * (8 + 8)
