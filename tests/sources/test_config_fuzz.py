"""Hostile model folders (issue 49): config.json and generation_config.json of tiny saved models mutated by
hypothesis, each loaded the way every Hugging Face family loads it (sources.hf.hf_model, then the inputs made up
and the greedy rules read); it loads, or it is refused with an OnnxportError of exit 2 (or 4) in one line: never
another exception, a traceback or a hang. One CLI run checks the line and exit status end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from onnxport.core.errors import OnnxportError
from onnxport.core.greedy import rules_from_config
from onnxport.sources import hf

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


def _tiny(kind: str):
    import transformers as t

    torch.manual_seed(0)
    if kind == "bert":
        return t.BertModel(t.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=24, max_position_embeddings=32))
    if kind == "llama":
        model = t.LlamaForCausalLM(t.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=24,
                                                 max_position_embeddings=32, bos_token_id=1, eos_token_id=2))
        model.generation_config.repetition_penalty = 1.1
        return model
    return t.T5ForConditionalGeneration(t.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=24, num_layers=1,
                                                   num_heads=4, decoder_start_token_id=0))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-models")
    folders = {}
    for kind in ("bert", "llama", "t5"):
        folders[kind] = root / kind
        _tiny(kind).save_pretrained(folders[kind])
    return folders


KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "max_position_embeddings", "type_vocab_size", "d_model", "d_kv", "num_heads",
        "num_layers", "head_dim", "rope_scaling", "rope_theta", "dtype", "torch_dtype", "model_type", "architectures",
        "layer_norm_eps", "rms_norm_eps", "hidden_act", "pad_token_id", "bos_token_id", "eos_token_id",
        "tie_word_embeddings", "use_cache", "is_encoder_decoder", "decoder_start_token_id", "sliding_window",
        "image_size", "num_channels", "text_config")
GENERATION_KEYS = ("repetition_penalty", "eos_token_id", "bos_token_id", "pad_token_id", "do_sample", "num_beams",
                   "temperature", "top_k", "top_p", "max_length", "min_length", "max_new_tokens",
                   "no_repeat_ngram_size", "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
                   "suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids", "min_new_tokens")
SCALARS = st.one_of(st.none(), st.booleans(), st.sampled_from([0, 1, 2, 3, 4, -1, -5, 10**12, 2**63, 7, 16]),
                    st.integers(-100, 100), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["", "abc", "32", "float128", "bogus", "gelu", "\ud800"]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(
    st.sampled_from(["rope_type", "type", "factor", "hidden_size", "x"]), SCALARS, max_size=3), st.just("DELETE"))
MUTATIONS = st.lists(st.tuples(st.booleans(), st.sampled_from(KEYS + GENERATION_KEYS), VALUES), min_size=1,
                     max_size=3)


def _mutate(folder: Path, mutations) -> None:
    for in_generation, key, value in mutations:
        file = folder / ("generation_config.json" if in_generation else "config.json")
        data = json.loads(file.read_text()) if file.is_file() else {}
        if value == "DELETE":
            data.pop(key, None)
        else:
            data[key] = value
        file.write_text(json.dumps(data))


def _load(folder: Path, kind: str) -> None:
    """What every Hugging Face family does first with the folder: the model, its inputs, its greedy rules."""
    model = hf.hf_model(folder, task="text-generation" if kind == "llama" else None)
    if kind == "bert":
        hf.load_hf(f"hf:{folder}", [], [])
    rules_from_config(getattr(model, "generation_config", None), encoder_decoder=kind == "t5")


def test_mutated_configs_load_or_are_refused_in_one_line(saved, tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXPORT_DEBUG", raising=False)
    seen = {"loaded": 0, "refused": 0}
    started = time.monotonic()

    @hypothesis.settings(max_examples=45, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(kind=st.sampled_from(sorted(saved)), mutations=MUTATIONS)
    def fuzz(kind, mutations):
        folder = tmp_path / "m"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(saved[kind], folder)
        _mutate(folder, mutations)
        try:
            _load(folder, kind)
            seen["loaded"] += 1
        except OnnxportError as e:
            assert e.exit_code in (2, 4), (mutations, e)
            assert "\n" not in str(e) and len(str(e)) < 1000, (mutations, str(e))
            seen["refused"] += 1

    fuzz()
    assert seen["refused"] > 0
    assert time.monotonic() - started < 120


def test_a_hostile_config_is_one_line_and_exit_2_from_the_cli(saved, tmp_path):
    folder = tmp_path / "layers"
    shutil.copytree(saved["llama"], folder)
    _mutate(folder, [(False, "num_hidden_layers", 10**9), (True, "repetition_penalty", "x")])
    started = time.monotonic()
    got = subprocess.run([sys.executable, "-m", "onnxport", "export", f"hf:{folder}", "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    lines = [ln for ln in got.stderr.splitlines() if ln.strip()]
    assert got.returncode == 2 and len(lines) == 1, got.stderr
    assert "config.json: num_hidden_layers = 1000000000 is not valid" in lines[0]
    assert time.monotonic() - started < 60 and not (tmp_path / "out").exists()
