"""Decoder families that need a switch for their export with the cache (docs/decoders.md, "Families"): MoE
experts, half-precision checkpoints, multi-query attention, latent attention, dynamic rope, sliding windows; and
the refusals of models without a key/value cache. Tiny random models of one layer (DeepSeek-V3 two: a dense one,
then a MoE one), saved with save_pretrained; the cache across layers is proven in test_decoder.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from onnxport import decoder
from onnxport.core.errors import ExportFailed, UsageError

COMMON = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              max_position_embeddings=256, hidden_size=32, vocab_size=128)


def _tiny(family: str):
    torch.manual_seed(0)
    t = transformers
    if family == "mixtral":
        return t.MixtralForCausalLM(t.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **COMMON))
    if family == "qwen2_moe":
        return t.Qwen2MoeForCausalLM(t.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                      shared_expert_intermediate_size=32, **COMMON))
    if family == "qwen3_moe":
        return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                      head_dim=8, **COMMON))
    if family == "falcon_mqa":
        return t.FalconForCausalLM(t.FalconConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                  multi_query=True, vocab_size=128, alibi=False))
    if family == "falcon_alibi":
        return t.FalconForCausalLM(t.FalconConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                  multi_query=True, vocab_size=128, alibi=True))
    if family == "deepseek_v3":  # multi-head latent attention (keys and values of other widths), MoE
        return t.DeepseekV3ForCausalLM(t.DeepseekV3Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
            intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=256))
    if family == "llama_dynamic_ntk":
        return t.LlamaForCausalLM(t.LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, **COMMON))
    if family == "mistral_window":
        return t.MistralForCausalLM(t.MistralConfig(sliding_window=16, **COMMON))
    if family == "mamba":
        return t.MambaForCausalLM(t.MambaConfig(hidden_size=32, num_hidden_layers=1, vocab_size=128, state_size=8))
    return t.LlamaForCausalLM(t.LlamaConfig(**COMMON))


def _saved(family: str, path: Path, dtype: torch.dtype | None = None) -> Path:
    model = _tiny(family)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    return path


def _convert(monkeypatch, capsys, model_dir: Path, out: Path, max_length: int, *extra: str):
    """``onnxport export hf:DIR -o OUT --max-length N`` through the CLI's entry point in this process (the claim is
    the command's report, not the process): (the finished command, report.json)."""
    from tests.conftest import load_report
    from tests.fixtures.in_process import run_cli_here

    done = run_cli_here(monkeypatch, capsys, "export", f"hf:{model_dir}", "-o", str(out), "--max-length",
                        str(max_length), *extra)
    return done, (load_report(out) if (out / "report.json").is_file() else None)


def _proven(proc, rep: dict) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rep["status"] == "ok"
    dec = rep["decoder"]
    assert dec["proof"]["passed"] and dec["proof"]["max_abs_err"] < 1e-4
    assert all(g["passed"] and g["steps_agreeing"] == g["new_tokens"] for g in dec["proof"]["generations"])
    assert any(d["code"] == "generation-proven" for d in rep["diagnostics"])
    return dec


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_decoders_exported_with_batched_experts_and_proven(family, tmp_path, monkeypatch, capsys):
    """grouped_mm (transformers' default experts) has no ONNX translation: the export runs batched_mm, the proof
    compares with the model's own grouped_mm, and the model is left as it was."""
    proc, rep = _convert(monkeypatch, capsys, _saved(family, tmp_path / family), tmp_path / "out", 20)
    dec = _proven(proc, rep)
    assert dec["export"]["experts"] == "batched_mm"
    assert any(d["code"] == "decoder-experts" and "batched_mm" in d["message"] for d in rep["diagnostics"])
    assert (tmp_path / "out" / "model.onnx").is_file()


