"""Triton's generate extension: a tiny random Llama exported with its KV cache and a tiny local tokenizer,
served for real on 127.0.0.1 and driven over HTTP (generate, generate_stream's server-sent events, errors)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import shutil

import numpy as np
import pytest
import tokenizers
import torch
import transformers

from onnxport.core.errors import UsageError
from onnxport.core.greedy import GreedyRules
from onnxport.decoder.flow import run_model
from onnxport.decoder.generation import generate_greedy, stream_greedy
from onnxport.decoder.prove import greedy
from onnxport.decoder.serving import DEFAULT_MAX_LENGTH, cache_layout, decoder_layout
from onnxport.decoder.tokenizer import load_tokenizer, save_tokenizer
from onnxport.runtime.sessions import session
from onnxport.serve import serve_app, signature
from tests.serve.test_serve import fixed_shape_model, get, metric, post, running

MAX_LENGTH = 48
VOCAB = 128
MAX_BODY = 64 * 1024
SENTENCES = ["the quick brown fox jumps over the lazy dog", "a small model speaks in random words",
             "every token comes from the cache"]
PROMPT = "the quick brown fox"


def _vocabulary(eos_id: int | None) -> list[str]:
    """VOCAB words: ``<unk>``, ``<pad>``, the sentences' words, fillers; ``</s>`` at ``eos_id`` (the word there
    moves to the end)."""
    words = ["<unk>", "<pad>"] + list(dict.fromkeys(" ".join(SENTENCES).split()))
    words += [f"w{i}" for i in range(len(words), VOCAB - 1)] + ["</s>"]
    if eos_id is not None:
        words[eos_id], words[-1] = words[-1], words[eos_id]
    return words


def _tokenizer(eos_id: int | None):
    """A WordLevel tokenizer over :func:`_vocabulary`, built locally (no download)."""
    words = _vocabulary(eos_id)
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                                eos_token="</s>")


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> dict:
    """The exported Llama in OUT (model.onnx, report.json's decoder section, tokenizer/), the prompt's ids, its
    greedy continuation by ``decoder.prove.greedy`` and the eos id: a token that continuation reaches."""
    root = tmp_path_factory.mktemp("generate")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, vocab_size=VOCAB, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id = None  # the end of a sequence is the tokenizer's (set below)
    model.save_pretrained(root / "hf")
    out = root / "tiny-llama"
    outcome = run_model(model, out, max_length=MAX_LENGTH, new_tokens=4)
    assert outcome.passed and outcome.path == out / "model.onnx"
    (out / "report.json").write_text(json.dumps({"decoder": outcome.to_dict()}))
    prompt = _tokenizer(None).encode(PROMPT)
    sess = session(outcome.path, providers=["CPUExecutionProvider"])
    ids = np.array([prompt])
    seq = [int(t) for t in greedy(sess, outcome.layout, ids, np.ones_like(ids), 16)[0]]
    fresh = [j for j, t in enumerate(seq) if t not in seq[:j] and t not in prompt and t >= 2]
    stop = next((j for j in fresh if j >= 1), fresh[0])
    _tokenizer(seq[stop]).save_pretrained(root / "hf")
    assert save_tokenizer(root / "hf", out) == out / "tokenizer"
    return {"out": out, "layout": outcome.layout, "prompt": prompt, "greedy": seq, "stop": stop,
            "eos": seq[stop], "sess": sess}


@pytest.fixture(scope="module")
def server(llm):
    with running(serve_app(llm["out"], max_body_bytes=MAX_BODY)) as url:
        yield url


@pytest.fixture(scope="module")
def bare_server(llm, tmp_path_factory):
    """A repository: the same decoder without tokenizer or report.json, and a model that is no decoder."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "bare" / "1").mkdir(parents=True)
    shutil.copy(llm["out"] / "model.onnx", repo / "bare" / "1" / "model.onnx")
    (repo / "fixed" / "1").mkdir(parents=True)
    fixed_shape_model(repo / "fixed" / "1" / "model.onnx")
    with running(serve_app(repo, max_body_bytes=MAX_BODY)) as url:
        yield url


def _post(url: str, path: str, body: object) -> tuple[int, dict, bytes]:
    return post(url, path, json.dumps(body).encode())


def _generate(url: str, body: dict, model: str = "tiny-llama") -> dict:
    status, headers, raw = _post(url, f"/v2/models/{model}/generate", body)
    assert status == 200, raw
    assert headers["content-type"] == "application/json"
    return json.loads(raw)


def _events(url: str, body: dict, model: str = "tiny-llama") -> list[tuple[str, dict]]:
    """POST to generate_stream and read its server-sent events as they come: (event type, data) pairs."""
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", f"/v2/models/{model}/generate_stream", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("content-type") == "text/event-stream; charset=utf-8"
        events, kind, data = [], "message", None
        while line := resp.readline():
            line = line.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
            elif line == "" and data is not None:
                events.append((kind, data))
                kind, data = "message", None
        return events
    finally:
        conn.close()


def _error(url: str, path: str, body: object, status: int) -> str:
    got, headers, raw = post(url, path, body if isinstance(body, bytes) else json.dumps(body).encode())
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    message = json.loads(raw)["error"]
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- the token loop and the tokenizer


def test_stream_greedy_is_prove_greedy_step_by_step(llm):
    layout, sess = llm["layout"], llm["sess"]
    ids = np.array([llm["prompt"], [5, 9, 13, 21]])
    mask = np.ones_like(ids)
    want = greedy(sess, layout, ids, mask, 12)
    steps = list(stream_greedy(sess, layout, ids, mask, 12))
    assert len(steps) == 12 and all(s.shape == (2,) and s.dtype == np.int64 for s in steps)
    np.testing.assert_array_equal(np.stack(steps, axis=1), want)
    padded = np.array([[0, 0, *llm["prompt"][:2]], [7, 8, 9, 10]])  # left padding, as prove.greedy takes it
    pmask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(generate_greedy(sess, layout, padded, pmask, 6), greedy(sess, layout, padded,
                                                                                         pmask, 6))
    one = np.array([llm["prompt"]])
    stopped = generate_greedy(sess, layout, one, np.ones_like(one), 16, GreedyRules(eos_token_ids=(llm["eos"],)))
    assert stopped[0].tolist() == llm["greedy"][:llm["stop"] + 1]  # the eos step is the last one
    with pytest.raises(UsageError, match="exceeds the declared maximum of 48") as err:
        next(stream_greedy(sess, layout, np.zeros((1, 40), np.int64), np.ones((1, 40), np.int64), 9))
    assert "shorten the prompt to 39 tokens" in err.value.hint


def test_tokenizer_saved_and_loaded(llm, tmp_path):
    tok = load_tokenizer(llm["out"])
    assert tok is not None and tok.eos_token_id == llm["eos"] and len(tok) == VOCAB
    assert tok.encode(PROMPT) == llm["prompt"]
    assert save_tokenizer(tmp_path, tmp_path / "out") is None and load_tokenizer(tmp_path) is None


def test_decoder_detected_from_its_inputs_and_outputs(llm, tmp_path):
    sig = signature(llm["out"] / "model.onnx")
    alone = decoder_layout(sig)  # no report.json: the shapes give the cache, the maximum is the default
    assert (alone.layers, alone.kv_heads, alone.head_dim, alone.vocab) == (2, 2, 16, VOCAB)
    assert alone.position_ids and alone.max_length == DEFAULT_MAX_LENGTH
    assert decoder_layout(sig, llm["layout"]) == llm["layout"]
    assert decoder_layout(signature(fixed_shape_model(tmp_path / "fixed.onnx"))) is None


def test_the_layout_report_json_records_is_read_back_by_its_family(llm):
    """report.json's ``decoder.layout`` comes back as the family's record (Family.layout), not as a dict."""
    from onnxport import families
    from onnxport.families.serving import family_layout, read_layout

    layout = llm["layout"]
    assert cache_layout(layout.to_dict()) == layout and read_layout({"decoder": {"layout": layout.to_dict()}}) == layout
    assert family_layout(families.get("decoder"), {"layers": 2}) is None  # does not read: no layout
    assert read_layout({"model": {}}) is None and read_layout(None) is None


# ---------------------------------------------------------------- generate and generate_stream


def test_generate_text(server, llm):
    answer = _generate(server, {"id": "g1", "text_input": PROMPT, "parameters": {"max_tokens": 16,
                                                                                 "ignore_eos": True}})
    assert answer["model_name"] == "tiny-llama" and answer["model_version"] == "1" and answer["id"] == "g1"
    assert answer["output_ids"] == llm["greedy"] and answer["finish_reason"] == "length"
    words = _vocabulary(llm["eos"])
    assert answer["text_output"] == " ".join(words[t] for t in llm["greedy"] if words[t] != "</s>")
    # the eos token ends it (unseen), as the tokenizer says
    stopped = _generate(server, {"text_input": PROMPT, "parameters": {"max_tokens": 16, "temperature": 0}})
    assert stopped["output_ids"] == llm["greedy"][:llm["stop"]] and stopped["finish_reason"] == "stop"
    assert stopped["text_output"] == " ".join(words[t] for t in llm["greedy"][:llm["stop"]])
    assert _generate(server, {"text_input": PROMPT})["output_ids"] == llm["greedy"][:min(llm["stop"], 16)]


def test_generate_input_ids(server, bare_server, llm):
    ids = [5, 9, 13, 21]
    want = greedy(llm["sess"], llm["layout"], np.array([ids]), np.ones((1, 4), np.int64), 10)[0].tolist()
    body = {"input_ids": ids, "parameters": {"max_tokens": 10, "ignore_eos": True}}
    answer = _generate(server, body)
    assert answer["output_ids"] == want and answer["finish_reason"] == "length"
    assert answer["text_output"] == " ".join(w for w in (_vocabulary(llm["eos"])[t] for t in want) if w != "</s>")
    bare = _generate(bare_server, {"input_ids": ids, "parameters": {"max_tokens": 10}}, model="bare")
    assert bare == {"model_name": "bare", "model_version": "1", "output_ids": want, "finish_reason": "length"}


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_generate_stream_equals_generate(server, llm, ignore_eos):
    body = {"id": "s1", "text_input": PROMPT, "parameters": {"max_tokens": 16, "ignore_eos": ignore_eos}}
    whole = _generate(server, body)
    events = _events(server, body)
    tokens, final = events[:-1], events[-1][1]
    assert all(kind == "message" for kind, _ in events)
    assert [e["index"] for _, e in tokens] == list(range(len(tokens)))
    assert [t for _, e in tokens for t in e["output_ids"]] == whole["output_ids"]
    assert whole["output_ids"] == (llm["greedy"] if ignore_eos else llm["greedy"][:llm["stop"]])
    assert "".join(e["text_output"] for _, e in events) == whole["text_output"]
    assert all(e["model_name"] == "tiny-llama" and e["id"] == "s1" for _, e in events)
    assert final["final"] is True and final["finish_reason"] == whole["finish_reason"] and final["output_ids"] == []
    bare = _events(server, {"input_ids": [5, 9], "parameters": {"max_tokens": 3,
                                                                                       "ignore_eos": True}})
    assert len(bare) == 4 and bare[-1][1]["finish_reason"] == "length"


def test_generate_errors(server, llm):
    gen, stream = "/v2/models/tiny-llama/generate", "/v2/models/tiny-llama/generate_stream"
    for path in (gen, stream):  # a bad request is a 4xx before any event
        message = _error(server, path, {"input_ids": list(range(1, 41)), "parameters": {"max_tokens": 16}}, 400)
        assert message == ("a prompt of 40 tokens plus 16 new ones exceeds the declared maximum of 48 tokens: "
                           "ask for at most 8 new tokens with this prompt; shorten the prompt to 32 tokens for 16 "
                           "new ones; or export again with a larger --max-length")
        whole = _error(server, path, {"input_ids": list(range(1, 48)), "parameters": {"max_tokens": 4096}}, 400)
        assert whole.endswith("ask for at most 1 new tokens with this prompt; or export again with a larger "
                              "--max-length")
        assert "shorten the prompt to 0" not in whole
        assert "not valid Unicode" in _error(server, path, {"text_input": "a\ud800b"}, 400)
        assert "unknown model 'nope'" in _error(server, path.replace("tiny-llama", "nope"), {"input_ids": [1]}, 404)
    assert "max_tokens must be an integer in 1..4096" in _error(
        server, gen, {"input_ids": [1], "parameters": {"max_tokens": 100_000}}, 400)
    assert "max_tokens must be" in _error(server, gen, {"input_ids": [1], "parameters": {"max_tokens": 0}}, 400)
    sampling = _error(server, stream, {"text_input": PROMPT, "parameters": {"temperature": 0.7}}, 400)
    assert sampling.startswith("parameter temperature=0.7 asks for sampling; this server decodes greedily only")
    assert "asks for sampling" in _error(server, gen, {"text_input": "a", "parameters": {"do_sample": True}}, 400)
    assert "unsupported parameter(s) ['beam_width']" in _error(
        server, gen, {"text_input": "a", "parameters": {"beam_width": 4}}, 400)
    assert "either 'text_input'" in _error(server, gen, {"text_input": "a", "input_ids": [1]}, 400)
    assert "either 'text_input'" in _error(server, gen, {"prompt": "a"}, 400)
    assert "outside the vocabulary 0..127" in _error(server, gen, {"input_ids": [1, 128]}, 400)
    assert "the prompt is empty" in _error(server, gen, {"text_input": ""}, 400)
    assert "not valid JSON" in _error(server, gen, b"{nope", 400)
    assert "limit is 65536" in _error(server, gen, {"text_input": "fox " * 20_000}, 413)
    assert "'text_input' has 4000 characters, far more than the 48 tokens" in _error(
        server, gen, {"text_input": "fox " * 1000}, 400)


def test_generate_without_tokenizer_or_decoder(bare_server):
    message = _error(bare_server, "/v2/models/bare/generate", {"text_input": PROMPT}, 400)
    assert message == "model 'bare' has no tokenizer: send input_ids, or export with a tokenizer"
    for path in ("/v2/models/fixed/generate", "/v2/models/fixed/generate_stream"):
        message = _error(bare_server, path, {"input_ids": [1, 2]}, 400)
        assert message.startswith("model 'fixed' is not a decoder: generate needs a decoder exported with its KV "
                                  "cache")
    # no report.json: the default maximum length
    assert "declared maximum of 128 tokens" in _error(
        bare_server, "/v2/models/bare/generate", {"input_ids": [1] * 120, "parameters": {"max_tokens": 9}}, 400)


def test_generate_counted_in_metrics_and_infer_still_works(server):
    before = metric(server, "onnxport_generated_tokens_total", "tiny-llama")
    ok = metric(server, "onnxport_generate_requests_total", "tiny-llama")
    _generate(server, {"input_ids": [3, 4], "parameters": {"max_tokens": 5, "ignore_eos": True}})
    _events(server, {"input_ids": [3, 4], "parameters": {"max_tokens": 5, "ignore_eos": True}})
    _error(server, "/v2/models/tiny-llama/generate", {"input_ids": [3], "parameters": {"top_p": 0.5}}, 400)
    assert metric(server, "onnxport_generated_tokens_total", "tiny-llama") == before + 10
    assert metric(server, "onnxport_generate_requests_total", "tiny-llama") == ok + 3
    assert metric(server, "onnxport_generate_seconds_count", "tiny-llama") >= 2
    status, raw = get(server, "/v2")
    assert status == 200 and "generate" in json.loads(raw)["extensions"]
    # the plain OIP route serves the same model: one prompt step
    feeds = {"input_ids": [[3, 4]], "attention_mask": [[1, 1]], "position_ids": [[0, 1]]}
    inputs = [{"name": n, "datatype": "INT64", "shape": [1, 2], "data": v} for n, v in feeds.items()]
    inputs += [{"name": f"past_key_values.{i}.{kv}", "datatype": "FP32", "shape": [1, 2, 0, 16], "data": []}
               for i in range(2) for kv in ("key", "value")]
    status, _, raw = _post(server, "/v2/models/tiny-llama/infer", {"inputs": inputs, "outputs": [{"name": "logits"}]})
    assert status == 200, raw
    logits = json.loads(raw)["outputs"][0]
    assert logits["shape"] == [1, 2, VOCAB]
    assert int(np.argmax(np.array(logits["data"]).reshape(1, 2, VOCAB)[0, -1])) == _generate(
        server, {"input_ids": [3, 4], "parameters": {"max_tokens": 1, "ignore_eos": True}})["output_ids"][0]


def test_concurrent_requests_and_a_client_that_leaves(server, llm):
    from concurrent.futures import ThreadPoolExecutor

    host, port = server.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v2/models/tiny-llama/generate_stream",
                 body=json.dumps({"input_ids": [7], "parameters": {"max_tokens": 40, "ignore_eos": True}}).encode())
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.close()  # gone after one event
    prompts = [[5, 9, 13, 21], [7, 8], llm["prompt"], [100, 3, 3]]
    body = {"parameters": {"max_tokens": 12, "ignore_eos": True}}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda ids: _generate(server, {**body, "input_ids": ids})["output_ids"], prompts))
    for ids, got in zip(prompts, answers):
        assert got == greedy(llm["sess"], llm["layout"], np.array([ids]), np.ones((1, len(ids)), np.int64),
                             12)[0].tolist()


