"""Every Hugging Face directory as it is saved: one tiny model per model type (random weights, no tokenizer or
preprocessor files), saved with save_pretrained() and exported through the CLI with no --input. Each must exit
0 with report.json saying proven, a dynamic dim proven at two sizes or more, and the inputs made up from the
model itself. A second test saves processor files beside a model: their sizes, rates and names are used."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers as T

from onnxport.api import load_model
from tests.conftest import load_report

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
TEXT = dict(vocab_size=99, max_position_embeddings=64, **TINY)
VIT = dict(image_size=32, patch_size=8, **TINY)
# strides of 8 x 8: one second of audio (the default range's top) is 250 frames, not 1,600, for attention to run over
AUDIO = dict(conv_dim=(16, 16), conv_stride=(8, 8), conv_kernel=(8, 8), num_conv_pos_embeddings=16,
             num_conv_pos_embedding_groups=2, **TINY)
TOWERS = dict(text_config=TEXT, vision_config=VIT)
EFFICIENT = dict(image_size=32, width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=32)
BACKBONE = dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", out_features=["stage2"],
                downsample_in_first_stage=True)  # features at 1/16 of the 224 x 224 image: 196 tokens, not 784
DETR = dict(use_timm_backbone=False, use_pretrained_backbone=False, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37,
            num_queries=5)
LONG = 128  # generation models hold the decoder path's default --max-length (128 tokens)
SEQ2SEQ = dict(vocab_size=99, max_position_embeddings=LONG, d_model=32, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37)
GPT2 = dict(vocab_size=99, n_positions=64, n_embd=32, n_layer=1, n_head=2)

IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"
TEXT_IN = (IDS, MASK, TYPES)
PIXELS = ("pixel_values",)
AUDIO_IN = ("input_values",)
BOTH = (IDS, MASK, "pixel_values")
DETECT = ("pixel_values", "pixel_mask")
CAUSAL = "decoder"  # exported with its KV cache (report.json's `decoder` section)
ENC_DEC = "seq2seq"  # three files with their cache (report.json's `seq2seq` section)


def _lively(model: torch.nn.Module) -> torch.nn.Module:
    """Standard conv / norm initialisation: transformers' own random init makes deep tiny conv stacks (EfficientNet,
    MobileViT) vanish to 0, an output that cannot tell a right file from a wrong one."""
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight)
        elif isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)) and m.weight is not None:
            torch.nn.init.ones_(m.weight)
    return model


# model type -> (the model, the inputs report.json's export lists, or the generation section that replaces them)
MATRIX: dict[str, tuple[Callable[[], torch.nn.Module], tuple[str, ...] | str]] = {
    # text
    "bert": (lambda: T.BertForSequenceClassification(T.BertConfig(**TEXT)), TEXT_IN),
    "roberta": (lambda: T.RobertaForTokenClassification(T.RobertaConfig(**TEXT)), TEXT_IN),
    "distilbert": (lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(
        vocab_size=99, max_position_embeddings=64, dim=32, n_layers=1, n_heads=2, hidden_dim=37)), (IDS, MASK)),
    "albert": (lambda: T.AlbertForMaskedLM(T.AlbertConfig(embedding_size=16, **TEXT)), TEXT_IN),
    "electra": (lambda: T.ElectraForSequenceClassification(T.ElectraConfig(embedding_size=16, **TEXT)), TEXT_IN),
    "deberta-v2": (lambda: T.DebertaV2ForSequenceClassification(T.DebertaV2Config(**TEXT)), TEXT_IN),
    "xlm-roberta": (lambda: T.XLMRobertaForQuestionAnswering(T.XLMRobertaConfig(**TEXT)), TEXT_IN),
    "mpnet": (lambda: T.MPNetModel(T.MPNetConfig(**TEXT)), (IDS, MASK)),
    "convbert": (lambda: T.ConvBertModel(T.ConvBertConfig(embedding_size=16, **TEXT)), TEXT_IN),
    "layoutlm": (lambda: T.LayoutLMForTokenClassification(T.LayoutLMConfig(**TEXT)), (IDS, "bbox", MASK, TYPES)),
    # vision
    "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(**VIT)), PIXELS),
    "deit": (lambda: T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**VIT)), PIXELS),
    "beit": (lambda: T.BeitForImageClassification(T.BeitConfig(**VIT)), PIXELS),
    "dinov2": (lambda: T.Dinov2Model(T.Dinov2Config(**VIT)), PIXELS),
    "convnext": (lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
        hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)), PIXELS),
    "resnet": (lambda: T.ResNetForImageClassification(T.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")), PIXELS),
    "swin": (lambda: T.SwinForImageClassification(T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)), PIXELS),
    "mobilevit": (lambda: _lively(T.MobileViTForImageClassification(T.MobileViTConfig(
        image_size=32, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 8, 8, 8, 8, 16],
        num_attention_heads=2))), PIXELS),
    "efficientnet": (lambda: _lively(T.EfficientNetForImageClassification(T.EfficientNetConfig(
        **{**EFFICIENT, "hidden_dim": 128}))),  # the width of its top conv: 1280 x 0.1
                     PIXELS),
    "regnet": (lambda: T.RegNetForImageClassification(T.RegNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8)), PIXELS),
    # audio
    "wav2vec2": (lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(vocab_size=32, **AUDIO)), AUDIO_IN),
    "hubert": (lambda: T.HubertForSequenceClassification(T.HubertConfig(num_labels=3, **AUDIO)), AUDIO_IN),
    "wavlm": (lambda: T.WavLMForSequenceClassification(T.WavLMConfig(
        num_labels=3, num_buckets=16, max_bucket_distance=32, **AUDIO)), AUDIO_IN),
    "whisper-encoder": (lambda: T.WhisperForAudioClassification(T.WhisperConfig(
        num_mel_bins=16, max_source_positions=16, vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37)),
        ("input_features",)),
    # image-text
    "clip": (lambda: T.CLIPModel(T.CLIPConfig(projection_dim=16, **TOWERS)), BOTH),
    "siglip": (lambda: T.SiglipModel(T.SiglipConfig(**TOWERS)), BOTH),
    "align": (lambda: _lively(T.AlignModel(T.AlignConfig(text_config=TEXT, vision_config=EFFICIENT,
                                                          projection_dim=32))), (IDS, MASK, TYPES, "pixel_values")),
    "blip": (lambda: T.BlipModel(T.BlipConfig(projection_dim=16, **TOWERS)), BOTH),
    "vision-encoder-decoder": (lambda: T.VisionEncoderDecoderModel(
        encoder=T.ViTModel(T.ViTConfig(**VIT)),
        decoder=T.GPT2LMHeadModel(T.GPT2Config(add_cross_attention=True, is_decoder=True, **GPT2))),
        ("pixel_values", "decoder_input_ids")),
    # detection
    "detr": (lambda: T.DetrForObjectDetection(T.DetrConfig(backbone_config=T.ResNetConfig(**BACKBONE), **DETR)),
             DETECT),
    "conditional-detr": (lambda: T.ConditionalDetrForObjectDetection(T.ConditionalDetrConfig(
        backbone_config=T.ResNetConfig(**BACKBONE), **DETR)), DETECT),
    "yolos": (lambda: T.YolosForObjectDetection(T.YolosConfig(
        image_size=[32, 32], patch_size=8, num_detection_tokens=5, **TINY)), PIXELS),
    # generation: the decoder / encoder-decoder export with the cache
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(**{**GPT2, "n_positions": LONG})), CAUSAL),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=99, max_position_embeddings=LONG, num_key_value_heads=1, **TINY)), CAUSAL),
    "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(  # the start, pad and end tokens real T5 configs name
        vocab_size=99, d_model=32, d_kv=16, d_ff=37, num_layers=1, num_heads=2, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1)), ENC_DEC),
    "bart": (lambda: T.BartForConditionalGeneration(T.BartConfig(**SEQ2SEQ)), ENC_DEC),
}

XFAIL: dict[str, str] = {}  # model type -> why it cannot be proven yet


def _save(name: str, root: Path) -> Path:
    torch.manual_seed(0)
    model = MATRIX[name][0]()
    model.save_pretrained(root / name)
    return root / name


def _params() -> list:
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=XFAIL[n])) if n in XFAIL else n
            for n in MATRIX]


@pytest.mark.slow
@pytest.mark.parametrize("name", _params())
def test_saved_directory_is_exported_and_proven(name, tmp_path, monkeypatch, capsys):
    """`onnxport export hf:DIR -o OUT`, nothing else: exit 0, proven, a dim proven at two sizes or more. The
    command runs in this process (the CLI's own entry point; a new interpreter per model would add seconds of
    imports to each of the many rows)."""
    from onnxport.cli import main

    folder = _save(name, tmp_path)
    monkeypatch.setattr(sys, "argv", ["onnxport", "export", f"hf:{folder}", "-o", str(tmp_path / "out")])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_info:
        main()
    said = capsys.readouterr()
    assert exit_info.value.code == 0, said.out[-3000:] + said.err[-3000:]
    rep = load_report(tmp_path / "out")
    assert rep["status"] == "ok", rep["summary"]
    expected = MATRIX[name][1]
    if isinstance(expected, str):  # generation: step cases and greedy generation proven against PyTorch
        proof = rep[expected]["proof"]
        assert proof["passed"] and all(c["passed"] for c in proof["cases"]), proof
        sizes = {k: {c[k] for c in proof["cases"]} for k in ("batch", "source", "past", "new") if k in proof["cases"][0]}
        assert max(len(v) for v in sizes.values()) >= 2, sizes  # a dim proven at two sizes or more
        return
    assert [i["name"] for i in rep["export"]["inputs"]] == list(expected)
    dims = rep["check"]["dynamic_dims"]
    assert dims and all(d["proven"] for d in dims), dims
    assert any(len(d["sizes_passed"]) >= 2 for d in dims), dims


# --------------------------------------------------------------------------- processor files beside the model


def test_processor_files_give_the_inputs(tmp_path, minilm_dir):
    """Files saved beside the model decide what the config alone cannot: the tokenizer's input names and
    longest text, the image processor's size (a conv net has no image_size), the feature extractor's rate."""
    torch.manual_seed(0)
    bert = tmp_path / "bert"
    T.BertModel(T.BertConfig(**TEXT)).save_pretrained(bert)
    T.AutoTokenizer.from_pretrained(str(minilm_dir), model_max_length=24).save_pretrained(bert)
    loaded = load_model(f"hf:{bert}")
    assert [s.name for s in loaded.inputs] == [IDS, MASK, TYPES]
    assert (loaded.dims["seq"].min, loaded.dims["seq"].max) == (1, 24)  # the tokenizer's model_max_length

    pairs = tmp_path / "no-types"  # a tokenizer that makes no token_type_ids: none are made up
    T.BertModel(T.BertConfig(**TEXT)).save_pretrained(pairs)
    T.AutoTokenizer.from_pretrained(str(minilm_dir), model_input_names=[IDS, MASK]).save_pretrained(pairs)
    assert [s.name for s in load_model(f"hf:{pairs}").inputs] == [IDS, MASK]

    resnet = _save("resnet", tmp_path)
    T.ViTImageProcessor(size={"height": 40, "width": 48}).save_pretrained(resnet)
    assert [str(s) for s in load_model(f"hf:{resnet}").inputs] == ["pixel_values:float32[batch,3,40,48]"]

    regnet = _save("regnet", tmp_path)  # resized to 64 on the short side, then cropped to 64 x 64
    T.ConvNextImageProcessor(size={"shortest_edge": 64}).save_pretrained(regnet)
    assert [str(s) for s in load_model(f"hf:{regnet}").inputs] == ["pixel_values:float32[batch,3,64,64]"]

    detr = _save("detr", tmp_path)
    T.DetrImageProcessor(size={"height": 48, "width": 64}).save_pretrained(detr)
    assert [str(s) for s in load_model(f"hf:{detr}").inputs] == \
        ["pixel_values:float32[batch,3,48,64]", "pixel_mask:int64[batch,48,64]{0..1}"]

    wav = _save("wav2vec2", tmp_path)
    T.Wav2Vec2FeatureExtractor(sampling_rate=8000).save_pretrained(wav)
    assert load_model(f"hf:{wav}").dims["samples"].max == 8000  # one second at the extractor's rate


# --------------------------------------------------------------------------- inputs it cannot make up, boxes


def test_a_required_input_it_cannot_make_up_is_exit_2_with_the_lines_to_write():
    """A forward argument without a default that onnxport cannot make up: exit 2 naming it, and since an
    --input replaces every input made up, the hint gives the lines of those it can make up too."""
    from onnxport.core.errors import SourceError
    from onnxport.sources import hf

    class Pointer(T.BertPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.embed = torch.nn.Embedding(config.vocab_size, 4)
            self.post_init()

        def forward(self, points, input_ids=None, attention_mask=None):
            return self.embed(input_ids) + points

    with pytest.raises(SourceError, match="cannot make up the input 'points' of Pointer") as e:
        hf._input_names(T, Path("/nonexistent"), Pointer(T.BertConfig(**TEXT)))
    assert "-i 'input_ids:int64[batch,seq]{0..98}' -i 'attention_mask:int64[batch,seq]{0..1}'" in e.value.hint
    assert "-i 'points:float32[batch,...]'" in e.value.hint


def test_layout_models_get_boxes(tmp_path):
    folder = _save("layoutlm", tmp_path)
    assert "bbox:int64[batch,seq,4]{0..1000}" in [str(s) for s in load_model(f"hf:{folder}").inputs]