def test_experts_switch_is_undone_after_the_block():
    from onnxport.decoder.exportable import exportable

    model = _tiny("mixtral")
    assert model.get_experts_implementation() == {"": "grouped_mm"}
    with exportable(model, 16) as (experts, notes):
        assert experts == "batched_mm" and model.get_experts_implementation() == {"": "batched_mm"}
    assert model.get_experts_implementation() == {"": "grouped_mm"} and notes == []
    with exportable(_tiny("llama"), 16) as (experts, _):
        assert experts is None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint_exported_and_proven_in_float32(dtype, tmp_path, monkeypatch, capsys):
    """How most checkpoints ship: the weights are upcast (exactly), the file computes in float32 and the proof
    compares with the float32 model; the report says so."""
    model_dir = _saved("llama", tmp_path / "llama", dtype)
    assert str(dtype).removeprefix("torch.") in (model_dir / "config.json").read_text()
    proc, rep = _convert(monkeypatch, capsys, model_dir, tmp_path / "out", 20)
    dec = _proven(proc, rep)
    name = str(dtype).removeprefix("torch.")
    assert dec["export"]["dtype"] == "float32" and dec["export"]["source_dtype"] == name
    assert any(d["code"] == "decoder-dtype" and name in d["message"] and "float32" in d["message"]
               for d in rep["diagnostics"])
    import onnx

    graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph
    floats = {i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_key_values.")}
    assert floats == {onnx.TensorProto.FLOAT}


def test_upcast_leaves_float32_alone():
    from onnxport.decoder.exportable import upcast

    model = _tiny("llama")
    assert upcast(model) is None
    assert upcast(model.to(torch.bfloat16)) == "bfloat16" and next(model.parameters()).dtype == torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("family", ["falcon_mqa", "falcon_alibi"])
def test_falcon_multi_query_keeps_one_kv_head_and_is_proven(family, tmp_path):
    """multi_query=True: the cache holds one key/value head, whatever num_attention_heads says."""
    outcome = decoder.run_model(_tiny(family), tmp_path, max_length=20, new_tokens=8)
    assert outcome.passed, outcome.to_dict()
    assert outcome.layout.kv_heads == 1 and outcome.layout.heads == 4
    assert outcome.proof.max_abs_err < 1e-4


@pytest.mark.slow
def test_latent_attention_keys_and_values_of_other_widths(tmp_path):
    """DeepSeek-V3: the cache the model returns is read, not guessed from the config (keys and values differ)."""
    outcome = decoder.run_model(_tiny("deepseek_v3"), tmp_path, max_length=20, new_tokens=8)
    assert outcome.passed, outcome.to_dict()
    assert outcome.layout.head_dim != outcome.layout.value_head_dim
    assert outcome.export.experts == "batched_mm"


def test_cache_layout_reads_the_cache_the_model_returns():
    layout = decoder.cache_layout(_tiny("falcon_mqa"), 16)
    assert (layout.heads, layout.kv_heads, layout.head_dim) == (4, 1, 8)
    mla = decoder.cache_layout(_tiny("deepseek_v3"), 16)
    assert mla.past_shape("key", 2, 5)[2:] == (5, mla.head_dim) and mla.value_dim not in (None, mla.head_dim)


@pytest.mark.slow
def test_dynamic_ntk_rope_within_its_positions_is_proven(tmp_path):
    outcome = decoder.run_model(_tiny("llama_dynamic_ntk"), tmp_path, max_length=20, new_tokens=8)
    assert outcome.passed, outcome.to_dict()
    assert any("dynamic rope" in n for n in outcome.export.notes)


def test_dynamic_ntk_rope_past_its_positions_names_the_rope_update():
    from onnxport.decoder.exportable import exportable

    model = _tiny("llama_dynamic_ntk")
    with pytest.raises(UsageError, match="dynamic rope .* recomputes its frequencies past 256") as err, \
            exportable(model, 300):
        pass
    assert "--max-length 256" in err.value.hint


@pytest.mark.slow
def test_sliding_window_proven_past_the_window(tmp_path):
    """A 16-token window, 36 tokens: the cache keeps every token, the mask applies the window, generation
    (against generate(), whose cache drops old tokens) runs past it."""
    outcome = decoder.run_model(_tiny("mistral_window"), tmp_path, max_length=36, new_tokens=24)
    assert outcome.passed, outcome.to_dict()
    assert outcome.layout.sliding_window == 16
    assert max(c.past + c.new for c in outcome.proof.cases) == 36
    assert all(g.agreement == (True,) * 24 for g in outcome.proof.generations)


def test_mamba_is_told_it_has_no_key_value_cache(tmp_path):
    """A recurrent state, not a KV cache: said so, and the hint is the documented way (--input), never
    'set num_attention_heads' nor a --task the user did not give."""
    from tests.conftest import run_cli

    proc = run_cli("export", f"hf:{_saved('mamba', tmp_path / 'mamba')}", "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "recurrent state (cache_params), not a key/value cache" in proc.stderr
    assert "--input" in proc.stderr and "--task" not in proc.stderr and "num_attention_heads" not in proc.stderr


def test_missing_kernel_at_every_opset_is_tried_once(monkeypatch, tmp_path):
    """onnxruntime lacking a kernel (a bfloat16 Mul-14) is not cured by a lower opset that keeps Mul-14: one
    export, not one per opset."""
    from onnxport.decoder import export as exporting

    written: list[int] = []
    monkeypatch.setattr(exporting, "_export_once", lambda model, layout, path, opset: written.append(opset))
    monkeypatch.setattr(exporting, "ort_cannot_run", lambda path, layout: (
        "onnxruntime cannot load it: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation "
        "for Mul(14) node with name 'node_mul_3'"))
    with pytest.raises(ExportFailed, match="node_mul_3") as err:
        decoder.export_decoder(_tiny("llama"), decoder.cache_layout(_tiny("llama"), 16), tmp_path / "m.onnx")
    assert len(written) == 1 and "kernel onnxruntime lacks" in err.value.hint
    assert exporting.same_kernel("Could not find an implementation for Mul(14) node", 17)
    assert not exporting.same_kernel("Could not find an implementation for Mul(14) node", 13)
