"""Encoder-decoders of the other modalities with their cache: image encoders (VisionEncoderDecoder, TrOCR-style
ViT + TrOCR and Donut-style Swin + mBART), Speech2Text's frames-first features with their mask, and LED's long
inputs with global attention (its windowed attention patched for the export only). Each tiny model is saved,
exported from ``hf:DIR`` and proven by step cases and greedy generation; its files then generate
``model.generate()``'s tokens on other inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from onnxport import api, seq2seq
from onnxport.seq2seq.feeds import encoder_inputs
from onnxport.seq2seq.patches import dense_window_attention
from onnxport.seq2seq.source import describe
from tests.conftest import load_report, run_cli
from tests.seq2seq.tiny import tiny

MAX_LENGTH = 24

ENCODER_INPUTS = {  # the encoder file's inputs and dims
    "trocr": {"pixel_values": ["batch", 3, 32, 32]},
    "donut": {"pixel_values": ["batch", 3, 32, 32]},
    "speech_to_text": {"input_features": ["batch", "source", 8], "attention_mask": ["batch", "source"]},
    "led": {"input_ids": ["batch", "source"], "attention_mask": ["batch", "source"],
            "global_attention_mask": ["batch", "source"]},
}


def _inputs(path: Path) -> dict:
    graph = onnx.load(str(path), load_external_data=False).graph
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


_EXPORTS: dict[str, tuple] = {}


def _exported(family: str, root: Path, cli: bool = False) -> tuple:
    """(model, OUT, report.json) of the tiny ``family`` saved and exported from ``hf:DIR`` once per session (by the
    command line when ``cli``, else by ``api.export``); OUT is named after the family (serve names the model so)."""
    if family not in _EXPORTS:
        model = tiny(family)
        model.save_pretrained(root / "hf")
        out = root / family
        if cli:
            proc = run_cli("export", f"hf:{root / 'hf'}", "-o", str(out), "--max-length", str(MAX_LENGTH))
            assert proc.returncode == 0, proc.stderr[-3000:]
        else:
            assert api.export(f"hf:{root / 'hf'}", out, max_length=MAX_LENGTH)["status"] == "ok"
        _EXPORTS[family] = (model, out, load_report(out))
    return _EXPORTS[family]


def _generates_as_pytorch(model, out: Path, section: dict) -> None:
    """The files' greedy loop on other sources (a padded batch of 40 and 37 where the length varies: LED's
    tokens span five windows, Speech2Text's frames ten positions) gives the tokens ``model.generate()`` gives
    with the model's own generation config, and they vary."""
    layout = seq2seq.Seq2SeqLayout.from_dict(section["layout"])
    inputs = encoder_inputs(layout, 2, 40, padded=True, seed=5)
    got = seq2seq.generate_greedy(seq2seq.open_sessions(out), layout, [t.numpy() for t in inputs], 12)
    with torch.inference_mode():
        want = model.generate(**dict(zip(layout.encoder_inputs, inputs)), max_new_tokens=12)[:, 1:].numpy()
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) >= 3  # the scaled weights make greedy tokens vary


def _proven(rep: dict, family: str, out: Path) -> dict:
    assert rep["status"] == "ok", rep["summary"]
    section = rep["seq2seq"]
    assert section["passed"] and all(c["passed"] for c in section["proof"]["cases"])
    gens = section["proof"]["generations"]
    assert all(g["passed"] for g in gens) and gens[1]["steps_agreeing"] == MAX_LENGTH  # the batch: no eos stop
    assert section["layout"]["source_input"] == next(iter(ENCODER_INPUTS[family]))
    assert _inputs(out / "encoder_model.onnx") == ENCODER_INPUTS[family]
    return section


@pytest.mark.slow
@pytest.mark.parametrize("family", ["trocr", "donut", "led"])
def test_modality_is_exported_with_its_cache_and_proven_by_generation(family, tmp_path_factory):
    model, out, rep = _exported(family, tmp_path_factory.mktemp(family))
    section = _proven(rep, family, out)
    mask = "encoder_attention_mask" in _inputs(out / "decoder_with_past_model.onnx")
    assert mask == (family == "led")  # an image's rows are never padded: no mask
    if family == "led":
        assert set(section["export"]["patches"]) == {"longformer-dense-attention", "longformer-no-window-padding"}
        assert {c["source"] for c in section["proof"]["cases"]} >= {1, 7, 128}  # beyond the 8-token window
    _generates_as_pytorch(model, out, section)


@pytest.mark.slow
def test_speech2text_frames_and_mask_through_the_cli(tmp_path_factory):
    model, out, rep = _exported("speech_to_text", tmp_path_factory.mktemp("s2t"), cli=True)
    section = _proven(rep, "speech_to_text", out)
    layout = section["layout"]
    assert layout["subsampled"] and layout["max_source"] == 256  # 64 positions, 4 frames each
    past = _inputs(out / "decoder_with_past_model.onnx")
    assert past["encoder_attention_mask"] == ["batch", "source"]
    assert past["past_key_values.0.encoder.key"][2] == "encoded"  # the encoder output's own length
    assert any(c["padded"] and c["batch"] == 3 for c in section["proof"]["cases"])
    _generates_as_pytorch(model, out, section)


def _until_eos(ids: list[int]) -> list[int]:
    return ids[:ids.index(2)] if 2 in ids else ids  # the tiny models' end-of-sequence token ends the answer unseen


