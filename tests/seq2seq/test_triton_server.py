"""``onnxport triton OUT --repo R`` for encoder-decoders, loaded by a real Triton Inference Server (the
``tritonserver`` and python backend of the PyPI wheel nvidia-pytriton, on the CPU) and queried with tritonclient
over HTTP and gRPC: the tokens are PyTorch ``model.generate()``'s under each model's generation config. The server
and the stub's environment (numpy < 2, onnxruntime) install from PyPI into ``.triton/`` on first use
(tests/seq2seq/tritonserver.py); a server that does not start fails the tests, with its log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from onnxport.serve.repository import triton_repository
from onnxport.serve.triton_env import NUMPY_REQUIREMENT, ModelEnvironment, environment_problems
from tests.seq2seq.conftest import MAX_LENGTH
from tests.seq2seq.test_triton import _rows
from tests.seq2seq.tiny import tiny
from tests.seq2seq.tritonserver import Server, pinned, tritonserver

PROTOCOLS = ("http", "grpc")
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def bart_out(tmp_path_factory) -> Path:
    """The tiny BART (its generation config forces the end-of-sequence token) exported by ``api.export``."""
    from onnxport import api

    root = tmp_path_factory.mktemp("bart-triton")
    tiny("bart").save_pretrained(root / "hf")
    out = root / "bart"
    assert api.export(f"hf:{root / 'hf'}", out, max_length=MAX_LENGTH)["status"] == "ok"
    return out


@pytest.fixture(scope="module")
def server(t5_out, bart_out, whisper_out, tmp_path_factory) -> Iterator[Server]:
    """tritonserver on a repository of the three models onnxport wrote, stopped after the module."""
    root = tmp_path_factory.mktemp("tritonserver")
    for name, out in (("t5", t5_out), ("bart", bart_out), ("whisper", whisper_out)):
        triton_repository(out, root / "repo", name=name)
    with tritonserver(root / "repo", root / "tritonserver.log") as running:
        yield running


def _client(server: Server, protocol: str):
    if protocol == "http":
        import tritonclient.http as client

        return client, client.InferenceServerClient(url=server.http, network_timeout=120.0)
    import tritonclient.grpc as client

    return client, client.InferenceServerClient(url=server.grpc)


def _infer(server: Server, protocol: str, model: str, **arrays: np.ndarray) -> np.ndarray:
    """``output_ids`` of one request; InferenceServerException when the server answers with an error."""
    from tritonclient.utils import np_to_triton_dtype

    client, conn = _client(server, protocol)
    inputs = []
    for name, array in arrays.items():
        tensor = client.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        result = conn.infer(model, inputs, outputs=[client.InferRequestedOutput("output_ids")])
    finally:
        conn.close()
    return result.as_numpy("output_ids")


def _ok(server: Server, protocol: str, model: str, **arrays: np.ndarray) -> np.ndarray:
    from tritonclient.utils import InferenceServerException

    try:
        return _infer(server, protocol, model, **arrays)
    except InferenceServerException as e:
        raise AssertionError(f"{protocol} {model}: {e}\ntritonserver log ({server.log}):\n{server.log_tail()}") \
            from None


def _source() -> tuple[np.ndarray, np.ndarray]:
    """Two rows of a text model's source, the second padded on the right."""
    mask = (np.arange(7) < np.array([[7], [3]])).astype(np.int64)
    return np.array([[5, 17, 33, 9, 60, 4, 44], [8, 71, 12, 0, 0, 0, 0]], np.int64) * mask, mask


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("family", ["t5", "bart"])
def test_text_model_answers_generate_tokens(server, family, protocol):
    ids, mask = _source()
    hf = tiny(family)
    with torch.inference_mode():
        want = hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                           max_new_tokens=MAX_TOKENS)[:, 1:].numpy()
    got = _ok(server, protocol, family, input_ids=ids, attention_mask=mask,
              max_tokens=np.array([MAX_TOKENS], np.int32))
    eos = hf.generation_config.eos_token_id
    assert got.dtype == np.int64 and _rows(got, eos) == _rows(want, eos), (
        f"{family} over {protocol}: {got.tolist()} != model.generate {want.tolist()}\n{server.log_tail()}")


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_whisper_answers_generate_tokens(server, protocol):
    features = (np.random.default_rng(4).standard_normal((2, 16, 64)) * 0.5).astype(np.float32)
    hf = tiny("whisper")
    with torch.inference_mode():
        want = hf.generate(torch.from_numpy(features), max_new_tokens=MAX_TOKENS).numpy()  # without the start token
    got = _ok(server, protocol, "whisper", input_features=features, max_tokens=np.array([MAX_TOKENS], np.int32))
    eos = hf.generation_config.eos_token_id
    assert _rows(got, eos) == _rows(want, eos), (
        f"whisper over {protocol}: {got.tolist()} != model.generate {want.tolist()}\n{server.log_tail()}")


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_that_cannot_run_is_a_clean_error(server, protocol):
    from tritonclient.utils import InferenceServerException

    too_long = np.full((1, 513), 5, np.int64)  # the tiny T5's max_source is 512
    with pytest.raises(InferenceServerException) as e:
        _infer(server, protocol, "t5", input_ids=too_long)
    assert "a source of 513 tokens exceeds the maximum of 512" in str(e.value), server.log_tail()
    with pytest.raises(InferenceServerException) as e:
        _infer(server, protocol, "whisper", input_features=np.full((1, 16, 64), np.nan, np.float32))
    assert "input_features holds a value that is not a finite number" in str(e.value), server.log_tail()
    ids, mask = _source()
    assert _ok(server, protocol, "t5", input_ids=ids, attention_mask=mask).shape[0] == 2  # still serving


