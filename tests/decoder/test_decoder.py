"""Decoder LMs with a KV cache: export with past/present tensors, the step-by-step proof, greedy generation
with left padding against model.generate, and the inputs that cannot be exported with a cache."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
import transformers

from onnxport import decoder
from onnxport.core.errors import UsageError
from onnxport.runtime.sessions import session
from tests.decoder.conftest import MAX_LENGTH  # llama_dir and llama_outcome: conftest.py


def _tiny(family: str, layers: int = 2):
    torch.manual_seed(0)
    common = dict(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                  max_position_embeddings=256)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(hidden_size=64, vocab_size=128, **common))
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(hidden_size=64, vocab_size=160, **common))
    if family == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(hidden_size=64, vocab_size=128,
                                                                          sliding_window=64, **common))
    if family == "phi3":
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(hidden_size=64, vocab_size=128, pad_token_id=0,
                                                                    eos_token_id=1, bos_token_id=2, **common))
    if family == "gemma":
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(hidden_size=64, vocab_size=128, head_dim=16,
                                                                      **common))
    if family == "gemma2":  # alternating sliding / full attention layers, soft-capped logits
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(hidden_size=64, vocab_size=128, head_dim=16,
                                                                        sliding_window=64, **common))
    if family == "qwen3":  # q/k norms
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(hidden_size=64, vocab_size=128, head_dim=16,
                                                                      **common))
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=192,
                                                                n_positions=256))


def _check_outcome(outcome: decoder.DecoderOutcome, kv_heads: int, position_ids: bool) -> None:
    assert outcome.passed, json.dumps(outcome.to_dict(), indent=1)[:3000]
    assert outcome.path.name == "model.onnx" and outcome.path.is_file()
    assert outcome.layout.kv_heads == kv_heads and outcome.layout.position_ids is position_ids
    model = onnx.load(str(outcome.path), load_external_data=False)
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    outputs = [o.name for o in model.graph.output]
    assert list(inputs) == list(outcome.layout.input_names)
    assert outputs == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert inputs["past_key_values.1.value"] == ["batch", kv_heads, "past", outcome.layout.head_dim]
    assert inputs["input_ids"] == ["batch", "seq"] and inputs["attention_mask"] == ["batch", "total"]
    assert ("position_ids" in inputs) is position_ids
    proof = outcome.proof
    assert {c.past for c in proof.cases} >= {0, 1, MAX_LENGTH - 1} and {c.new for c in proof.cases} >= {1, 4}
    assert {c.batch for c in proof.cases} == {1, 3}
    assert proof.max_abs_err < 1e-4
    padded = next(g for g in proof.generations if g.name == "left-padded batch")
    assert padded.batch == 3 and len(set(padded.prompt_lengths)) == 3
    assert all(g.agreement == (True,) * 32 and g.first_divergent_step is None for g in proof.generations)
    assert json.dumps(outcome.to_dict())


def test_llama_gqa_exported_with_cache_and_proven(llama_outcome):
    """Grouped-query attention (4 heads, 2 kv heads) and rotary positions survive; past 0 runs too."""
    _check_outcome(llama_outcome, kv_heads=2, position_ids=True)
    assert not (llama_outcome.path.parent / "model.unverified.onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family, kv_heads", [("qwen2", 2), ("gpt2", 4)])
def test_other_families(family, kv_heads, tmp_path):
    model = _tiny(family)
    model.save_pretrained(tmp_path / "model")
    assert decoder.is_causal_lm(tmp_path / "model")
    outcome = decoder.run(tmp_path / "model", tmp_path / "out", max_length=MAX_LENGTH)
    _check_outcome(outcome, kv_heads=kv_heads, position_ids=True)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "phi3", "gemma", "gemma2", "qwen3"])
def test_more_families_short(family, tmp_path):
    """The other families users run (sliding windows, fused qkv, q/k norms, soft-capping), at a shorter
    maximum, 8 generated tokens and one layer (Gemma 2 two: one sliding, one full) to keep the suite quick."""
    outcome = decoder.run_model(_tiny(family, 2 if family == "gemma2" else 1), tmp_path, max_length=20, new_tokens=8)
    assert outcome.passed, json.dumps(outcome.to_dict(), indent=1)[:3000]
    assert outcome.layout.kv_heads == 2 and outcome.proof.max_abs_err < 1e-4
    assert {c.past for c in outcome.proof.cases} >= {0, 1, 19}
    assert all(g.agreement == (True,) * 8 for g in outcome.proof.generations)


def test_greedy_loop_matches_generate_with_left_padding(llama_outcome, llama_dir):
    """The library's own loop on the written file, a fresh batch: padded rows generate what generate() does."""
    model = transformers.LlamaForCausalLM.from_pretrained(llama_dir).eval()
    sess = session(llama_outcome.path, providers=["CPUExecutionProvider"])
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    got = decoder.greedy(sess, llama_outcome.layout, ids.numpy(), mask.numpy(), 12)
    want = decoder.prove.reference_generate(model, ids, mask, 12)
    np.testing.assert_array_equal(got, want)


