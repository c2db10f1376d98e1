"""onnxruntime's fused attention for an exported decoder: each layer's ONNX ``Attention`` with the rotary
embeddings of its queries and keys and the concatenation of its cache rewritten as one ``GroupQueryAttention``
(com.microsoft, rotary fused: ``do_rotary``), as onnxruntime-genai's model builder writes Llama-like decoders.

The file keeps its inputs and outputs (``past_key_values.*`` in, ``present.*`` out): GroupQueryAttention takes the
past and returns the present, and reads the lengths from the attention mask (``seqlens_k`` = its row sums - 1,
``total_sequence_length`` = its width). It computes positions from those lengths, so rows must be unpadded (the
prompts the variant judge and ``serve`` feed); it is always causal. Its past and present may be one buffer at the
maximum length (``past_present_share_buffer``: :class:`onnxport.runtime.binding.CarriedSteps` with ``shared``).
A layer whose pattern differs (queries normalised per head, partial rotary, no rotary at all: GPT-2) is not
rewritten: the variant is not built, naming why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxport.decoder.records import CacheLayout
from onnxport.optimize.context import Skip

MS = "com.microsoft"


@dataclass(frozen=True)
class Rotary:
    """The model's rotary tables at every position up to the maximum length: cos and sin [positions, dim / 2]."""

    cos: np.ndarray
    sin: np.ndarray


def rotary_tables(model, max_length: int) -> Rotary | None:
    """The rotary cos/sin tables of a transformers decoder (its ``rotary_emb`` module, scaling included), None
    for a model without one."""
    import torch

    rotary = next((m for name, m in model.named_modules() if name.endswith("rotary_emb")), None)
    if rotary is None:
        return None
    with torch.inference_mode():
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(max_length)[None])
    half = cos.shape[-1] // 2
    return Rotary(cos[0, :, :half].float().numpy().copy(), sin[0, :, :half].float().numpy().copy())


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in model.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inputs = {i.name for i in model.graph.input}

    def back(self, name: str, *ops: str):
        """The chain of producers of ``name`` with op types ``ops`` in order (nearest first), else None."""
        chain = []
        for op in ops:
            node = self.producer.get(name)
            if node is None or node.op_type != op:
                return None
            chain.append(node)
            name = node.input[0]
        return chain

    def only_consumer(self, name: str, op: str):
        found = self.consumers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op else None

    def concat_of(self, name: str, past: str):
        """The Concat node on ``name``'s producers (through reshapes and expands) whose first input is ``past``."""
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            node = self.producer.get(current)
            if node is None or current in seen:
                continue
            seen.add(current)
            if node.op_type == "Concat" and node.input[0] == past:
                return node
            todo.extend(i for i in node.input if i)
        return None


def _projection(g: _Graph, rotated: str) -> str | None:
    """The 3-D projection [batch, seq, heads * dim] a rotary embedding's input was reshaped and transposed from."""
    found = g.back(rotated, "RotaryEmbedding", "Transpose", "Reshape")
    if found is None or any(a.name == "rotary_embedding_dim" and a.i for a in found[0].attribute):
        return None
    return found[2].input[0]


def _layer(g: _Graph, attn, layer: int, layout: CacheLayout, lengths: tuple[str, str], tables: tuple[str, str]):
    """The GroupQueryAttention node replacing ``attn`` and the nodes it makes dead; None where the pattern differs."""
    past_k, past_v = (f"past_key_values.{layer}.{kind}" for kind in ("key", "value"))
    cat_k, cat_v = g.concat_of(attn.input[1], past_k), g.concat_of(attn.input[2], past_v)
    out_t = g.only_consumer(attn.output[0], "Transpose")
    out_r = out_t and g.only_consumer(out_t.output[0], "Reshape")
    if cat_k is None or cat_v is None or out_r is None:
        return None
    query, key = _projection(g, attn.input[0]), _projection(g, cat_k.input[1])
    v_chain = g.back(cat_v.input[1], "Transpose", "Reshape")
    if query is None or key is None or v_chain is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in attn.attribute}
    node = helper.make_node(
        "GroupQueryAttention", [query, key, v_chain[1].input[0], past_k, past_v, *lengths, *tables],
        [out_r.output[0], cat_k.output[0], cat_v.output[0]], name=f"GroupQueryAttention_{layer}", domain=MS,
        num_heads=layout.heads, kv_num_heads=layout.kv_heads, do_rotary=1, rotary_interleaved=0,
        scale=float(attrs.get("scale", 1.0 / np.sqrt(layout.head_dim))), softcap=float(attrs.get("softcap", 0.0)))
    return node, {id(attn), id(cat_k), id(cat_v), id(out_t), id(out_r)}


