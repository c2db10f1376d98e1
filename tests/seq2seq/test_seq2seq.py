"""Encoder-decoders with their cache: the three files in Optimum's layout, the step proof and greedy generation
against model.generate, for T5, BART, Marian, mBART, Pegasus and Whisper (tiny random models), through the
command line and the library; and the inputs and options refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers

from onnxport import api, seq2seq
from onnxport.core.errors import UsageError
from onnxport.core.greedy import PLAIN
from onnxport.decoder.records import CacheVariants
from onnxport.seq2seq.feeds import encoder_inputs
from onnxport.seq2seq.prove import reference_generate
from tests.conftest import load_report, run_cli
from tests.seq2seq.conftest import MAX_LENGTH as SERVED_LENGTH
from tests.seq2seq.tiny import tiny

MAX_LENGTH = 40


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("t5")
    tiny("t5").save_pretrained(path)
    return path


def _inputs(model) -> dict:
    graph = onnx.load(str(model), load_external_data=False).graph
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


def _outputs(model) -> list[str]:
    return [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]


@pytest.mark.slow
def test_t5_exports_three_files_proven_by_generation_through_the_cli(t5_out):
    """``onnxport export hf:DIR -o OUT --max-length 24`` in a subprocess (the session's T5 folder, conftest.py)."""
    assert "Traceback" not in (t5_out.parent / "t5.stderr").read_text()
    rep = load_report(t5_out)
    assert rep["status"] == "ok"
    section = rep["seq2seq"]
    assert section["passed"] and section["files"] == list(seq2seq.FILES)
    assert section["layout"]["model_type"] == "t5" and section["layout"]["max_length"] == SERVED_LENGTH
    cases = section["proof"]["cases"]
    assert {c["source"] for c in cases} >= {1, 7, 512} and {c["batch"] for c in cases} == {1, 3}
    assert any(c["padded"] for c in cases) and max(c["past"] for c in cases) == SERVED_LENGTH - 1
    assert {c["file"] for c in cases} == {"decoder_model.onnx", "decoder_with_past_model.onnx"}
    gens = section["proof"]["generations"]
    assert [g["steps_agreeing"] for g in gens] == [SERVED_LENGTH] * 2 and gens[1]["batch"] == 3
    assert any(d["code"] == "generation-proven" for d in rep["diagnostics"])
    # the one pipeline's stages made the report's records from the family's hooks (seq2seq/hooks.py)
    assert {"export", "check", "parity"} <= set(rep["timings"]) and rep["export"]["path"] == seq2seq.FILES[2]
    assert [c["sizes"]["past"] for c in rep["validation"]["cases"]] == [c["past"] for c in cases]
    out = t5_out
    assert _inputs(out / "encoder_model.onnx") == {"input_ids": ["batch", "source"],
                                                   "attention_mask": ["batch", "source"]}
    assert _outputs(out / "encoder_model.onnx") == ["last_hidden_state"]
    first = _inputs(out / "decoder_model.onnx")
    assert list(first) == ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    assert _outputs(out / "decoder_model.onnx")[:5] == ["logits", "present.0.decoder.key", "present.0.decoder.value",
                                                        "present.0.encoder.key", "present.0.encoder.value"]
    past = _inputs(out / "decoder_with_past_model.onnx")
    assert past["past_key_values.1.decoder.key"][2] == "past" and past["past_key_values.1.encoder.value"][2] == "source"
    assert _outputs(out / "decoder_with_past_model.onnx") == ["logits"] + [
        f"present.{i}.decoder.{kv}" for i in range(2) for kv in ("key", "value")]


# generation configs as saved checkpoints carry them: mBART / M2M100 force the target language as the first token,
# Whisper starts on language and task tokens and suppresses some; BART's default config forces the last token.
CONFIGURED = {
    "mbart": dict(forced_bos_token_id=5),
    "m2m_100": dict(forced_bos_token_id=6, no_repeat_ngram_size=3),
    "marian": dict(repetition_penalty=1.5, bad_words_ids=[[4], [9, 10]]),
    "pegasus": dict(min_new_tokens=6, suppress_tokens=[11, 12]),
    "whisper": dict(lang_to_id={"<|en|>": 50, "<|de|>": 51}, task_to_id={"transcribe": 60, "translate": 61},
                    no_timestamps_token_id=70, language="de", task="transcribe", suppress_tokens=[7, 8],
                    begin_suppress_tokens=[9]),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bart", "marian", "mbart", "pegasus", "whisper", "m2m_100"])
def test_families_are_proven_by_generation(family, tmp_path):
    model = tiny(family)
    for key, value in CONFIGURED.get(family, {}).items():  # as generation_config.json sets them (update() would
        setattr(model.generation_config, key, value)  # leave out the fields a fresh config does not have)
    made = seq2seq.run_model(model, tmp_path, max_length=SERVED_LENGTH, new_tokens=16)
    assert made.passed, [c for c in made.proof.cases if not c.passed] + list(made.proof.generations)
    assert all(p.is_file() for p in made.paths) and made.paths[0].name == "encoder_model.onnx"
    assert [sum(g.agreement) for g in made.proof.generations][1] == 16  # the batch runs without the eos stop
    want = reference_generate(model, made.layout, encoder_inputs(made.layout, 3, 7, padded=True), 16)
    assert len(np.unique(want)) >= 4  # the scaled weights make greedy tokens vary
    # the files' loop under the recorded rules gives model.generate()'s tokens with the model's own config
    inputs = encoder_inputs(made.layout, 2, 7, padded=True, seed=11)
    got = seq2seq.generate_greedy(seq2seq.open_sessions(tmp_path), made.layout, [t.numpy() for t in inputs], 16)
    if family == "whisper":  # its own generate() is long-form and timestamp logic: the generic one on its prompt
        assert made.layout.rules.decoder_prompt == (51, 60, 70) and {"suppress_tokens", "begin_suppress_tokens"} <= \
            set(made.layout.rules.applied)
        want = reference_generate(model, made.layout, inputs, 16, made.layout.rules)
        assert 9 not in got[:, 0] and not np.isin(got, [7, 8]).any()
    else:
        with torch.inference_mode():
            want = model.generate(input_ids=inputs[0], attention_mask=inputs[1], max_new_tokens=16)[:, 1:].numpy()
    np.testing.assert_array_equal(got, want)
    plain = seq2seq.generate_greedy(seq2seq.open_sessions(tmp_path), made.layout, [t.numpy() for t in inputs], 16,
                                    PLAIN)
    if family in ("bart", "mbart", "m2m_100"):  # a loop without the rules would give other tokens
        assert not np.array_equal(plain[:, :want.shape[1]], want)
    if family in ("mbart", "m2m_100"):
        assert (got[:, 0] == CONFIGURED[family]["forced_bos_token_id"]).all()
    if family == "whisper":
        assert made.layout.speech and _inputs(made.paths[0]) == {"input_features": ["batch", 16, 64]}
        assert "encoder_attention_mask" not in _inputs(made.paths[2])


@pytest.mark.slow
def test_generation_that_differs_is_caught(t5_out):
    """A proof that holds the files to something else fails: the T5 files against a model with other weights."""
    layout = seq2seq.Seq2SeqLayout.from_dict(load_report(t5_out)["seq2seq"]["layout"])
    other = tiny("t5", scale=2.0)
    proof = seq2seq.prove_seq2seq(other, layout, seq2seq.open_sessions(t5_out), new_tokens=8)
    assert not proof.passed and not any(c.passed for c in proof.cases)
    assert all(not g.passed for g in proof.generations)


def test_encoder_decoders_are_recognised(t5_dir, tmp_path):
    assert seq2seq.is_seq2seq(t5_dir) and seq2seq.wants_seq2seq(f"hf:{t5_dir}", None)
    assert seq2seq.wants_seq2seq(f"hf:{t5_dir}", "text2text-generation")
    assert not seq2seq.wants_seq2seq(f"hf:{t5_dir}", "feature-extraction")
    assert not seq2seq.wants_seq2seq(f"{t5_dir}/model.pt", None)
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert not seq2seq.is_seq2seq(llama)


def test_step_matrix_covers_sources_past_and_padded_batches():
    layout = seq2seq.Seq2SeqLayout("T5ForConditionalGeneration", "t5", 2, 4, 16, 64, 128, 0, MAX_LENGTH, 512)
    cases = seq2seq.step_matrix(layout)
    assert {c[1] for c in cases} == {1, 7, 512}  # source: min, odd, max
    assert {c[2] for c in cases} >= {0, 1, 9, MAX_LENGTH - 1}  # decoder past: 0 … max-1
    assert {c[0] for c in cases} == {1, 3} and any(c[4] and c[0] == 3 for c in cases)
    assert all(c[2] + c[3] <= MAX_LENGTH for c in cases)


def test_a_length_beyond_the_positions_is_refused():
    with pytest.raises(UsageError) as e:
        seq2seq.seq2seq_layout(tiny("bart"), 300, 64)
    assert "256 decoder positions" in e.value.message and e.value.exit_code == 2


def test_a_model_that_is_no_encoder_decoder_is_refused():
    import torch

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    with pytest.raises(UsageError) as e:
        seq2seq.seq2seq_layout(gpt2, 32, 32)
    assert "not an encoder-decoder" in e.value.message


@pytest.mark.parametrize(("kw", "named"), [
    ({"dims": ["seq=1..64"]}, "--dim"),
    ({"compare": ["logits=cosine"]}, "--compare"),
    ({"model_args": {"hidden": 8}}, "--model-args"),
    ({"exporter": "torchscript"}, "--exporter torchscript"),
    ({"samples": "prompts.txt"}, "--samples"),
    ({"variants": ["int4"]}, "--variants int4"),
    ({"seq": 20}, "--seq 20"),
])
def test_options_that_do_not_apply_are_refused(t5_dir, tmp_path, kw, named):
    out = tmp_path / "o"
    with pytest.raises(UsageError) as e:
        api.convert(f"hf:{t5_dir}", out, **kw)
    assert named in e.value.message and "encoder-decoder" in e.value.message and e.value.exit_code == 2
    assert not out.exists()  # refused before anything was written


def test_a_refusal_is_one_line_and_exit_2_through_the_cli(t5_dir, tmp_path):
    proc = run_cli("export", f"hf:{t5_dir}", "-o", str(tmp_path / "o"), "--exporter", "torchscript")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--exporter torchscript" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_variants_are_judged_and_timed_and_the_export_kept_unless_clearly_faster(tmp_path):
    made = seq2seq.run_model(tiny("t5", layers=1), tmp_path, max_length=24, new_tokens=16,
                             variants=CacheVariants("all", threads=1))
    assert made.passed and made.variants is not None
    byname = {v.name: v for v in made.variants.variants}
    assert set(byname) == {"export", "fused", "int8"}
    assert byname["export"].passed and byname["export"].decode_tok_s > 0
    assert byname["fused"].strict is not None and byname["int8"].cosine is not None
    assert all((tmp_path / "variants" / name / f).is_file() for name in ("fused", "int8") for f in seq2seq.FILES)
    best = made.variants.best
    assert best is not None and best.passed
    if best.name != "export":
        assert best.decode_tok_s >= 1.05 * byname["export"].decode_tok_s
    section = made.to_dict()["variants"]
    assert section["best"] == best.name and len(section["variants"]) == 3


def test_an_unknown_variant_is_refused_before_the_export(tmp_path):
    with pytest.raises(UsageError) as e:
        seq2seq.run_model(tiny("t5"), tmp_path, variants=CacheVariants(["int4"]))
    assert "int4" in e.value.message and not any(tmp_path.iterdir())
