"""Triton's generate extension for a text-to-text encoder-decoder: the T5 export (its three files, report.json
and a tiny local tokenizer beside them) served for real and driven over HTTP."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnxport import api, seq2seq
from tests.seq2seq.tiny import tiny

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("fastapi")

from onnxport.serve import serve_app  # noqa: E402
from tests.serve.test_generate import _events, _tokenizer  # noqa: E402
from tests.serve.test_serve import post, running  # noqa: E402

SOURCE = "the quick brown fox jumps"


@pytest.fixture(scope="module")
def t5_out(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5-serve")
    tiny("t5").save_pretrained(root / "hf")
    _tokenizer(None).save_pretrained(root / "hf")
    out = root / "t5"
    rep = api.export(f"hf:{root / 'hf'}", out, max_length=24)
    assert rep["status"] == "ok" and (out / "tokenizer").is_dir()
    return out


@pytest.mark.slow
def test_generate_answers_text_for_text(t5_out):
    tok = _tokenizer(None)
    ids = np.array([tok.encode(SOURCE)])
    layout = seq2seq.Seq2SeqLayout(**{k: v for k, v in json.loads((t5_out / "report.json").read_text())
                                      ["seq2seq"]["layout"].items() if k not in ("decoder_start_token_id", "files")},
                                   start_token=0)
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
