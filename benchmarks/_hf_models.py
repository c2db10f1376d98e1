"""Hugging Face model types beyond the test matrix (tests/sources/test_hf_matrix.py), each a tiny config with
random weights saved with save_pretrained() (no tokenizer or processor files, nothing downloaded) and exported
as ``hf:DIR`` with no ``--input``: what a user's saved folder of that type gets. ``benchmarks/catalogue.py
--library hf`` sweeps every entry of ``MODELS``; ``save(name, folder)`` writes one folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
TEXT = dict(vocab_size=99, max_position_embeddings=64, **TINY)
VIT = dict(image_size=32, patch_size=8, **TINY)
AUDIO = dict(conv_dim=(16, 16), conv_stride=(8, 8), conv_kernel=(8, 8), num_conv_pos_embeddings=16,
             num_conv_pos_embedding_groups=2, **TINY)
SEQ2SEQ = dict(vocab_size=99, max_position_embeddings=128, d_model=32, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37)
CAUSAL = dict(vocab_size=99, max_position_embeddings=128, **TINY)


def _m(cls: str, config: str, **kw) -> Callable[[], object]:
    """A factory: transformers' ``cls`` built from ``config(**kw)`` (nested dicts stay dicts: the config builds them)."""
    def build():
        import transformers as T

        return getattr(T, cls)(getattr(T, config)(**kw))
    return build


