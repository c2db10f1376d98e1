"""``onnxport triton OUT/`` for an encoder-decoder: a Triton python-backend model (``1/model.py``, numpy and
onnxruntime only) beside the three files. Its model.py is imported here with a stand-in for the small part of
``triton_python_backend_utils`` it uses (tensors, requests, responses, errors) and run on the real files with
onnxruntime: its tokens are PyTorch ``model.generate``'s. ``onnxport serve REPO/`` serves the entry too."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from onnxport.serve.repository import triton_repository
from tests.seq2seq.tiny import tiny


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Request:
    def __init__(self, **inputs: np.ndarray) -> None:
        self.inputs = {k: _Tensor(k, v) for k, v in inputs.items()}


class _Response:
    def __init__(self, output_tensors: list, error: object = None) -> None:
        self.output_tensors, self.error = output_tensors, error


class _Error:
    def __init__(self, message: str) -> None:
        self.message = message


def _backend_utils() -> types.ModuleType:
    """The part of Triton's ``triton_python_backend_utils`` that model.py calls."""
    mod = types.ModuleType("triton_python_backend_utils")
    mod.Tensor, mod.InferenceResponse, mod.TritonError = _Tensor, _Response, _Error
    mod.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    return mod


def _load(entry: Path, monkeypatch):
    """Import ``entry/1/model.py`` as Triton's python backend does and initialize it."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _backend_utils())
    spec = importlib.util.spec_from_file_location(f"triton_model_{entry.name}", entry / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = {"name": entry.name, "parameters": {"intra_op_thread_count": {"string_value": "1"}}}
    model.initialize({"model_repository": str(entry), "model_version": "1", "model_config": json.dumps(config)})
    return model


def _rows(tokens: np.ndarray, eos: int) -> list[list[int]]:
    """Each row's tokens up to and including its first end-of-sequence token."""
    rows = []
    for row in tokens.tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows


def _answer(model, **inputs) -> _Response:
    (response,) = model.execute([_Request(**inputs)])
    return response


@pytest.mark.slow
def test_t5_repository_runs_the_greedy_loop_in_the_python_backend(t5_out, tmp_path, monkeypatch):
    made = triton_repository(t5_out, tmp_path / "repo", name="t5")
    entry = made.model_dir
    config = (entry / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "max_batch_size: 0" in config and "optional: true" in config
    assert {p.name for p in (entry / "1").iterdir()} >= {"model.py", "seq2seq.json", "tokenizer", "greedy_loop.py",
                                                         "encoder_model.onnx", "decoder_model.onnx",
                                                         "decoder_with_past_model.onnx"}
    assert made.model_path == entry / "1" / "model.py" and made.max_batch_size == 0
    assert "name: triton" in (entry / "inferenceservice.yaml").read_text()
    model = _load(entry, monkeypatch)
    ids = np.array([[5, 17, 33, 9, 60, 2, 44], [8, 71, 12, 0, 0, 0, 0]], np.int64)
    mask = (np.arange(7) < np.array([[7], [3]])).astype(np.int64)
    ids = ids * mask
    hf = tiny("t5")
    with torch.inference_mode():
        want = hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), do_sample=False,
                           max_new_tokens=12)[:, 1:].numpy()
    answer = _answer(model, input_ids=ids, attention_mask=mask, max_tokens=np.array([12], np.int32))
    assert answer.error is None
    (out,) = answer.output_tensors
    eos = hf.generation_config.eos_token_id
    assert out.name() == "output_ids" and _rows(out.as_numpy(), eos) == _rows(want, eos)
    bad = _answer(model, input_ids=np.array([[5, 500]], np.int64))
    assert bad.output_tensors == [] and "outside the vocabulary" in bad.error.message
    bad = _answer(model, input_ids=ids, max_tokens=np.array([99], np.int32))
    assert "max_tokens must be in 1..24" in bad.error.message
    model.finalize()