def test_reference_generation_runs_past_the_models_end_of_sequence_token():
    """A model whose greedy path hits its eos (Llama's 2, vocab 8) still gives every token, as a plain loop does."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, vocab_size=8, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256)).eval()
    assert model.generation_config.eos_token_id == 2
    ids = torch.randint(0, 8, (2, 5), generator=torch.Generator().manual_seed(1))
    got = decoder.prove.reference_generate(model, ids, torch.ones_like(ids), 12)
    loop = ids
    with torch.inference_mode():
        for _ in range(12):
            loop = torch.cat([loop, model(loop).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert 2 in got.tolist()[0] and got.shape == (2, 12)
    np.testing.assert_array_equal(got, loop[:, 5:].numpy())
    assert model.generation_config.eos_token_id == 2  # restored


def test_prompt_longer_than_the_maximum_is_a_usage_error(llama_outcome):
    sess = session(llama_outcome.path, providers=["CPUExecutionProvider"])
    ids = np.zeros((1, MAX_LENGTH), np.int64)
    with pytest.raises(UsageError, match="exceeds the declared maximum") as err:
        decoder.greedy(sess, llama_outcome.layout, ids, np.ones_like(ids), 1)
    assert "--max-length" in err.value.hint


def test_step_matrix_covers_the_edges():
    cases = decoder.step_matrix(128)
    assert {b for b, _, _ in cases} == {1, 3}
    assert {p for _, p, _ in cases} == {0, 1, 9, 124, 127}
    assert {n for _, p, n in cases if p == 0} == {1, 7, 128}
    assert all(p + n <= 128 for _, p, n in cases)


def test_is_causal_lm(tmp_path):
    assert not decoder.is_causal_lm(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    assert not decoder.is_causal_lm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    assert decoder.is_causal_lm(tmp_path)
    assert decoder.wants_cache(f"hf:{tmp_path}", None) and decoder.wants_cache(f"hf:{tmp_path}", "text-generation")
    assert not decoder.wants_cache(f"hf:{tmp_path}", "feature-extraction")
    assert not decoder.wants_cache("torchvision:resnet18", None)


def test_run_on_a_model_that_is_no_causal_lm_is_a_usage_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    with pytest.raises(UsageError, match="holds BertForMaskedLM, not a causal language model"):
        decoder.run(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_max_length_without_room_for_generation_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no room for a prompt and 32 generated tokens"):
        decoder.run_model(_tiny("llama"), tmp_path, max_length=20)
    assert not (tmp_path / "model.onnx").exists()


def test_max_length_beyond_the_positions_is_a_usage_error():
    with pytest.raises(UsageError, match="exceeds the 256 positions"):
        decoder.cache_layout(_tiny("llama"), 1000)


def test_max_length_beyond_the_sliding_window_keeps_the_window_in_the_layout():
    """The exported cache keeps every token and the mask applies the window: past it is taken (and proven,
    tests/decoder/test_families.py), the layout names the window."""
    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        sliding_window=16)
    assert decoder.cache_layout(transformers.MistralForCausalLM(config), 64).sliding_window == 16
    assert decoder.cache_layout(transformers.MistralForCausalLM(config), 16).sliding_window is None


def test_missing_kv_heads_defaults_to_the_heads():
    """GPT-2's config has no num_key_value_heads (its test above); a config stripped of it too."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, vocab_size=128)
    model = transformers.LlamaForCausalLM(config)
    del model.config.num_key_value_heads
    assert decoder.cache_layout(model, 16).kv_heads == 4