@pytest.mark.slow
def test_config_states_the_environment_the_server_runs(server):
    """The environment the tests give the stub is the one config.pbtxt asks for."""
    config = (server.log.parent / "repo" / "bart" / "config.pbtxt").read_text()
    assert f"needs {NUMPY_REQUIREMENT} and onnxruntime>={pinned('onnxruntime')}" in config
    assert "EXECUTION_ENV_PATH" in config and 'backend: "python"' in config


def test_the_environment_rule():
    """numpy<2 and onnxruntime V can share an environment unless V requires numpy 2 or later."""
    assert environment_problems("1.32.0", [">=1.21.6"]) == []
    assert environment_problems("1.32.0", [""]) == [] and environment_problems(None, [">=2"]) == []
    assert environment_problems("1.40.0", ["<1.25,>=1.21"]) == []
    (problem,) = environment_problems("9.0.0", [">=2.0"])
    assert problem.startswith("onnxruntime 9.0.0 requires numpy>=2.0") and "numpy<2" in problem
    assert ModelEnvironment("1.32.0", 23, 10).requirements() == ["numpy<2", "onnxruntime>=1.32.0"]
    assert ModelEnvironment(None, None, None).requirements() == ["numpy<2", "onnxruntime"]


def test_triton_warns_when_the_environment_cannot_work(t5_out, tmp_path, monkeypatch):
    """The warning is a line on the terminal; the repository is written and the exit code stays 0."""
    from typer.testing import CliRunner

    from onnxport.cli import app

    monkeypatch.setattr("onnxport.serve.repository.check", lambda env: [f"onnxruntime {env.onnxruntime} requires numpy>=2"])
    result = CliRunner().invoke(app, ["triton", str(t5_out), "--repo", str(tmp_path / "repo"), "--name", "t5"])
    assert result.exit_code == 0, result.output
    assert "warning: onnxruntime" in result.output and "requires numpy>=2" in result.output
    assert "numpy<2" in (tmp_path / "repo" / "t5" / "config.pbtxt").read_text()