@pytest.mark.slow
def test_whisper_repository_takes_features(whisper_out, tmp_path, monkeypatch):
    entry = triton_repository(whisper_out, tmp_path / "repo", name="whisper").model_dir
    assert "dims: [ -1, 16, 64 ]" in (entry / "config.pbtxt").read_text()
    assert (entry / "1" / "preprocessor_config.json").is_file()
    model = _load(entry, monkeypatch)
    features = (np.random.default_rng(4).standard_normal((2, 16, 64)) * 0.5).astype(np.float32)
    with torch.inference_mode():
        want = tiny("whisper").generate(torch.from_numpy(features), do_sample=False, max_new_tokens=16).numpy()
    answer = _answer(model, input_features=features, max_tokens=np.array([16], np.int32))
    assert answer.error is None
    assert _rows(answer.output_tensors[0].as_numpy(), 2) == _rows(want, 2)
    bad = _answer(model, input_features=features[:, :15])
    assert "input_features must be FP32 [batch, 16, 64]" in bad.error.message


@pytest.mark.slow
def test_serve_serves_the_python_backend_entry_with_generate(t5_out, tmp_path):
    from onnxport.serve import serve_app
    from tests.serve.test_serve import post, running

    triton_repository(t5_out, tmp_path / "repo", name="t5")
    ids = [5, 17, 33, 9]
    with running(serve_app(tmp_path / "repo")) as url:
        body = {"input_ids": ids, "parameters": {"max_tokens": 8, "ignore_eos": True}}
        status, _, raw = post(url, "/v2/models/t5/generate", json.dumps(body).encode())
    assert status == 200, raw
    assert len(json.loads(raw)["output_ids"]) == 8 and "text_output" in json.loads(raw)


def test_gpu_instances_run_the_files_on_the_cuda_provider(t5_out, tmp_path, monkeypatch):
    made = triton_repository(t5_out, tmp_path / "repo", gpu=True, instance_count=2)
    text = made.config_path.read_text()
    assert "kind: KIND_GPU" in text and "count: 2" in text and "KIND_CPU" not in text
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _backend_utils())
    spec = importlib.util.spec_from_file_location("triton_model_gpu", made.model_dir / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.providers({"model_instance_kind": "GPU", "model_instance_device_id": "1"}) == [
        ("CUDAExecutionProvider", {"device_id": 1, "use_tf32": "0"}), "CPUExecutionProvider"]
    assert module.providers({"model_instance_kind": "CPU"}) == ["CPUExecutionProvider"]


def test_the_greedy_loop_runs_without_onnxport(tmp_path):
    """The one greedy loop (seq2seq/greedy_loop.py, copied beside model.py) imports numpy only: with onnxport and
    torch unimportable it runs a loop over stand-in sessions, stopping once every row has ended."""
    import shutil
    import subprocess

    from onnxport.seq2seq import greedy_loop

    shutil.copy(greedy_loop.__file__, tmp_path / "greedy_loop.py")
    code = """
import sys
sys.modules.update(onnxport=None, torch=None, transformers=None)
import numpy as np
import greedy_loop

class Session:
    def __init__(self, width): self.width = width
    def run(self, names, feeds):
        batch = next(iter(feeds.values())).shape[0]
        logits = np.zeros((batch, 1, 8), np.float32)
        logits[:, -1, 2 + self.width] = 1.0
        return [logits if n == "logits" else np.zeros((batch, 1, 1, 2), np.float32) for n in names][:len(names)]

class Encoder:
    def run(self, names, feeds): return [np.zeros((2, 3, 4), np.float32)]

class Decoding:
    def __init__(self): self.finished, self.steps = False, 0
    def step(self, logits):
        self.steps += 1
        self.finished = self.steps == 3
        return logits.argmax(-1).astype(np.int64)

class Rules:
    decoder_prompt = (5,)
    def start(self, ids, most):
        assert ids.tolist() == [[0, 5], [0, 5]] and most == 9
        return Decoding()

got = greedy_loop.generate((Encoder(), Session(1), Session(2)), 2, 0, Rules(), {"input_ids": np.ones((2, 3))}, 9)
assert got.tolist() == [[3, 4, 4], [3, 4, 4]], got
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
