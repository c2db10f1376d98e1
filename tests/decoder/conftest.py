"""The tiny Llama (2 layers, 4 heads over 2 key/value heads) saved once per session, and its one export with the
cache (``decoder.run`` at MAX_LENGTH), which the decoder, device-loop and device-variant tests all look at."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from onnxport import decoder

MAX_LENGTH = 40


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """The tiny Llama saved with save_pretrained."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, vocab_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def llama_outcome(llama_dir, tmp_path_factory) -> decoder.DecoderOutcome:
    """``decoder.run`` of the tiny Llama at MAX_LENGTH: model.onnx exported with its cache and proven."""
    return decoder.run(llama_dir, tmp_path_factory.mktemp("llama-out"), max_length=MAX_LENGTH)


@pytest.fixture(scope="session")
def exported_llama(llama_dir, llama_outcome, tmp_path_factory):
    """(model, layout at MAX_LENGTH, its proven model.onnx, an empty folder for what a test builds from it)."""
    model = transformers.LlamaForCausalLM.from_pretrained(llama_dir).eval()
    return model, llama_outcome.layout, llama_outcome.path, Path(tmp_path_factory.mktemp("llama-built"))
