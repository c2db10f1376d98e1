"""The decoder's GPU variants, built and proven on the CPU provider where it runs them: GroupQueryAttention with
rotary fused (``gqa``), float16 with a float16 cache (``fp16``), both re-proven by the step cases and greedy
tokens; the past/present buffer shared at the maximum length; the one-token steps on fixed shapes and addresses
that a CUDA graph replays (run for real on the CPU); the ``cuda-graph`` variant's build and session options."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import transformers

from onnxport.core.errors import UsageError
from onnxport.core.greedy import PLAIN
from onnxport.decoder import optimize_decoder
from onnxport.decoder.attention import rotary_tables, to_group_query
from onnxport.decoder.device_variants import build_cuda_graph
from onnxport.decoder.generation import carried_steps, generate_greedy, shares_buffer, stacked, stream_bound
from onnxport.decoder.variants import DecoderBuild, variant_names
from onnxport.optimize.context import Skip
from onnxport.runtime.binding import CPU_TARGET, Target
from onnxport.runtime.sessions import CPU, CUDA, session
from tests.decoder.conftest import MAX_LENGTH

CUDA_TARGET = Target("cuda", 0, ((CUDA, {"device_id": 0}), CPU))  # simulated: built, never run here


@pytest.fixture(scope="module")
def llama(exported_llama):
    return exported_llama


@pytest.fixture(scope="module")
def built(llama):
    model, layout, path, folder = llama
    return optimize_decoder(model, layout, path, folder / "out", names="gqa,fp16,cuda-graph")


def test_gqa_and_fp16_variants_are_built_and_proven_on_the_cpu(built):
    assert [v.name for v in built.variants] == ["export", "gqa", "fp16", "cuda-graph"]
    assert built.device == "cpu"
    gqa, fp16, graph = (built.get(n) for n in ("gqa", "fp16", "cuda-graph"))
    assert gqa.passed and gqa.strict and gqa.max_abs_err < 1e-4, gqa.to_dict()
    assert dict(gqa.fused_ops)["com.microsoft:GroupQueryAttention"] == 2 and "Attention" not in dict(gqa.fused_ops)
    assert gqa.greedy_steps == gqa.greedy_tokens and any("rotary fused" in n for n in gqa.notes)
    assert any("left out" in n for n in gqa.notes)  # the batched multi-token cases GQA cannot run, named
    assert fp16.passed and fp16.cosine > 0.999 and fp16.top1 >= 0.95, fp16.to_dict()
    assert "com.microsoft:GroupQueryAttention" in dict(fp16.fused_ops)
    fp16_model = onnx.load(str(fp16.path))
    types = {i.name: i.type.tensor_type.elem_type for i in [*fp16_model.graph.input, *fp16_model.graph.output]}
    assert types["past_key_values.0.key"] == onnx.TensorProto.FLOAT16 and types["logits"] == onnx.TensorProto.FLOAT
    assert not graph.passed and "CUDA provider only" in graph.error and graph.path is None


def test_the_shared_buffer_and_fixed_address_steps_run_for_real(built, llama):
    _, layout, path, _ = llama
    gqa = session(built.get("gqa").path)
    assert shares_buffer(gqa) and not shares_buffer(session(path))
    ids = np.random.default_rng(3).integers(0, 128, (2, 5))
    want = generate_greedy(session(path), layout, ids, np.ones_like(ids), 20, PLAIN)
    shared = carried_steps(gqa, layout, 2)
    got = stacked(list(stream_bound(gqa, layout, ids, np.ones_like(ids), 20, PLAIN, steps=shared)), 2)
    np.testing.assert_array_equal(got, want)
    assert shared.shared and shared.allocations == 2 * layout.layers  # one buffer per past/present pair
    assert all(r == w for step in shared.addresses for r, w in step)  # read and written in place
    graphed = carried_steps(gqa, layout, 2, graph=True)
    got = stacked(list(stream_bound(gqa, layout, ids, np.ones_like(ids), 20, PLAIN, steps=graphed)), 2)
    np.testing.assert_array_equal(got, want)
    assert graphed.graph_ids == [-1] + [1] * 19  # the prompt without a graph, every token step replayed
    fixed = {name: value.data_ptr() for name, value in graphed.fixed.items()}
    assert set(fixed) == {"input_ids", "attention_mask", "position_ids", "logits"}
    assert graphed.fixed["attention_mask"].shape() == [2, MAX_LENGTH]  # padded to the buffer's length
    assert graphed.allocations == 2 * layout.layers + 4  # nothing allocated after the first token step
    mask = np.array([[1] * 5, [0, 0, 1, 1, 1]])
    with pytest.raises(UsageError, match="unpadded rows"):
        list(stream_bound(gqa, layout, ids, mask, 4, PLAIN))


def test_the_cuda_graph_variant_records_its_session_options(llama, tmp_path):
    model, layout, path, _ = llama
    ctx = DecoderBuild(layout, tmp_path, rotary_tables(model, MAX_LENGTH), CUDA_TARGET)
    made = build_cuda_graph(path, tmp_path / "graph.onnx", ctx)
    options = made.session_options
    assert options.provider == CUDA and options.enable_cuda_graph and options.io_binding and not options.use_tf32
    assert (tmp_path / "graph.onnx").is_file() and any("CUDA graph" in n for n in made.notes)
    graph_target = CUDA_TARGET.with_options(options)
    assert graph_target.providers[0][1]["enable_cuda_graph"] == "1"
    with pytest.raises(Skip, match="CUDA provider only"):
        build_cuda_graph(path, tmp_path / "cpu.onnx", DecoderBuild(layout, tmp_path, None, CPU_TARGET))


def test_a_cuda_target_adds_the_gpu_variants_to_all():
    assert variant_names("all") == ("export", "fused", "int8", "int4")
    assert variant_names("auto", CUDA_TARGET) == ("export", "fused", "int8", "int4", "gqa", "fp16", "cuda-graph")
    assert variant_names("int4", CUDA_TARGET) == ("export", "int4")


def test_gqa_does_not_apply_without_rotary_embeddings(llama):
    model, layout, path, _ = llama
    with pytest.raises(Skip, match="no rotary embedding"):
        to_group_query(onnx.load(str(path)), layout, None)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    assert rotary_tables(gpt2, 16) is None
