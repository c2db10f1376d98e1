"""Packed sequences (pack_padded_sequence → GRU/LSTM/RNN → pad_packed_sequence) exported as ONNX recurrent ops
with sequence_lens, checked with onnxruntime against PyTorch on unsorted lengths with padding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnxport.api import load_model
from onnxport.core.errors import UsageError
from onnxport.core.samples import make_inputs
from onnxport.core.spec import merge_dims, parse_dim, parse_input
from onnxport.exporters import packed
from onnxport.exporters.chain import export
from tests.conftest import FIXTURES, load_report
from tests.fixtures.in_process import run_cli_here

PACKED = FIXTURES / "packed.py"
DIMS = ["batch=1..16", "seq=1..40"]
LENGTHS = "lengths:int64[batch]{1..seq}"
SPECS = {
    "GRUClassifier": ["tokens:int64[batch,seq]{0..49}", LENGTHS],
    "BiLSTM": ["x:float32[batch,seq,8]", LENGTHS],
    "LSTMWithState": ["x:float32[batch,seq,6]", LENGTHS, "h0:float32[2,batch,10]", "c0:float32[2,batch,10]"],
    "ReluRNN": ["x:float32[seq,batch,5]", LENGTHS],
    "MaskedGRU": ["tokens:int64[batch,seq]{0..39}", "mask:int64[batch,seq]"],
}
# (batch, seq, lengths): unsorted, with padding, batch 1, the full length, length 1, sorted
TRIPS = [(1, 5, [3]), (4, 9, [3, 9, 1, 6]), (6, 13, [13, 2, 7, 13, 1, 5]), (3, 6, [6, 4, 2])]


def _load(name: str):
    return load_model(f"{PACKED}:{name}", inputs=SPECS[name], dims=DIMS)


def _inputs(lm, batch: int, seq: int, lengths: list[int]) -> tuple[torch.Tensor, ...]:
    """Random inputs at (batch, seq) whose lengths (or padding mask) are ``lengths``."""
    out = list(make_inputs(lm.inputs, {"batch": batch, "seq": seq}, seed=7))
    for i, spec in enumerate(lm.inputs):
        if spec.name == "lengths":
            out[i] = torch.tensor(lengths, dtype=torch.int64)
        elif spec.name == "mask":
            out[i] = (torch.arange(seq).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.int64)
    return tuple(out)


def _ort_matches(lm, path) -> None:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, seq, lengths in TRIPS:
        inputs = _inputs(lm, batch, seq, lengths)
        with torch.inference_mode():
            want = [t.numpy() for t in lm.flat(*inputs)]
        got = sess.run(None, {s.name: t.numpy() for s, t in zip(lm.inputs, inputs)})
        assert len(got) == len(want)
        for w, g in zip(want, got):
            assert w.shape == g.shape, (batch, seq, lengths)
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4, err_msg=f"{batch, seq, lengths}")


@pytest.mark.parametrize("name", list(SPECS))
def test_rewrite_runs_the_packed_path_exactly(name):
    lm = _load(name)
    for batch, seq, lengths in TRIPS:
        inputs = _inputs(lm, batch, seq, lengths)
        with torch.inference_mode():
            want = lm.flat(*inputs)
            with packed.rewritten() as seen:
                got = lm.flat(*inputs)
        assert seen and all(isinstance(m, torch.nn.RNNBase) for m in seen)
        for w, g in zip(want, got):
            assert w.shape == g.shape
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    assert packed.find(lm) == (next(n for n, m in lm.model.named_modules() if isinstance(m, torch.nn.RNNBase)),)


def test_patches_are_restored():
    from torch.nn.utils import rnn

    from tests.fixtures import packed as fixtures

    before = (rnn.pack_padded_sequence, fixtures.pad_packed_sequence, torch.nn.GRU.forward, torch.nn.LSTM.forward)
    with packed.rewritten():
        assert fixtures.pack_padded_sequence is not before[0] and torch.nn.GRU.forward is not before[2]
    assert (rnn.pack_padded_sequence, fixtures.pad_packed_sequence, torch.nn.GRU.forward,
            torch.nn.LSTM.forward) == before


@pytest.mark.parametrize("name", list(SPECS))
def test_dynamo_export_has_recurrent_ops_and_matches_onnxruntime(name, tmp_path):
    lm = _load(name)
    res = export(lm, tmp_path / "m.onnx", exporter="dynamo")
    diag = next(d for d in res.diagnostics if d.code == packed.CODE)
    assert diag.severity == "info" and diag.module in diag.message and res.attempts[0].note == diag.message
    model = onnx.load(str(res.path))
    ops = {n.op_type for n in model.graph.node}
    assert ops & {"GRU", "LSTM", "RNN"} and not any(n.domain == packed.NAMESPACE for n in model.graph.node)
    for value in model.graph.input:  # batch (and seq) stay dynamic
        dims = value.type.tensor_type.shape.dim
        spec = next(s for s in lm.inputs if s.name == value.name)
        assert all(dims[i].dim_param for i, d in enumerate(spec.shape) if isinstance(d, str))
    _ort_matches(lm, res.path)


@pytest.mark.parametrize("name", ["LSTMWithState", "MaskedGRU"])
def test_torchscript_export_takes_the_same_rewrite(name, tmp_path):
    lm = _load(name)
    res = export(lm, tmp_path / "m.onnx", exporter="torchscript")
    assert res.attempts[0].ok and not res.attempts[0].frozen
    assert any(d.code == packed.CODE for d in res.diagnostics)
    _ort_matches(lm, res.path)
    from torch.onnx._internal.torchscript_exporter.registration import registry

    assert not registry.is_registered_op(f"{packed.NAMESPACE}::rnn_layer", res.opset)  # unregistered again


def test_model_without_packing_is_left_alone(tmp_path):
    lm = load_model(f"{PACKED}:Plain", inputs=["x:float32[batch,seq,4]"])
    assert packed.find(lm) == ()
    res = export(lm, tmp_path / "m.onnx", exporter="torchscript")
    assert not any(d.code == packed.CODE for d in res.diagnostics)


def test_the_exporter_alone_refuses_packed_sequences():
    lm = _load("GRUClassifier")
    example = make_inputs(lm.inputs, {"batch": 2, "seq": 6}, seed=0)
    with pytest.raises(torch.onnx.OnnxExporterError, match="Failed to export the model with torch.export"):
        torch.onnx.export(lm.flat, example, dynamo=True, verbose=False)


def test_lengths_bounded_by_a_dim():
    tokens, lengths = parse_input("tokens:int64[batch,seq]{0..9}"), parse_input(LENGTHS)
    assert lengths.value_range == (1, "seq") and str(lengths) == LENGTHS
    merge_dims([tokens, lengths], [parse_dim("seq=2..30")])
    for seq in (1, 4, 30):
        for values in ("random", "edge"):
            (_, got) = make_inputs((tokens, lengths), {"batch": 9, "seq": seq}, values, seed=seq)
            assert int(got.min()) >= 1 and int(got.max()) <= seq
    (_, edge) = make_inputs((tokens, lengths), {"batch": 3, "seq": 8}, "edge")
    assert edge.tolist()[0] == 8 and edge.tolist()[-1] == 1  # full length and one step
    with pytest.raises(UsageError, match="no input uses"):
        merge_dims([parse_input("n:int64[batch]{1..seq}")], [])
    with pytest.raises(UsageError, match="empty when seq=2"):
        merge_dims([tokens, parse_input("n:int64[batch]{3..seq}")], [parse_dim("seq=2..30")])


@pytest.mark.slow
def test_cli_exports_and_proves_a_packed_gru(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = [a for s in SPECS["GRUClassifier"] for a in ("-i", s)] + [a for d in DIMS for a in ("-d", d)]
    proc = run_cli_here(monkeypatch, capsys, "export", f"{PACKED}:GRUClassifier", *args, "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = load_report(out)
    assert report["status"] == "ok" and report["validation"]["passed"]
    assert report["export"]["exporter"] == "dynamo"
    assert any(d["code"] == packed.CODE and d["module"] == "gru" for d in report["diagnostics"])
    lengths = [c["shapes"]["lengths"] for c in report["validation"]["cases"]]
    assert len(lengths) >= 4 and {(1,), (16,)} <= {tuple(s) for s in lengths}
    assert all(d["proven"] for d in report["check"]["dynamic_dims"])