def test_triton_repository_of_a_decoder_keeps_its_tokenizer(llm, tmp_path):
    """`onnxport triton OUT/ --repo R` copies tokenizer/ into R/<name>/1/, and `serve R/` answers text with it."""
    from onnxport.serve.repository import triton_repository

    made = triton_repository(llm["out"], tmp_path / "repo")
    assert (made.model_dir / "1" / "tokenizer" / "tokenizer.json").is_file()
    with running(serve_app(tmp_path / "repo", max_body_bytes=MAX_BODY)) as url:
        answer = _generate(url, {"text_input": PROMPT, "parameters": {"max_tokens": 6, "ignore_eos": True}},
                           model=made.name)
    assert answer["output_ids"] == llm["greedy"][:6] and answer["text_output"]


def test_cli_serve_names_the_generate_endpoint(llm):
    """`onnxport serve OUT/` of a decoder says where generate is, and answers it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from onnxport.serve import listen
    from tests.conftest import ROOT

    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "onnxport", "serve", str(llm["out"]), "--port", str(port)],
                            cwd=ROOT, env=dict(os.environ, COLUMNS="200"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                if get(url, "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        answer = _generate(url, {"input_ids": llm["prompt"], "parameters": {"max_tokens": 5, "ignore_eos": True}})
        assert answer["output_ids"] == llm["greedy"][:5]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert f"POST http://{url}/v2/models/tiny-llama/generate and /generate_stream" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_served_config_names_the_generation_rules(server, llm):
    """The served config says which of the generation config's rules generate applies, and which it cannot."""
    status, raw = get(server, "/v2/models/tiny-llama/config")
    params = json.loads(raw)["parameters"]
    assert status == 200 and params["onnxport_generation_applied"]["string_value"] == "eos_token_ids"
    assert params["onnxport_generation_not_applied"]["string_value"] == "none"
    layout = llm["layout"]
    ruled = dataclasses.replace(layout, generation=GreedyRules(repetition_penalty=1.3, not_applied=("num_beams=4",)))
    from onnxport.decoder.serving import Generator

    params = Generator(ruled, load_tokenizer(llm["out"])).config_parameters()
    assert params == {"onnxport_generation_applied": "eos_token_ids, repetition_penalty",
                      "onnxport_generation_not_applied": "num_beams=4"}