@pytest.mark.slow
@pytest.mark.parametrize(("family", "field", "shape"), [
    ("trocr", "pixel_values", (3, 32, 32)),
    ("speech_to_text", "input_features", (37, 8)),
    ("led", "input_ids", (40,)),
])
def test_generate_serves_each_modality_with_pytorch_tokens(family, field, shape, tmp_path_factory):
    """``serve OUT/``'s generate takes the encoder's own input (pixels, frames-first features, token ids) and
    answers ``model.generate()``'s tokens; another shape or field is a one-line 400."""
    from onnxport.serve import serve_app
    from tests.serve.test_serve import post, running

    model, out, _ = _exported(family, tmp_path_factory.mktemp(family), cli=family == "speech_to_text")
    rng = np.random.default_rng(3)
    source = rng.integers(3, 60, shape) if field == "input_ids" else rng.standard_normal(shape).astype(np.float32)
    tensor = torch.from_numpy(source[None])
    with torch.inference_mode():
        want = _until_eos(model.generate(**{field: tensor}, max_new_tokens=12)[0, 1:].tolist())
    with running(serve_app(out)) as url:
        def ask(body: dict) -> tuple[int, dict]:
            status, _, raw = post(url, f"/v2/models/{family}/generate", json.dumps(body).encode())
            return status, json.loads(raw)

        status, answer = ask({field: source.tolist(), "parameters": {"max_tokens": 12}})
        assert status == 200, answer
        assert answer["output_ids"] == want and len(set(want)) >= 2
        if field != "input_ids":
            status, answer = ask({field: source[..., :-1].tolist()})
            assert status == 400 and "send" in answer["error"] and "\n" not in answer["error"]
            status, answer = ask({"text_input": "hello"})
            assert status == 400 and field in answer["error"]


@pytest.mark.parametrize(("family", "name", "dims", "masks"), [
    ("trocr", "pixel_values", (3, 32, 32), ()),
    ("donut", "pixel_values", (3, 32, 32), ()),
    ("speech_to_text", "input_features", ("source", 8), ("attention_mask",)),
    ("led", "input_ids", ("source",), ("attention_mask", "global_attention_mask")),
    ("whisper", "input_features", (16, 64), ()),
    ("t5", "input_ids", ("source",), ("attention_mask",)),
])
def test_the_encoder_input_is_read_from_the_model(family, name, dims, masks):
    found = describe(tiny(family))
    assert (found.name, found.dims, found.masks_named) == (name, dims, masks)


def test_dense_window_attention_equals_the_windowed_one():
    """LED's export patch computes the library's sliding-window attention (24 tokens, a window of 8), global
    tokens and padded rows included; without the global tokens it computes something else."""
    from transformers.models.led.modeling_led import LEDEncoderSelfAttention

    model = tiny("led")
    layer = model.get_encoder().layers[0].self_attn.longformer_self_attn
    assert isinstance(layer, LEDEncoderSelfAttention)
    torch.manual_seed(1)
    hidden = torch.randn(3, 24, 32)
    masked = torch.zeros(3, 24, dtype=torch.bool)
    masked[1, 19:] = masked[2, 11:] = True
    is_global = torch.zeros(3, 24, dtype=torch.bool)
    is_global[:, 0] = True
    is_global[0, 13] = True
    mask = torch.zeros(3, 24).masked_fill(masked, -1e4).masked_fill(is_global, 1e4)
    with torch.inference_mode():
        (want,) = layer(hidden, attention_mask=mask, is_index_masked=masked,
                        is_index_global_attn=is_global, is_global_attn=True)[:1]
        got = dense_window_attention(layer, hidden, masked, is_global)
    assert want.shape == got.shape and torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, dense_window_attention(layer, hidden, masked, torch.zeros_like(is_global)))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "field", "shape"), [
    ("trocr", "pixel_values", (2, 3, 32, 32)),
    ("speech_to_text", "input_features", (2, 37, 8)),
    ("led", "input_ids", (2, 40)),
])
def test_triton_python_backend_takes_each_modality(family, field, shape, tmp_path_factory, monkeypatch):
    """``onnxport triton OUT/``'s model.py feeds the encoder's own input (LED's global tokens too) and answers
    ``model.generate()``'s tokens; a wrong shape is the request's error."""
    from onnxport.serve.repository import triton_repository
    from tests.seq2seq.test_triton import _answer, _load, _rows

    model, out, _ = _exported(family, tmp_path_factory.mktemp(family), cli=family == "speech_to_text")
    entry = triton_repository(out, tmp_path_factory.mktemp("repo"), name=family).model_dir
    assert f'name: "{field}"' in (entry / "config.pbtxt").read_text()
    backend = _load(entry, monkeypatch)
    rng = np.random.default_rng(7)
    source = rng.integers(3, 60, shape) if field == "input_ids" else rng.standard_normal(shape).astype(np.float32)
    inputs = {field: source}
    if family != "trocr":  # the second row right-padded
        mask = np.ones(shape[:2], np.int64)
        mask[1, 30:] = 0
        inputs["attention_mask"] = mask
    if family == "led":
        inputs["global_attention_mask"] = (np.arange(shape[1]) == 0).astype(np.int64)[None].repeat(2, 0)
    with torch.inference_mode():
        want = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=12)[:, 1:]
    answer = _answer(backend, **inputs, max_tokens=np.array([12], np.int32))
    assert answer.error is None, answer.error.message
    assert _rows(answer.output_tensors[0].as_numpy(), 2) == _rows(want.numpy(), 2)
    bad = _answer(backend, **{field: source[:, :1] if family == "trocr" else source[..., :0]})
    assert bad.output_tensors == [] and field in bad.error.message
    backend.finalize()
