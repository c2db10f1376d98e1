"""An opset that runs: when onnxruntime cannot load or run the export at the newest opset, auto goes down."""

from __future__ import annotations

import onnx
import pytest

from tests.conftest import load_report, run_cli


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("llama") / "tiny"
    transformers.LlamaModel(cfg).save_pretrained(path)  # the base model: no KV-cache path, the plain export
    return path


@pytest.mark.slow
def test_rotary_embedding_refused_at_run_time_falls_back_to_an_opset_that_runs(tiny_llama, tmp_path):
    out = tmp_path / "o"
    proc = run_cli("export", f"hf:{tiny_llama}", "-d", "seq=1..64", "-o", str(out))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    rep = load_report(out)
    attempts = rep["export"]["attempts"]
    refused = [a for a in attempts if not a["ok"] and "cannot run the opset-" in (a["error"] or "")]
    kept = [a for a in attempts if a["ok"]]
    assert refused and refused[0]["exporter"] == "dynamo" and "RotaryEmbedding" in refused[0]["error"]
    assert kept and kept[0]["exporter"] == "dynamo" and kept[0]["opset"] < refused[0]["opset"]
    assert "could not run the opset-" in kept[0]["note"]
    model = next(out.glob("model*.onnx"))
    opset = next(o.version for o in onnx.load(model, load_external_data=False).opset_import if o.domain == "")
    assert opset == kept[0]["opset"] == rep["export"]["opset"]
    assert not any("onnxruntime fails" in (c["error"] or "") for c in rep["validation"]["cases"])  # runs everywhere
