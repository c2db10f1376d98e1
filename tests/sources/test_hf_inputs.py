"""Hugging Face directories as saved, with no --input: the inputs come from the model itself (its forward, its
main input, its config and processor files), for audio, image-text and text models; an input onnxport cannot
make up is exit 2 naming it, with the --input line to write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T

from onnxport.api import load_model
from tests.conftest import load_report
from tests.fixtures.in_process import run_cli_here

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
CONV = dict(conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2)
WIDE = dict(CONV, conv_stride=(8, 8), conv_kernel=(8, 8))  # one second of audio in 250 frames, not 1,600
TOWERS = dict(text_config=dict(vocab_size=99, max_position_embeddings=32, **TINY),
              vision_config=dict(image_size=32, patch_size=8, **TINY))


def _models() -> dict:
    return {
        "wav2vec2-ctc": lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(vocab_size=32, **TINY, **CONV)),
        "hubert-cls": lambda: T.HubertForSequenceClassification(T.HubertConfig(num_labels=3, **TINY, **WIDE)),
        "clip": lambda: T.CLIPModel(T.CLIPConfig(projection_dim=16, **TOWERS)),
        "siglip": lambda: T.SiglipModel(T.SiglipConfig(**TOWERS)),
    }


EXPECTED = {  # name -> the inputs made up, as `onnxport export` prints them
    "wav2vec2-ctc": ["input_values:float32[batch,samples]"],
    "hubert-cls": ["input_values:float32[batch,samples]"],
    "clip": ["input_ids:int64[batch,seq]{0..98}", "attention_mask:int64[batch,seq]{0..1}",
             "pixel_values:float32[batch,3,32,32]"],
    "siglip": ["input_ids:int64[batch,seq]{0..98}", "attention_mask:int64[batch,seq]{0..1}",
               "pixel_values:float32[batch,3,32,32]"],
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_inputs")
    torch.manual_seed(0)
    for name, make in _models().items():
        make().save_pretrained(root / name)
    return root


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inputs_come_from_the_model(saved, name):
    loaded = load_model(f"hf:{saved / name}")
    assert [str(s) for s in loaded.inputs] == EXPECTED[name]


def test_the_shortest_audio_is_what_the_conv_stack_takes(saved, tmp_path):
    """wav2vec2's samples range starts at the shortest input its conv feature extractor turns into two frames,
    and ends at one second at the feature extractor's sampling rate (preprocessor_config.json when present)."""
    loaded = load_model(f"hf:{saved / 'wav2vec2-ctc'}")
    assert (loaded.dims["samples"].min, loaded.dims["samples"].max) == (30, 16000)  # (2-1)*2+3 -> *5+10 = 30
    with torch.inference_mode():
        loaded.flat(torch.randn(1, 30))
    d = tmp_path / "w"
    T.Wav2Vec2ForCTC(T.Wav2Vec2Config(vocab_size=32, **TINY, **CONV)).save_pretrained(d)
    (d / "preprocessor_config.json").write_text(json.dumps({"sampling_rate": 8000, "feature_size": 1}))
    assert load_model(f"hf:{d}").dims["samples"].max == 8000


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hubert-cls", "clip"])
def test_exported_from_the_directory_and_proven(saved, tmp_path, name, monkeypatch, capsys):
    r = run_cli_here(monkeypatch, capsys, "export", f"hf:{saved / name}", "-o", str(tmp_path / name))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = load_report(tmp_path / name)
    assert rep["status"] == "ok" and all(d["proven"] for d in rep["check"]["dynamic_dims"])


def test_an_input_it_cannot_make_up_is_exit_2_with_the_line_to_write():
    class Points(T.PreTrainedModel):
        config_class = T.BertConfig
        main_input_name = "input_points"

        def __init__(self, config):
            super().__init__(config)
            self.fc = torch.nn.Linear(2, 2)
            self.post_init()

        def forward(self, input_points=None):
            return self.fc(input_points)

    from onnxport.core.errors import SourceError
    from onnxport.sources import hf

    with pytest.raises(SourceError, match="cannot make up the input 'input_points'") as e:  # SourceError: exit 2
        hf._input_names(T, Path("/nonexistent"), Points(T.BertConfig(**TINY)))
    assert "-i 'input_points:" in e.value.hint
