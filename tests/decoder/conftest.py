"""The tiny Llama the device-loop and device-variant tests share, exported with its cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from onnxport.decoder import cache_layout, export_decoder

MAX_LENGTH = 40


@pytest.fixture(scope="module")
def exported_llama(tmp_path_factory):
    """(model, layout at MAX_LENGTH, decoder.onnx, its folder): 2 layers, 4 heads over 2 key/value heads."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, vocab_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    layout = cache_layout(model, MAX_LENGTH)
    folder = Path(tmp_path_factory.mktemp("llama"))
    return model, layout, export_decoder(model, layout, folder / "decoder.onnx").path, folder