MODELS: dict[str, Callable[[], object]] = {
    # text
    "camembert": _m("CamembertForSequenceClassification", "CamembertConfig", **TEXT),
    "deberta": _m("DebertaForSequenceClassification", "DebertaConfig", **TEXT),
    "funnel": _m("FunnelForSequenceClassification", "FunnelConfig", vocab_size=99, block_sizes=[1, 1],
                 d_model=32, n_head=2, d_head=16, d_inner=37),
    "mobilebert": _m("MobileBertForSequenceClassification", "MobileBertConfig", embedding_size=16,
                     intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=1, **TEXT),
    "squeezebert": _m("SqueezeBertForSequenceClassification", "SqueezeBertConfig", embedding_size=32,
                       **{**TEXT, "intermediate_size": 64}),  # its grouped convs: sizes divisible by 4
    "roformer": _m("RoFormerForSequenceClassification", "RoFormerConfig", embedding_size=32, **TEXT),
    "ernie": _m("ErnieForSequenceClassification", "ErnieConfig", **TEXT),
    "modernbert": _m("ModernBertForSequenceClassification", "ModernBertConfig", vocab_size=99,
                     max_position_embeddings=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=37, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                     sep_token_id=2),
    "esm": _m("EsmForSequenceClassification", "EsmConfig", pad_token_id=1, mask_token_id=2, **TEXT),
    "xlnet": _m("XLNetForSequenceClassification", "XLNetConfig", vocab_size=99, d_model=32, n_layer=1, n_head=2,
                d_inner=37),
    # as the published checkpoints set them: landmarks = segment length (else it runs at that one length only)
    "nystromformer": _m("NystromformerForSequenceClassification", "NystromformerConfig", num_landmarks=16,
                        segment_means_seq_len=16, **TEXT),
    # vision
    "levit": _m("LevitForImageClassification", "LevitConfig", image_size=64, hidden_sizes=[16, 32, 48],
                num_attention_heads=[1, 2, 3], depths=[1, 1, 1], key_dim=[8, 8, 8]),
    "cvt": _m("CvtForImageClassification", "CvtConfig", embed_dim=[16, 32, 48], num_heads=[1, 2, 3],
              depth=[1, 2, 3]),  # its stage i reads drop-path rate i of its own depth
    "poolformer": _m("PoolFormerForImageClassification", "PoolFormerConfig", hidden_sizes=[8, 16, 32, 64],
                     depths=[1, 1, 1, 1]),
    "pvt_v2": _m("PvtV2ForImageClassification", "PvtV2Config", hidden_sizes=[16, 32, 48, 64],
                 depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 3, 4]),
    "segformer": _m("SegformerForSemanticSegmentation", "SegformerConfig", hidden_sizes=[16, 32, 48, 64],
                    depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 3, 4], decoder_hidden_size=32),
    "mobilenet_v2": _m("MobileNetV2ForImageClassification", "MobileNetV2Config", depth_multiplier=0.35,
                       image_size=64),
    "bit": _m("BitForImageClassification", "BitConfig", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
              num_groups=2),
    "focalnet": _m("FocalNetForImageClassification", "FocalNetConfig", embed_dim=16, depths=[1, 1],
                   image_size=64),
    "swinv2": _m("Swinv2ForImageClassification", "Swinv2Config", image_size=32, patch_size=4, embed_dim=16,
                 depths=[1, 1], num_heads=[2, 2], window_size=4),
    "convnextv2": _m("ConvNextV2ForImageClassification", "ConvNextV2Config", hidden_sizes=[8, 16], depths=[1, 1],
                     num_stages=2, image_size=32),
    "hiera": _m("HieraForImageClassification", "HieraConfig", embed_dim=8, image_size=[64, 64],
                patch_size=[7, 7], patch_stride=[4, 4], patch_padding=[3, 3], depths=[1, 1], num_heads=[1, 2],
                embed_dim_multiplier=2.0, num_query_pool=1, query_stride=[2, 2], masked_unit_size=[8, 8],
                mask_unit_attn=[True, False]),
    "data2vec-vision": _m("Data2VecVisionForImageClassification", "Data2VecVisionConfig", **VIT),
    "vit_msn": _m("ViTMSNForImageClassification", "ViTMSNConfig", **VIT),
    "dpt": _m("DPTForDepthEstimation", "DPTConfig", image_size=32, patch_size=8, hidden_size=32,
              num_hidden_layers=4, num_attention_heads=2, intermediate_size=37, backbone_out_indices=[0, 1, 2, 3],
              neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16, head_in_index=-1),
    "glpn": _m("GLPNForDepthEstimation", "GLPNConfig", hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
               num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=16),
    # audio
    "sew": _m("SEWForSequenceClassification", "SEWConfig", num_labels=3, squeeze_factor=2, **AUDIO),
    "unispeech-sat": _m("UniSpeechSatForSequenceClassification", "UniSpeechSatConfig", num_labels=3, **AUDIO),
    "data2vec-audio": _m("Data2VecAudioForSequenceClassification", "Data2VecAudioConfig", num_labels=3,
                         **{**AUDIO, "num_conv_pos_embeddings": 5}),
    "wav2vec2-conformer": _m("Wav2Vec2ConformerForSequenceClassification", "Wav2Vec2ConformerConfig",
                             num_labels=3, **AUDIO),
    "audio-spectrogram-transformer": _m("ASTForAudioClassification", "ASTConfig", max_length=64,
                                        num_mel_bins=16, patch_size=8, **TINY),
    "clap": _m("ClapModel", "ClapConfig", projection_dim=16,
               text_config=dict(**TEXT), audio_config=dict(spec_size=64, window_size=4, num_mel_bins=16,
                                                           patch_embeds_hidden_size=16, hidden_size=32,
                                                           depths=[1, 1], num_attention_heads=[2, 2],
                                                           patch_stride=(4, 4), patch_size=4)),
    # video
    "videomae": _m("VideoMAEForVideoClassification", "VideoMAEConfig", num_frames=4, tubelet_size=2, **VIT),
    "timesformer": _m("TimesformerForVideoClassification", "TimesformerConfig", num_frames=2, **VIT),
    "vivit": _m("VivitForVideoClassification", "VivitConfig", num_frames=4, tubelet_size=[2, 8, 8],
                image_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37),
    # image-text
    "owlvit": _m("OwlViTModel", "OwlViTConfig", projection_dim=16, text_config=dict(**TEXT),
                 vision_config=dict(**VIT)),
    "groupvit": _m("GroupViTModel", "GroupViTConfig", projection_dim=16, projection_intermediate_dim=16,
                   text_config=dict(**TEXT), vision_config=dict(image_size=32, patch_size=8, hidden_size=32,
                                                                 depths=[1, 1, 1], num_group_tokens=[8, 4, 0],
                                                                 num_output_groups=[8, 4, 4],
                                                                 num_attention_heads=2, intermediate_size=37)),
    "chinese_clip": _m("ChineseCLIPModel", "ChineseCLIPConfig", projection_dim=16, text_config=dict(**TEXT),
                       vision_config=dict(**VIT)),
    "siglip2": _m("Siglip2Model", "Siglip2Config", text_config=dict(**TEXT),
                  vision_config=dict(num_patches=16, patch_size=8, **TINY)),
    # detection
    "table-transformer": _m("TableTransformerForObjectDetection", "TableTransformerConfig",
                            use_timm_backbone=False, use_pretrained_backbone=False,
                            backbone_config=dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16],
                                                 depths=[1, 1], layer_type="basic", out_features=["stage2"],
                                                 downsample_in_first_stage=True),
                            d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                            decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, num_queries=5),
    # generation (the decoder / encoder-decoder path)
    "opt": _m("OPTForCausalLM", "OPTConfig", vocab_size=99, max_position_embeddings=128, hidden_size=32,
              num_hidden_layers=1, num_attention_heads=2, ffn_dim=37, word_embed_proj_dim=32),
    "gptj": _m("GPTJForCausalLM", "GPTJConfig", vocab_size=99, n_positions=128, n_embd=32, n_layer=1, n_head=2,
               rotary_dim=8),
    "falcon": _m("FalconForCausalLM", "FalconConfig", vocab_size=99, hidden_size=32, num_hidden_layers=1,
                 num_attention_heads=2, max_position_embeddings=128),
    "stablelm": _m("StableLmForCausalLM", "StableLmConfig", num_key_value_heads=1, **CAUSAL),
    "mistral": _m("MistralForCausalLM", "MistralConfig", num_key_value_heads=1, **CAUSAL),
    "qwen2": _m("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=1, **CAUSAL),
    "codegen": _m("CodeGenForCausalLM", "CodeGenConfig", vocab_size=99, n_positions=128, n_ctx=128, n_embd=32,
                  n_layer=1, n_head=4, rotary_dim=4, bos_token_id=0, eos_token_id=1),  # heads split in 4 (mp_num)
    "gpt_bigcode": _m("GPTBigCodeForCausalLM", "GPTBigCodeConfig", vocab_size=99, n_positions=128, n_embd=32,
                      n_layer=1, n_head=2),
    "mbart": _m("MBartForConditionalGeneration", "MBartConfig", decoder_start_token_id=2, **SEQ2SEQ),
    "pegasus": _m("PegasusForConditionalGeneration", "PegasusConfig", **SEQ2SEQ),
    "marian": _m("MarianMTModel", "MarianConfig", decoder_start_token_id=0, pad_token_id=0, **SEQ2SEQ),
    "m2m_100": _m("M2M100ForConditionalGeneration", "M2M100Config", **SEQ2SEQ),
    "mt5": _m("MT5ForConditionalGeneration", "MT5Config", vocab_size=99, d_model=32, d_kv=16, d_ff=37,
              num_layers=1, num_heads=2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
}


def save(name: str, folder: Path) -> Path:
    """The tiny ``name`` model with random weights (seed 0) saved to ``folder``."""
    import torch

    torch.manual_seed(0)
    model = MODELS[name]()
    model.save_pretrained(folder)
    return folder
