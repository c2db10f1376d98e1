"""A model folder's config.json / generation_config.json checked before anything is built (issue 49)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from onnxport.core.errors import SourceError
from onnxport.sources import validate

BERT = {"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2}


def _safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header = {name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def _folder(tmp_path: Path, config: dict, generation: dict | None = None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    _safetensors(tmp_path / "model.safetensors", {"embeddings.word_embeddings.weight": [100, 32],
                                                 "encoder.layer.0.weight": [32, 32]})
    return tmp_path


@pytest.mark.parametrize(("change", "said"), [
    ({"hidden_size": "abc"}, "config.json: hidden_size = 'abc' is not valid (an integer >= 1"),
    ({"vocab_size": -5}, "config.json: vocab_size = -5 is not valid"),
    ({"type_vocab_size": -1}, "config.json: type_vocab_size = -1 is not valid (an integer >= 0"),
    ({"max_position_embeddings": 10**12}, "config.json: max_position_embeddings = 1000000000000 is not valid"),
    ({"image_size": "big"}, "config.json: image_size = 'big' is not valid"),
    ({"num_channels": 0}, "config.json: num_channels = 0"),
    ({"n_positions": -4}, "config.json: n_positions = -4"),
    ({"d_model": "32"}, "config.json: d_model = '32'"),
    ({"rope_scaling": {"rope_type": "bogus"}}, "config.json: rope_scaling.rope_type = 'bogus' is not valid"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3, "hidden_size": 32},
     "num_key_value_heads = 3 does not divide num_attention_heads = 4"),
    ({"dtype": "float128"}, "config.json: dtype = 'float128' is not valid"),
    ({"num_hidden_layers": 10**9}, "config.json: num_hidden_layers = 1000000000 is not valid"),
    ({"text_config": {"hidden_size": 1.5}}, "config.json: text_config.hidden_size = 1.5"),
    ({"layer_norm_eps": float("nan")}, "config.json: layer_norm_eps = NaN"),
])
def test_bad_config_value_is_named(tmp_path, change, said):
    with pytest.raises(SourceError) as e:
        validate.check_folder(_folder(tmp_path, {**BERT, **change}))
    assert said in e.value.message
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("change", "said"), [
    ({"repetition_penalty": "x"}, "generation_config.json: repetition_penalty = 'x' is not valid (a number > 0)"),
    ({"repetition_penalty": 0.0}, "generation_config.json: repetition_penalty = 0.0 is not valid"),
    ({"eos_token_id": [2, "x", None]}, "generation_config.json: eos_token_id = [2, \"x\", null] is not valid"),
    ({"top_p": 2}, "generation_config.json: top_p = 2"),
    ({"do_sample": "yes"}, "generation_config.json: do_sample = 'yes'"),
])
def test_bad_generation_value_is_named(tmp_path, change, said):
    with pytest.raises(SourceError) as e:
        validate.check_folder(_folder(tmp_path, BERT, {"eos_token_id": 2, **change}))
    assert said in e.value.message


def test_sane_folder_passes(tmp_path):
    validate.check_folder(_folder(tmp_path, BERT, {"eos_token_id": [1, 2], "repetition_penalty": 1.1}))


def test_config_nested_too_deep_is_one_line(tmp_path):
    folder = _folder(tmp_path, BERT)
    (folder / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(SourceError, match="nested too deep"):
        validate.check_folder(folder)


def test_config_asking_far_more_than_the_weights_hold(tmp_path):
    with pytest.raises(SourceError, match="asks for at least"):
        validate.check_folder(_folder(tmp_path, {**BERT, "hidden_size": 4096, "num_hidden_layers": 200,
                                                 "num_attention_heads": 32}))


def test_unreadable_safetensors_is_named(tmp_path):
    folder = _folder(tmp_path, BERT)
    (folder / "model.safetensors").write_bytes(b"0123456789abcdef")
    with pytest.raises(SourceError, match="model.safetensors is not a readable safetensors file"):
        validate.check_folder(folder)


def test_vocabulary_against_the_weights(tmp_path):
    folder = _folder(tmp_path, {**BERT, "vocab_size": 120})

    class Config:
        vocab_size = 120

    with pytest.raises(SourceError, match="vocab_size = 120 does not match the weights"):
        validate.check_vocabulary(Config(), folder)


def test_library_errors_become_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXPORT_DEBUG", raising=False)
    with pytest.raises(SourceError, match="cannot load the model in .*: KeyError: 'x'"), validate.loading(tmp_path):
        raise KeyError("x")
    monkeypatch.setenv("ONNXPORT_DEBUG", "1")
    with pytest.raises(KeyError), validate.loading(tmp_path):
        raise KeyError("x")