def _lengths(mask: str) -> list:
    """seqlens_k (int32 [batch]: each row's tokens - 1) and total_sequence_length (int32 scalar) of the mask."""
    one = numpy_helper.from_array(np.array(1, np.int64), "gqa_one")
    return [helper.make_node("Constant", [], ["gqa_axis"], value=numpy_helper.from_array(np.array([1], np.int64))),
            helper.make_node("Constant", [], ["gqa_one"], value=one),
            helper.make_node("ReduceSum", [mask, "gqa_axis"], ["gqa_tokens"], keepdims=0),
            helper.make_node("Sub", ["gqa_tokens", "gqa_one"], ["gqa_seqlens64"]),
            helper.make_node("Cast", ["gqa_seqlens64"], ["gqa_seqlens_k"], to=TensorProto.INT32),
            helper.make_node("Shape", [mask], ["gqa_mask_shape"]),
            helper.make_node("Gather", ["gqa_mask_shape", "gqa_one"], ["gqa_total64"], axis=0),
            helper.make_node("Cast", ["gqa_total64"], ["gqa_total"], to=TensorProto.INT32)]


def _dead_code(graph) -> None:
    """Drop every node and initializer no graph output depends on."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def to_group_query(model: onnx.ModelProto, layout: CacheLayout, rotary: Rotary | None) -> Sequence[str]:
    """Rewrite ``model`` in place: every layer's attention as one GroupQueryAttention with rotary fused; notes of
    what was done. A model without rotary tables or a layer that does not match is :class:`Skip`."""
    if rotary is None:
        raise Skip("no rotary embedding: GroupQueryAttention's fused rotary does not apply")
    if layout.head_dim % 16 or (layout.value_dim or layout.head_dim) != layout.head_dim:
        raise Skip(f"GroupQueryAttention takes keys and values of one head size, a multiple of 16; this model's "
                   f"is {layout.head_dim}" + (f" and {layout.value_dim}" if layout.value_dim else ""))
    if layout.sliding_window is not None and layout.sliding_window < layout.max_length:
        raise Skip("a sliding window shorter than --max-length: GroupQueryAttention is not given it")
    g = _Graph(model)
    attns = [n for n in model.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
    if len(attns) != layout.layers:
        raise Skip(f"{len(attns)} ONNX Attention nodes for {layout.layers} layers: the pattern is not the exporter's")
    tables = ("gqa_cos_cache", "gqa_sin_cache")
    made, dead = [], set()
    for layer, attn in enumerate(attns):
        found = _layer(g, attn, layer, layout, ("gqa_seqlens_k", "gqa_total"), tables)
        if found is None:
            raise Skip(f"layer {layer}'s attention is not rotary queries and keys over the cache's concatenation "
                       "(per-head norms, partial rotary or another layout): GroupQueryAttention not applied")
        made.append(found[0])
        dead |= found[1]
    nodes = [n for n in model.graph.node if id(n) not in dead]
    del model.graph.node[:]
    model.graph.node.extend(_lengths("attention_mask") + nodes + made)
    for name, table in zip(tables, (rotary.cos, rotary.sin)):
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(table, np.float32), name))
    _dead_code(model.graph)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    _sort(model.graph)
    return (f"GroupQueryAttention with rotary fused: {len(made)} layers ({layout.heads} heads, {layout.kv_heads} kv "
            "heads); rows must be unpadded",)


def _sort(graph) -> None:
    """Nodes in topological order (the new ones were appended)."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        progressed = [n for n in pending if all(i in ready for i in n.input)]
        if not progressed:
            raise Skip("the rewritten graph has a cycle")
        for n in progressed:
            ready.update(n.output)
        ordered += progressed
        pending = [n for n in pending if all(id(n) != id(p) for p in progressed)]
    del graph.node[:]
    graph.node.extend(ordered)
