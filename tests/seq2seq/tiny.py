"""Tiny encoder-decoders with random weights (the text and Whisper families; images, frames-first speech features
and long inputs), scaled so greedy tokens vary (random tiny models have nearly flat logits, and a head tied to the
embeddings repeats the last token). One encoder and one decoder layer, except T5's two (its tests name each layer's
cache tensors, and its files prove that the layers' caches are kept apart) and M2M100's and LED's two (with one, their
greedy tokens hardly vary)."""

from __future__ import annotations

import torch

FAMILIES = ("t5", "bart", "marian", "mbart", "pegasus", "whisper", "m2m_100")
MODALITIES = ("trocr", "donut", "speech_to_text", "led")  # images, frames-first features, long inputs
SMALL = dict(vocab_size=64, d_model=32, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
             pad_token_id=1, bos_token_id=0, eos_token_id=2, tie_word_embeddings=False)


def _bart_like(transformers, cls: str, config: str, layers: int = 1, **extra):
    cfg = getattr(transformers, config)(vocab_size=128, d_model=64, encoder_layers=layers, decoder_layers=layers,
                                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                        decoder_ffn_dim=128, max_position_embeddings=256, tie_word_embeddings=False,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                        **extra)
    return getattr(transformers, cls)(cfg)


def tiny(family: str, scale: float = 3.0, layers: int = 2):
    """A tiny ``family`` model in eval mode, its matrices multiplied by ``scale``; T5 with ``layers`` layers."""
    import transformers

    torch.manual_seed(0)
    if family == "t5":  # relative position buckets
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=layers, num_decoder_layers=layers, num_heads=4,
            decoder_start_token_id=0, tie_word_embeddings=False))
    elif family == "bart":
        model = _bart_like(transformers, "BartForConditionalGeneration", "BartConfig")
    elif family == "marian":
        model = _bart_like(transformers, "MarianMTModel", "MarianConfig", decoder_vocab_size=128)
    elif family == "mbart":
        model = _bart_like(transformers, "MBartForConditionalGeneration", "MBartConfig")
    elif family == "m2m_100":
        model = _bart_like(transformers, "M2M100ForConditionalGeneration", "M2M100Config", layers=2)
    elif family == "pegasus":
        model = _bart_like(transformers, "PegasusForConditionalGeneration", "PegasusConfig")
    elif family == "whisper":  # log-mel features in, 2 x 32 frames
        model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
            vocab_size=128, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
            max_source_positions=32, max_target_positions=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None, tie_word_embeddings=False))
    elif family in MODALITIES:
        model = _modality(transformers, family)
    else:
        raise ValueError(family)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model.eval()


def _vision(transformers, encoder, decoder, start: int):
    """A VisionEncoderDecoderModel whose config names its start, pad and end tokens, as saved checkpoints do."""
    model = transformers.VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    for config in (model.config, model.generation_config):
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = start, 1, 2
    return model


def _modality(transformers, family: str):
    """Tiny models of the other modalities: TrOCR-style (ViT + TrOCR decoder) and Donut-style (Swin + mBART
    decoder, wider than the encoder: the model projects the encoder's output) image encoders, Speech2Text's
    frames-first features, LED's long inputs with global attention."""
    if family == "trocr":
        vit = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64)
        decoder = transformers.TrOCRConfig(max_position_embeddings=64, cross_attention_hidden_size=32, **SMALL)
        return _vision(transformers, transformers.ViTModel(vit, add_pooling_layer=False),
                       transformers.TrOCRForCausalLM(decoder), 2)
    if family == "donut":
        swin = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                       window_size=4)
        decoder = transformers.MBartConfig(encoder_layers=0, max_position_embeddings=64, is_decoder=True,
                                           add_cross_attention=True, **{**SMALL, "d_model": 48})
        return _vision(transformers, transformers.SwinModel(swin), transformers.MBartForCausalLM(decoder), 0)
    if family == "speech_to_text":  # 8 features per frame, two stride-2 convolutions: 4 frames per position
        return transformers.Speech2TextForConditionalGeneration(transformers.Speech2TextConfig(
            encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, max_source_positions=64,
            max_target_positions=64, input_feat_per_channel=8, input_channels=1, conv_channels=16,
            num_conv_layers=2, conv_kernel_sizes=(5, 5), decoder_start_token_id=2, **SMALL))
    return transformers.LEDForConditionalGeneration(transformers.LEDConfig(  # attention window of 8 tokens
        encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, max_encoder_position_embeddings=128,
        max_decoder_position_embeddings=64, attention_window=[8, 8], decoder_start_token_id=2,
        **{**SMALL, "decoder_layers": 2}))