def test_kv_heads_come_from_the_cache_the_model_returns():
    """A config that says 4 kv heads for a model with 2: the layout is the cache the model returns."""
    model = _tiny("llama")
    del model.config.num_key_value_heads
    layout = decoder.cache_layout(model, 16)
    assert (layout.heads, layout.kv_heads, layout.head_dim) == (4, 2, 16)


def test_config_without_heads_is_a_usage_error_naming_the_model():
    model = _tiny("llama")
    model.config = SimpleNamespace(model_type="odd", num_hidden_layers=2, hidden_size=64, vocab_size=128)
    with pytest.raises(UsageError, match="fails on a 3-token prompt with an empty key/value cache") as err:
        decoder.cache_layout(model, 16)
    assert "--input" in err.value.hint and "--task" not in err.value.hint


class OddForCausalLM(torch.nn.Module):
    """A causal LM whose cache is its own: a tuple of one tensor per layer."""

    def __init__(self) -> None:
        super().__init__()
        self.config = transformers.LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                               vocab_size=16)
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None, return_dict=None):
        hidden = self.emb(input_ids)
        return transformers.modeling_outputs.CausalLMOutputWithPast(logits=hidden, past_key_values=(hidden,))


def test_unknown_cache_layout_is_a_usage_error():
    with pytest.raises(UsageError, match="returns a tuple that is not a per-layer key/value cache") as err:
        decoder.cache_layout(OddForCausalLM(), 16)
    assert "without a cache" in err.value.hint and "\n" not in str(err.value)


def test_not_a_causal_lm_is_a_usage_error():
    with pytest.raises(UsageError, match="not a causal language model"):
        decoder.cache_layout(torch.nn.Linear(2, 2), 16)


def test_newest_opset_onnxruntime_runs_is_chosen(monkeypatch, tmp_path):
    """Like the chain's fallback: an export onnxruntime refuses is redone one opset lower, and why is kept."""
    from onnxport.decoder import export as exporting
    from onnxport.exporters.opsets import default_opset

    newest = default_opset("dynamo")
    written: list[int] = []
    monkeypatch.setattr(exporting, "_export_once", lambda model, layout, path, opset: written.append(opset))
    monkeypatch.setattr(exporting, "ort_cannot_run",
                        lambda path, layout: "onnxruntime cannot run it at past 0: refused" if written[-1] == newest
                        else None)
    layout = SimpleNamespace(max_length=16)
    made = decoder.export_decoder(torch.nn.Linear(1, 1), layout, tmp_path / "m.onnx")
    assert made.opset == newest - 1 and written == [newest, newest - 1]
    assert made.tried == (f"opset {newest}: onnxruntime cannot run it at past 0: refused",)
    with pytest.raises(UsageError, match="opset 99"):
        decoder.export_decoder(torch.nn.Linear(1, 1), layout, tmp_path / "m.onnx", opset=99)


