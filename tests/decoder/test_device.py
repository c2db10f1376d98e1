"""Decoders and encoder-decoders on a device: the target built from --device (providers and device id as data,
the CUDA branch checked by what it builds on a machine without a GPU), the families taking --device cuda, and
the decode loop that keeps the cache on the session's device through IO binding, run for real on the CPU
provider: its tokens equal the host loop's and its cache buffers are allocated once and rebound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from onnxport import api
from onnxport.core.errors import EnvironmentProblem
from onnxport.core.greedy import PLAIN, GreedyRules
from onnxport.core.options import GpuOptions, Options, RuntimeOptions
from onnxport.decoder.applies import refuse_for_decoder
from onnxport.decoder.generation import carried_steps, generate_greedy, stacked, stream_bound
from onnxport.runtime.binding import CPU_TARGET, Target, pick_model
from onnxport.runtime.sessions import CPU, CUDA, session
from onnxport.runtime.variant_sessions import SessionOptions
from onnxport.seq2seq.stage import checked as refuse_for_seq2seq

SIMULATED = [CUDA, CPU]


def test_the_cuda_target_is_data():
    target = Target.of(RuntimeOptions(device="cuda", gpu=GpuOptions(device_id=1)), available=SIMULATED)
    assert target.gpu and target.torch_device == "cuda:1" and target.ort_device == "cuda"
    (name, opts), last = target.providers
    assert name == CUDA and last == CPU and opts["device_id"] == 1 and opts["use_tf32"] == "0"
    assert "enable_cuda_graph" not in opts and target.to_dict()["providers"] == [CUDA, CPU]
    graphed = target.with_options(SessionOptions(CUDA, use_tf32=False, enable_cuda_graph=True))
    assert graphed.providers[0][1]["enable_cuda_graph"] == "1" and graphed.providers[0][1]["device_id"] == 1
    cpu = Target.of(RuntimeOptions())
    assert cpu == CPU_TARGET and cpu.providers == (CPU,) and cpu.torch_device == "cpu" and not cpu.gpu
    assert cpu.with_options(SessionOptions(CUDA, enable_cuda_graph=True)) is cpu
    with pytest.raises(EnvironmentProblem, match="CUDAExecutionProvider"):
        Target.of(RuntimeOptions(device="cuda"), available=[CPU])


def test_both_families_take_device_cuda():
    options = Options(runtime=RuntimeOptions(device="cuda"))
    refuse_for_decoder(options)  # no refusal: the proof and variants run on the CUDA provider
    assert refuse_for_seq2seq(options) is options


def test_device_cuda_without_a_gpu_is_an_environment_problem(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, vocab_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the device script runs the family on it")
    with pytest.raises(EnvironmentProblem) as e:
        api.convert(f"hf:{tmp_path / 'llama'}", tmp_path / "o", max_length=24, device="cuda")
    assert e.value.exit_code == 4 and "CPU today" not in e.value.message


@pytest.fixture(scope="module")
def llama(exported_llama):
    model, layout, path, _ = exported_llama
    return model, layout, session(path)


def _prompts() -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(0).integers(0, 128, (3, 6))
    return ids, np.array([[1] * 6, [0, 0, 0, 0, 0, 1], [0, 0, 1, 1, 1, 1]])


@pytest.mark.parametrize("rules", [PLAIN, GreedyRules(repetition_penalty=1.3, eos_token_ids=(5,), pad_token_id=0)],
                         ids=["argmax", "processed-scores"])
def test_the_bound_loop_gives_the_host_loops_tokens_on_buffers_allocated_once(llama, rules):
    _, layout, sess = llama
    ids, mask = _prompts()
    want = generate_greedy(sess, layout, ids, mask, 24, rules)
    steps = carried_steps(sess, layout, 3)
    got = stacked(list(stream_bound(sess, layout, ids, mask, 24, rules, steps=steps)), 3)
    np.testing.assert_array_equal(got, want)
    assert steps.allocations == 2 * 2 * layout.layers  # two buffers per past/present pair, allocated once
    bound = {address for step in steps.addresses for pair in step for address in pair}
    assert bound == steps.buffer_addresses() and len(steps.addresses) == got.shape[1]  # rebound every step
    assert steps.length == ids.shape[1] + got.shape[1] - 1
    first, second = steps.addresses[:2]
    assert [w for _, w in first] == [r for r, _ in second]  # a step reads what the last one wrote: no copy
    np.testing.assert_array_equal(generate_greedy(sess, layout, ids, mask, 24, rules, CPU_TARGET), want)


def test_the_pick_model_returns_the_last_positions_argmax_only():
    from onnx import TensorProto

    sess = session(pick_model(TensorProto.FLOAT))
    scores = np.random.default_rng(1).normal(size=(2, 3, 7)).astype(np.float32)
    token, last = sess.run(None, {"scores": scores})
    np.testing.assert_array_equal(token, scores[:, -1].argmax(-1))
    np.testing.assert_array_equal(last, scores[:, -1])


def test_a_gpu_triton_entry_of_a_decoder_runs_on_the_cuda_provider_without_a_graph(tmp_path):
    import json

    from onnxport.serve.repository import _gpu_session
    from onnxport.serve.triton import gpu_accelerators

    (tmp_path / "report.json").write_text(json.dumps({"decoder": {"layout": {}}}))
    found = _gpu_session(tmp_path, None)
    assert found.provider == CUDA and found.use_tf32 is False and not found.enable_cuda_graph
    assert gpu_accelerators(found) == [{"name": "cuda", "parameters": {"use_tf32": "0"}}]  # no unproven TensorRT
    graphed = _gpu_session(tmp_path, SessionOptions(CUDA, use_tf32=False, enable_cuda_graph=True, io_binding=True))
    assert not graphed.enable_cuda_graph and graphed.provider == CUDA
    (tmp_path / "report.json").write_text(json.dumps({"model": {"name": "plain"}}))
    plain = SessionOptions(CUDA, enable_cuda_graph=True)
    assert _gpu_session(tmp_path, plain) is plain and _gpu_session(tmp_path, None) is None
