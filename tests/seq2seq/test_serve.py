"""Triton's generate extension for a text-to-text encoder-decoder: the T5 export (its three files, report.json
and a tiny local tokenizer beside them) served for real and driven over HTTP."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnxport import seq2seq
from onnxport.serve import serve_app
from tests.seq2seq.tiny import tiny
from tests.serve.test_generate import _events, _tokenizer
from tests.serve.test_serve import post, running

SOURCE = "the quick brown fox jumps"


@pytest.mark.slow
def test_generate_answers_text_for_text(t5_out):
    tok = _tokenizer(None)
    ids = np.array([tok.encode(SOURCE)])
    layout = seq2seq.Seq2SeqLayout.from_dict(json.loads((t5_out / "report.json").read_text())["seq2seq"]["layout"])
    want = seq2seq.generate_greedy(seq2seq.open_sessions(t5_out), layout, [ids, np.ones_like(ids)], 12)[0]
    with running(serve_app(t5_out)) as url:
        body = {"text_input": SOURCE, "parameters": {"max_tokens": 12, "ignore_eos": True}}
        status, _, raw = post(url, "/v2/models/t5/generate", json.dumps(body).encode())
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer["output_ids"] == [int(t) for t in want] and answer["finish_reason"] == "length"
        assert answer["text_output"] == tok.decode(want.tolist(), skip_special_tokens=True)
        events = _events(url, body, model="t5")
        assert [t for _, e in events for t in e["output_ids"]] == answer["output_ids"]
        assert events[-1][1]["final"] and "".join(e.get("text_output", "") for _, e in events) == answer["text_output"]
        status, _, raw = post(url, "/v2/models/t5/generate", json.dumps(
            {"input_ids": ids[0].tolist(), "parameters": {"max_tokens": 30}}).encode())
        assert status == 400 and b"24 decoder tokens" in raw


def _with_variant(t5_out, tmp_path):
    """A copy of the T5 folder whose report names ``int8`` (weight-only MatMulNBits of the three files, built in
    variants/int8/) as the best variant, as convert records it when that variant decodes fastest."""
    import shutil

    from onnxport.decoder.variants import build_nbits

    out = tmp_path / "t5"
    shutil.copytree(t5_out, out)
    folder = out / "variants" / "int8"
    folder.mkdir(parents=True)
    for name in seq2seq.FILES:
        build_nbits(out / name, folder / name, 8)
    rep = json.loads((out / "report.json").read_text())
    rep["seq2seq"]["variants"] = {"best": "int8", "variants": [{"name": "export"}, {"name": "int8"}]}
    (out / "report.json").write_text(json.dumps(rep))
    return out, seq2seq.Seq2SeqLayout.from_dict(rep["seq2seq"]["layout"])


@pytest.mark.slow
def test_the_best_variant_is_served(t5_out, tmp_path):
    from onnxport.serve.models import discover

    out, layout = _with_variant(t5_out, tmp_path)
    assert discover(out)[0].onnx_path == out / "variants" / "int8" / "decoder_with_past_model.onnx"
    rng = np.random.default_rng(3)
    sources = [rng.integers(3, 128, (1, n)) for n in (5, 9, 13, 17)]
    wants = [seq2seq.generate_greedy(seq2seq.open_sessions(out / "variants" / "int8", paths=[
        out / "variants" / "int8" / f for f in seq2seq.FILES]), layout, [s, np.ones_like(s)], 16)[0] for s in sources]
    proven = [seq2seq.generate_greedy(seq2seq.open_sessions(out), layout, [s, np.ones_like(s)], 16)[0]
              for s in sources]
    assert any(not np.array_equal(w, p) for w, p in zip(wants, proven))  # the variant's files answer otherwise
    with running(serve_app(out)) as url:
        for source, want in zip(sources, wants):
            body = {"input_ids": source[0].tolist(), "parameters": {"max_tokens": 16, "ignore_eos": True}}
            status, _, raw = post(url, "/v2/models/t5/generate", json.dumps(body).encode())
            assert status == 200, raw
            assert json.loads(raw)["output_ids"] == [int(t) for t in want]
    (out / "variants" / "int8" / "decoder_model.onnx").unlink()  # a variant folder that lost a file: the proven files
    assert discover(out)[0].onnx_path == out / "decoder_with_past_model.onnx"


def test_the_text_model_refuses_speech_fields(t5_out):
    with running(serve_app(t5_out)) as url:
        status, _, raw = post(url, "/v2/models/t5/generate", json.dumps({"input_features": [[0.0]]}).encode())
    assert status == 400 and b"text_input" in raw


def test_generate_equals_pytorch_generate(t5_out):
    """The served tokens are model.generate's (greedy, up to its end-of-sequence token, which ends the answer)."""
    import torch

    model = tiny("t5")
    ids = np.array([[5, 17, 33, 9, 60, 2, 44]])
    with torch.inference_mode():
        want = model.generate(input_ids=torch.from_numpy(ids), do_sample=False, max_new_tokens=12)[0, 1:].tolist()
    eos = model.generation_config.eos_token_id
    want = want[:want.index(eos)] if eos in want else want
    with running(serve_app(t5_out)) as url:
        body = {"input_ids": ids[0].tolist(), "parameters": {"max_tokens": 12}}
        status, _, raw = post(url, "/v2/models/t5/generate", json.dumps(body).encode())
    assert status == 200, raw
    assert json.loads(raw)["output_ids"] == want
