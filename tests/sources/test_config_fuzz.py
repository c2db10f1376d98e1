"""Hostile model folders (issue 49): config.json, generation_config.json and the tokenizer files
(tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab files) of tiny saved models mutated by
hypothesis, each loaded the way every Hugging Face family loads it (sources.hf.hf_model, then the inputs made up,
the greedy rules read and the tokenizer copied beside the export); it loads, or it is refused with an
OnnxportError of exit 2 (or 4) in one line: never another exception, a traceback or a hang. The examples are a
fixed number, derandomized (the same every run). CLI runs check the line and exit status end to end."""

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
from onnxport.decoder.tokenizer import save_tokenizer
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


def _save_tokenizer(kind: str, folder: Path) -> None:
    """A tokenizer built locally: BERT's from a vocab.txt, the others a WordLevel tokenizer.json (no download)."""
    import tokenizers
    import transformers as t

    words = ["<pad>", "<unk>", "</s>", "<s>"] + [f"w{i}" for i in range(60)]
    if kind == "bert":
        (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words[4:]]))
        t.BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(str(folder))
        return
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    t.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>",
                              bos_token="<s>").save_pretrained(str(folder))
    (folder / "vocab.json").write_text(json.dumps({w: i for i, w in enumerate(words)}))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-models")
    folders = {}
    for kind in ("bert", "llama", "t5"):
        folders[kind] = root / kind
        _tiny(kind).save_pretrained(folders[kind])
        _save_tokenizer(kind, folders[kind])
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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json")
TOKENIZER_KEYS = ("model_max_length", "pad_token", "eos_token", "unk_token", "bos_token", "tokenizer_class",
                  "added_tokens", "additional_special_tokens", "do_lower_case", "model", "normalizer",
                  "pre_tokenizer", "decoder", "truncation", "padding", "model_input_names", "w1", "<pad>")
RAW = st.sampled_from([b"", b"{", b"[[[", b"null", b"[]", b'"x"', b"\xff\xfe\x00", b"[" * 50_000, b"w1\n" * 3,
                       b'{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 1000000000}}}'])
TOKENIZER_MUTATIONS = st.lists(st.one_of(
    st.tuples(st.sampled_from(TOKENIZER_FILES), st.just("RAW"), RAW),
    st.tuples(st.sampled_from(TOKENIZER_FILES[:3] + TOKENIZER_FILES[4:]), st.sampled_from(TOKENIZER_KEYS), VALUES),
    st.tuples(st.just("tokenizer.json"), st.just("VOCAB"), SCALARS)), min_size=1, max_size=3)


def _mutate_tokenizer(folder: Path, mutations) -> None:
    """Each mutation: a file's bytes replaced, a key of a JSON file set (or deleted), or a vocabulary id of
    tokenizer.json set to another value."""
    for name, key, value in mutations:
        file = folder / name
        if key == "RAW":
            file.write_bytes(value)
            continue
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError, RecursionError):
            continue  # an earlier mutation made it no JSON
        if not isinstance(data, dict):
            continue
        if key == "VOCAB":
            vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
            if isinstance(vocab, dict):
                vocab["w1"] = value
        elif value == "DELETE":
            data.pop(key, None)
        else:
            data[key] = value
        file.write_text(json.dumps(data))


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


def _refused_in_one_line(e: OnnxportError, mutations) -> None:
    assert e.exit_code in (2, 4), (mutations, e)
    assert "\n" not in str(e) and len(str(e)) < 1000, (mutations, str(e))


def test_mutated_configs_load_or_are_refused_in_one_line(saved, tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXPORT_DEBUG", raising=False)
    seen = {"loaded": 0, "refused": 0}
    started = time.monotonic()

    @hypothesis.settings(max_examples=45, deadline=None, database=None, derandomize=True,
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
            _refused_in_one_line(e, mutations)
            seen["refused"] += 1

    fuzz()
    assert seen["refused"] > 0
    assert time.monotonic() - started < 120


def test_mutated_tokenizer_files_load_or_are_refused_in_one_line(saved, tmp_path, monkeypatch):
    """The tokenizer as each family reads it: the text inputs' names (a plain model), the copy beside an export
    (decoders, encoder-decoders). A tokenizer that does not load is refused in one line; none eats the machine."""
    import resource

    monkeypatch.delenv("ONNXPORT_DEBUG", raising=False)
    seen = {"loaded": 0, "refused": 0}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # this worker's high-water mark so far (KiB)
    started = time.monotonic()

    @hypothesis.settings(max_examples=40, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(kind=st.sampled_from(sorted(saved)), mutations=TOKENIZER_MUTATIONS)
    def fuzz(kind, mutations):
        folder = tmp_path / "m"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(saved[kind], folder)
        _mutate_tokenizer(folder, mutations)
        try:
            if kind == "bert":
                hf._input_names(__import__("transformers"), folder, hf.hf_model(folder))
            else:
                save_tokenizer(folder, tmp_path / "out")
            seen["loaded"] += 1
        except OnnxportError as e:
            _refused_in_one_line(e, mutations)
            seen["refused"] += 1

    fuzz()
    assert seen["refused"] > 0 and seen["loaded"] > 0, seen
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 2 << 20  # KiB: no tokenizer table of GBs
    assert time.monotonic() - started < 60


def test_a_tokenizer_naming_a_huge_token_id_is_named_at_once(saved, tmp_path):
    """One id of 10^9 in tokenizer.json: saving it beside an export built a table up to it (4.5 GB, 20 s)."""
    from onnxport.sources.tokenizer_files import tokenizer_problem

    folder = tmp_path / "big-id"
    shutil.copytree(saved["llama"], folder)
    _mutate_tokenizer(folder, [("tokenizer.json", "VOCAB", 10**9)])
    started = time.monotonic()
    assert "tokenizer.json: token id 1000000000 is not valid" in (tokenizer_problem(folder) or "")
    with pytest.raises(OnnxportError, match="token id 1000000000") as e:
        save_tokenizer(folder, tmp_path / "out")
    assert e.value.exit_code == 2 and time.monotonic() - started < 5
    assert tokenizer_problem(saved["llama"]) is None and tokenizer_problem(saved["bert"]) is None


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
