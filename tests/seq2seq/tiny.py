"""Tiny encoder-decoders with random weights, scaled so greedy tokens vary (random tiny models have nearly flat
logits, and a head tied to the embeddings repeats the last token)."""

from __future__ import annotations

import torch

FAMILIES = ("t5", "bart", "marian", "mbart", "pegasus", "whisper", "m2m_100")


def _bart_like(transformers, cls: str, config: str, **extra):
    cfg = getattr(transformers, config)(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                        decoder_ffn_dim=128, max_position_embeddings=256, tie_word_embeddings=False,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                        **extra)
    return getattr(transformers, cls)(cfg)


def tiny(family: str, scale: float = 3.0):
    """A tiny ``family`` model in eval mode, its matrices multiplied by ``scale``."""
    import transformers

    torch.manual_seed(0)
    if family == "t5":  # relative position buckets
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=0, tie_word_embeddings=False))
    elif family == "bart":
        model = _bart_like(transformers, "BartForConditionalGeneration", "BartConfig")
    elif family == "marian":
        model = _bart_like(transformers, "MarianMTModel", "MarianConfig", decoder_vocab_size=128)
    elif family == "mbart":
        model = _bart_like(transformers, "MBartForConditionalGeneration", "MBartConfig")
    elif family == "m2m_100":
        model = _bart_like(transformers, "M2M100ForConditionalGeneration", "M2M100Config")
    elif family == "pegasus":
        model = _bart_like(transformers, "PegasusForConditionalGeneration", "PegasusConfig")
    elif family == "whisper":  # log-mel features in, 2 x 32 frames
        model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
            vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
            max_source_positions=32, max_target_positions=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None, tie_word_embeddings=False))
    else:
        raise ValueError(family)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model.eval()