def test_unproven_export_is_written_under_the_unverified_name(monkeypatch, tmp_path):
    from onnxport.decoder import flow

    def fake_export(model, layout, path, *, opset=None):
        graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
                                       [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        onnx.save(onnx.helper.make_model(graph), str(path))
        return decoder.DecoderExport(path, 23, 0.0)

    failing = decoder.DecoderProof(decoder.prove.FP32, (decoder.StepCase(1, 0, 1, 1.0, 0.0, 1.0, False),), ())
    monkeypatch.setattr(flow, "export_decoder", fake_export)
    monkeypatch.setattr(flow, "prove_decoder", lambda *a, **k: failing)
    (tmp_path / "model.onnx").write_text("stale")
    outcome = decoder.run_model(_tiny("llama"), tmp_path, max_length=16, new_tokens=8)
    assert not outcome.passed and outcome.path == tmp_path / "model.unverified.onnx" and outcome.path.is_file()
    assert outcome.export.path == outcome.path
    assert not (tmp_path / "model.onnx").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model.unverified.onnx"]


@pytest.mark.slow
def test_export_of_a_causal_lm_goes_through_the_kv_cache_path(llama_dir, tmp_path):
    import shutil

    from tests.conftest import load_report, run_cli
    from tests.serve.test_generate import _tokenizer

    model_dir = tmp_path / "llama"
    shutil.copytree(llama_dir, model_dir)
    _tokenizer(None).save_pretrained(model_dir)
    out = tmp_path / "cli"
    proc = run_cli("export", f"hf:{model_dir}", "-o", str(out), "--max-length", "40")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = load_report(out)
    assert rep["status"] == "ok" and (out / "model.onnx").is_file()
    dec = rep["decoder"]
    assert dec["layout"]["kv_heads"] < dec["layout"]["heads"]  # grouped-query attention kept
    assert all(g["passed"] and g["steps_agreeing"] == g["new_tokens"] for g in dec["proof"]["generations"])
    names = {i["name"] for i in rep["export"]["inputs"]}
    assert {"input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"} <= names
    assert {"logits", "present.0.key"} <= {o["name"] for o in rep["export"]["outputs"]}
    assert any(d["code"] == "generation-proven" for d in rep["diagnostics"])
    assert dec["layout"]["max_length"] == 40 and max(c["past"] for c in dec["proof"]["cases"]) == 39
    assert (out / "tokenizer" / "tokenizer.json").is_file()  # serve's generate takes text with it
    assert any(d["code"] == "tokenizer-copied" for d in rep["diagnostics"])
    again = run_cli("export", f"hf:{model_dir}", "-o", str(out), "--max-length", "40")
    assert again.returncode == 2 and "already holds results" in again.stderr


def test_max_length_on_a_model_without_cache_is_a_usage_error(tmp_path):
    from tests.conftest import run_cli

    proc = run_cli("export", "torchvision:resnet18", "-o", str(tmp_path / "o"), "--max-length", "64")
    assert proc.returncode == 2 and "--max-length applies to causal language models" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_convert_of_a_causal_lm_builds_and_judges_variants(llama_dir, tmp_path):
    from tests.conftest import load_report, run_cli

    out = tmp_path / "convert"
    proc = run_cli("convert", f"hf:{llama_dir}", "-o", str(out), "--max-length", "24")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = load_report(out)
    made = rep["decoder"]["variants"]
    assert [v["name"] for v in made["variants"]] == ["export", "fused", "int8", "int4"]
    assert all(v["decode_tok_s"] > 0 for v in made["variants"] if v["passed"])
    best = made["best"]
    assert best is not None and (out / "best.onnx").is_file() is (best != "export")
    assert any(d["code"] == "decoder-variant-best" and best in d["message"] for d in rep["diagnostics"])
    assert (out / "variants").is_dir() and "decoder-variant-best" in proc.stderr


@pytest.mark.slow
def test_generation_config_rules_are_proven_against_generate(tmp_path):
    """A decoder whose generation config asks for a repetition penalty, no repeated bigrams and a minimum length:
    the export records the rules, its proof holds, and the loop on the proven file gives ``model.generate()``'s
    own tokens (left-padded rows, then with an end-of-sequence stop as well); a plain argmax loop does not."""
    from onnxport.core.greedy import PLAIN, rules_from_config

    model = _tiny("gpt2").eval()
    for key, value in dict(repetition_penalty=1.4, no_repeat_ngram_size=2, min_new_tokens=4).items():
        setattr(model.generation_config, key, value)
    outcome = decoder.run_model(model, tmp_path, max_length=24, new_tokens=8)
    assert outcome.passed, json.dumps(outcome.to_dict(), indent=1)[:3000]
    assert {"repetition_penalty", "no_repeat_ngram_size", "min_new_tokens"} <= set(outcome.layout.generation.applied)
    assert outcome.to_dict()["layout"]["generation"]["repetition_penalty"] == 1.4
    sess = session(outcome.path, providers=["CPUExecutionProvider"])
    ids = torch.randint(0, 192, (2, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.inference_mode():
        want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)[:, 6:].numpy()
    got = decoder.greedy(sess, outcome.layout, ids.numpy(), mask.numpy(), 12)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(decoder.greedy(sess, outcome.layout, ids.numpy(), mask.numpy(), 12, PLAIN), want)
    model.generation_config.eos_token_id = int(want[0, 5])  # row 0 ends there; row 1 is padded after its end
    model.generation_config.pad_token_id = 0
    rules = rules_from_config(model.generation_config, encoder_decoder=False)
    with torch.inference_mode():
        want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12)[:, 6:].numpy()
    got = decoder.greedy(sess, outcome.layout, ids.numpy(), mask.numpy(), 12, rules)
    np.testing.assert_array_equal(got, want)
    assert got[0, 5] == rules.eos_token_ids[0] and (got.shape[1] == 6 or got[0, 6:].tolist() == [0] * (got.shape[1] - 6))


@pytest.mark.slow
def test_a_model_with_fewer_positions_than_the_default_length_is_exported_at_all_of_them(tmp_path):
    """A saved GPT-2 built for 40 positions, `export hf:DIR` with no --max-length: exported and proven for 40
    tokens (the default 128 would be refused), and the report says so."""
    from tests.conftest import load_report, run_cli

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64,
                                                                 n_positions=40))
    model.generation_config.update(do_sample=True, top_k=5, num_beams=2)  # what greedy files cannot do: named
    model.save_pretrained(tmp_path / "gpt2")
    r = run_cli("export", f"hf:{tmp_path / 'gpt2'}", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-3000:]
    rep = load_report(tmp_path / "out")
    assert rep["decoder"]["layout"]["max_length"] == 40 and rep["decoder"]["proof"]["passed"]
    fitted = [d for d in rep["diagnostics"] if d["code"] == "max-length-fitted"]
    assert len(fitted) == 1 and "40 positions" in fitted[0]["message"]
    named = [d for d in rep["diagnostics"] if d["code"] == "generation-not-applied"]
    assert len(named) == 1 and named[0]["severity"] == "warning"
    assert "do_sample=True" in named[0]["message"] and "num_beams=2" in named[0]["message"]
    assert rep["decoder"]["layout"]["generation"]["not_applied"] == ["do_sample=True", "num_beams=2"]
    r = run_cli("export", f"hf:{tmp_path / 'gpt2'}", "-o", str(tmp_path / "asked"), "--max-length", "128")
    assert r.returncode == 2 and "exceeds the 40 positions" in r.stderr


def test_an_export_that_fails_ends_the_pipeline_with_its_report(llama_dir, tmp_path, monkeypatch):
    """The decoder's export runs as the one pipeline's export stage: when torch.export fails, report.json says
    why (status export_failed, exit 3), as for a plain model."""
    from onnxport import api
    from onnxport.decoder import export as exporting

    def fails(model, layout, path, opset):
        raise RuntimeError("no way to trace this")

    monkeypatch.setattr(exporting, "_export_once", fails)
    rep = api.convert(f"hf:{llama_dir}", tmp_path / "o", max_length=24)
    assert rep["status"] == "export_failed" and rep["validation"] is None and "decoder" not in rep
    assert "could not be exported at opset" in rep["summary"] and "no way to trace this" in rep["summary"]
    assert [d["code"] for d in rep["diagnostics"] if d["severity"] == "error"] == ["export-failed"]
    assert json.loads((tmp_path / "o" / "report.json").read_text())["status"] == "export_failed"
    assert not (tmp_path / "o" / "model.onnx").exists()
