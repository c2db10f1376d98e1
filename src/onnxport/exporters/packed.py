"""Packed sequences: ``pack_padded_sequence`` → ``nn.GRU | nn.LSTM | nn.RNN`` → ``pad_packed_sequence`` as
ONNX GRU / LSTM / RNN nodes with ``sequence_lens``.

No exporter takes a PackedSequence: its ``batch_sizes`` are data (how many sequences are still running at each
step) and the RNN kernels behind it loop over them. ONNX's recurrent ops take the padded batch and the length
of each sequence instead, which is what the model held before packing. While :func:`rewritten` is active

* ``pack_padded_sequence(x, lengths, ...)`` returns a :class:`Padded` — the padded input (time-major) and the
  lengths in the caller's batch order — instead of a PackedSequence;
* ``nn.GRU / nn.LSTM / nn.RNN`` called on a :class:`Padded` run one ``onnxport_packed::rnn_layer`` op per layer
  (the padded output of a layer feeds the next, with the same lengths) and return a :class:`Padded` and
  h_n (and c_n) in the caller's batch order, as PyTorch does;
* ``pad_packed_sequence`` masks the steps past each length with ``padding_value`` and cuts the time axis to
  the longest length (or pads it to ``total_length``).

The op runs the real packed path eagerly (pack, the ``_VF`` kernel nn.GRU uses, pad: the numbers are
PyTorch's) and translates to one ONNX node per layer for the dynamo exporter (:func:`translation_table`) and
the TorchScript exporter (:func:`torchscript_symbolic`). Nothing else changes: the model outside the export, and
an RNN called on a real PackedSequence or a plain tensor, take PyTorch's own path.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import rnn as rnn_utils

from onnxport.core.diagnostics import Diagnostic, info
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.sources.base import LoadedModel, memoized

NAMESPACE = "onnxport_packed"
CODE = "packed-sequence-rewritten"
_PACK = rnn_utils.pack_padded_sequence
_PAD = rnn_utils.pad_packed_sequence
_RNNS = (nn.GRU, nn.LSTM, nn.RNN)
_FORWARD = {cls: cls.__dict__["forward"] for cls in _RNNS}
# rows of PyTorch's stacked gate weights in ONNX's order: GRU r,z,n -> z,r,h; LSTM i,f,g,o -> i,o,f,c
_ONNX_GATE_ORDER = {"GRU": (1, 0, 2), "LSTM": (0, 3, 1, 2), "RNN_TANH": (0,), "RNN_RELU": (0,)}


@dataclass
class Padded:
    """What stands in for a PackedSequence while exporting: padded steps, time-major, and the lengths."""

    data: torch.Tensor  # [T, B, F]
    lengths: torch.Tensor  # int64 [B], in the caller's batch order

    def __getattr__(self, name: str):
        raise AttributeError(
            f"the model uses PackedSequence.{name}; onnxport exports packed sequences that go from "
            "pack_padded_sequence through nn.GRU/LSTM/RNN to pad_packed_sequence (or only their h_n/c_n)")


# --------------------------------------------------------------------------- the op


@torch.library.custom_op(f"{NAMESPACE}::rnn_layer", mutates_args=())
def rnn_layer(x: torch.Tensor, lengths: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, w_ih: torch.Tensor,
              w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor, mode: str, hidden_size: int,
              bidirectional: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One RNN layer over the padded ``x`` [T, B, F] with per-sequence ``lengths``: (output [T, B, D*H] with
    zeros past each length, h_n [D, B, H], c_n [D, B, H] (h_n again but for LSTM)). Weights are PyTorch's,
    stacked over the D directions."""
    packed = _PACK(x, lengths.detach().cpu().to(torch.int64), enforce_sorted=False)
    order, back = packed.sorted_indices, packed.unsorted_indices
    weights = [t[d] for d in range(w_ih.shape[0]) for t in (w_ih, w_hh, b_ih, b_hh)]
    h = h0.index_select(1, order.to(h0.device))
    args = (packed.data, packed.batch_sizes)
    rest = (weights, True, 1, 0.0, False, bidirectional)
    if mode == "LSTM":
        out, h_n, c_n = torch._VF.lstm(*args, (h, c0.index_select(1, order.to(c0.device))), *rest)
    else:
        kernel = {"GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh, "RNN_RELU": torch._VF.rnn_relu}[mode]
        out, h_n = kernel(*args, h, *rest)
        c_n = h_n
    padded, _ = _PAD(rnn_utils.PackedSequence(out, packed.batch_sizes, order, back), total_length=x.shape[0])
    back = back.to(h_n.device)
    return padded, h_n.index_select(1, back), c_n.index_select(1, back)


@rnn_layer.register_fake
def _(x, lengths, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, hidden_size, bidirectional):
    d = 2 if bidirectional else 1
    state = x.new_empty((d, x.shape[1], hidden_size))
    return x.new_empty((x.shape[0], x.shape[1], d * hidden_size)), state, torch.empty_like(state)


def _gate_rows(mode: str, hidden: int) -> list[int]:
    return [g * hidden + i for g in _ONNX_GATE_ORDER[mode] for i in range(hidden)]


def translation(opset: int):
    """The ``custom_translation_table`` function of :data:`rnn_layer` for the dynamo exporter (onnxscript)."""
    from onnxscript import values

    op = values.Opset("", opset)

    def rnn_layer_onnx(x, lengths, h0, c0, w_ih, w_hh, b_ih, b_hh, mode: str, hidden_size: int,
                       bidirectional: bool):
        rows = op.Constant(value_ints=_gate_rows(mode, hidden_size))
        w, r = op.Gather(w_ih, rows, axis=1), op.Gather(w_hh, rows, axis=1)
        b = op.Concat(op.Gather(b_ih, rows, axis=1), op.Gather(b_hh, rows, axis=1), axis=1)
        seq = op.Cast(lengths, to=6)  # INT32
        kw = {"hidden_size": hidden_size, "direction": "bidirectional" if bidirectional else "forward"}
        d = 2 if bidirectional else 1
        if mode == "LSTM":
            y, y_h, y_c = op.LSTM(x, w, r, b, seq, h0, c0, **kw)
        elif mode == "GRU":
            y, y_h = op.GRU(x, w, r, b, seq, h0, linear_before_reset=1, **kw)
            y_c = op.Identity(y_h)
        else:
            y, y_h = op.RNN(x, w, r, b, seq, h0, activations=["Relu" if mode == "RNN_RELU" else "Tanh"] * d, **kw)
            y_c = op.Identity(y_h)
        y = op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, d * hidden_size]))
        return y, y_h, y_c

    return rnn_layer_onnx


def translation_table(opset: int) -> dict:
    return {torch.ops.onnxport_packed.rnn_layer.default: translation(opset)}


def torchscript_symbolic(g, x, lengths, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, hidden_size, bidirectional):
    """The same nodes for the TorchScript exporter (``register_custom_op_symbolic``)."""
    from torch.onnx import symbolic_helper as sh

    mode, hidden = sh._parse_arg(mode, "s"), sh._parse_arg(hidden_size, "i")
    bidirectional = bool(sh._parse_arg(bidirectional, "b"))
    rows = g.op("Constant", value_t=torch.tensor(_gate_rows(mode, hidden), dtype=torch.int64))
    w, r = g.op("Gather", w_ih, rows, axis_i=1), g.op("Gather", w_hh, rows, axis_i=1)
    b = g.op("Concat", g.op("Gather", b_ih, rows, axis_i=1), g.op("Gather", b_hh, rows, axis_i=1), axis_i=1)
    seq = g.op("Cast", lengths, to_i=6)
    kw = {"hidden_size_i": hidden, "direction_s": "bidirectional" if bidirectional else "forward"}
    d = 2 if bidirectional else 1
    if mode == "LSTM":
        y, y_h, y_c = g.op("LSTM", x, w, r, b, seq, h0, c0, outputs=3, **kw)
    else:
        if mode == "GRU":
            y, y_h = g.op("GRU", x, w, r, b, seq, h0, linear_before_reset_i=1, outputs=2, **kw)
        else:
            act = ["Relu" if mode == "RNN_RELU" else "Tanh"] * d
            y, y_h = g.op("RNN", x, w, r, b, seq, h0, activations_s=act, outputs=2, **kw)
        y_c = g.op("Identity", y_h)
    y = g.op("Reshape", g.op("Transpose", y, perm_i=[0, 2, 1, 3]),
             g.op("Constant", value_t=torch.tensor([0, 0, -1], dtype=torch.int64)))  # its shape inference wants -1
    return y, y_h, y_c


# --------------------------------------------------------------------------- the stand-ins


def _pack(input, lengths, batch_first=False, enforce_sorted=True):  # noqa: A002 - PyTorch's signature
    """The padded steps and the lengths as they are: ONNX's recurrent ops take them in any order."""
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.as_tensor(lengths, dtype=torch.int64)
    data = input.transpose(0, 1) if batch_first else input
    return Padded(data, lengths.to(torch.int64))


def _pad(sequence, batch_first=False, padding_value=0.0, total_length=None):
    if not isinstance(sequence, Padded):
        return _PAD(sequence, batch_first, padding_value, total_length)
    y, lengths = sequence.data, sequence.lengths
    steps = torch.arange(y.shape[0], device=y.device).unsqueeze(1)
    y = torch.where((steps < lengths.to(y.device).unsqueeze(0)).unsqueeze(-1), y, padding_value)
    if total_length is None:
        y = y[: lengths.max()]  # the longest sequence, as PyTorch pads
    else:  # cut, then pad what is missing (no comparison: the sizes may be symbolic)
        y = y[:total_length]
        y = torch.nn.functional.pad(y, (0, 0, 0, 0, 0, total_length - y.shape[0]), value=padding_value)
    return (y.transpose(0, 1) if batch_first else y), lengths


_SEEN: list[nn.Module] = []


def _forward(cls: type):
    original = _FORWARD[cls]

    def forward(self, input, hx=None):  # noqa: A002 - nn.RNNBase's signature
        if not isinstance(input, Padded):
            return original(self, input, hx)
        _SEEN.append(self)
        return _run(self, input, hx)

    return forward


def _run(module: nn.RNNBase, seq: Padded, hx):
    """The stacked layers of ``module`` over ``seq``: (Padded output, h_n) or (Padded output, (h_n, c_n))."""
    if getattr(module, "proj_size", 0):
        raise NotImplementedError("LSTM with proj_size: ONNX LSTM has no projection")
    mode = module.mode if not isinstance(module, nn.RNN) else f"RNN_{module.nonlinearity.upper()}"
    d, hidden, layers = (2 if module.bidirectional else 1), module.hidden_size, module.num_layers
    x = seq.data
    h0, c0 = hx if isinstance(hx, tuple) else (hx, None)
    if h0 is None:
        h0 = x.new_zeros((layers * d, x.shape[1], hidden))
    if c0 is None:
        c0 = torch.zeros_like(h0)
    hs, cs = [], []
    for layer in range(layers):
        names = [f"_l{layer}{'_reverse' if k else ''}" for k in range(d)]
        w_ih, w_hh = (torch.stack([getattr(module, f"weight_{w}{n}") for n in names]) for w in ("ih", "hh"))
        if module.bias:
            b_ih, b_hh = (torch.stack([getattr(module, f"bias_{w}{n}") for n in names]) for w in ("ih", "hh"))
        else:
            b_ih = b_hh = w_ih.new_zeros((d, w_ih.shape[1]))
        part = slice(layer * d, (layer + 1) * d)
        x, h, c = rnn_layer(x, seq.lengths, h0[part], c0[part], w_ih, w_hh, b_ih, b_hh, mode, hidden,
                            module.bidirectional)
        hs.append(h)
        cs.append(c)
    out = Padded(x, seq.lengths)
    h_n = torch.cat(hs)
    return (out, (h_n, torch.cat(cs))) if mode == "LSTM" else (out, h_n)


# --------------------------------------------------------------------------- patching


def _swap(table: dict) -> list[tuple[dict, str, object]]:
    """Replace every module-level binding of a key of ``table`` by its value; what to put back."""
    done = []
    for mod in list(sys.modules.values()):
        names = getattr(mod, "__dict__", None)
        if not isinstance(names, dict) or names is globals():
            continue
        for key, value in list(names.items()):
            if callable(value) and any(value is k for k in table):
                names[key] = table[value]
                done.append((names, key, value))
    return done


@contextlib.contextmanager
def rewritten() -> Iterator[list[nn.Module]]:
    """While active, packed sequences take the ``rnn_layer`` path; yields the RNN modules it ran."""
    _SEEN.clear()
    swapped = _swap({_PACK: _pack, _PAD: _pad})
    try:
        for cls in _RNNS:
            cls.forward = _forward(cls)
        yield _SEEN
    finally:
        for cls in _RNNS:
            cls.forward = _FORWARD[cls]
        for names, key, value in swapped:
            names[key] = value


@dataclass
class Rewrite:
    """What an exporter adds while :func:`applied` is active: translations and the diagnostic."""

    table: dict
    diagnostics: list[Diagnostic]


@contextlib.contextmanager
def applied(loaded: LoadedModel, opset: int, exporter: str = "dynamo") -> Iterator[Rewrite]:
    """The rewrite for one export of ``loaded`` by ``exporter`` ("dynamo" or "torchscript"), when the model
    packs sequences (:func:`find`); else nothing changes."""
    modules = find(loaded)
    if not modules:
        yield Rewrite({}, [])
        return
    name = f"{NAMESPACE}::rnn_layer"
    if exporter == "torchscript":
        torch.onnx.register_custom_op_symbolic(name, torchscript_symbolic, 9)
    try:
        with rewritten():
            yield Rewrite(translation_table(opset) if exporter == "dynamo" else {}, [diagnostic(modules)])
    finally:
        if exporter == "torchscript":
            torch.onnx.unregister_custom_op_symbolic(name, 9)


# --------------------------------------------------------------------------- detection


def find(loaded: LoadedModel) -> tuple[str, ...]:
    """The RNN modules ``loaded`` feeds a packed sequence, found by one run at the export sizes with the
    rewrite active whose outputs match the model's own (once per model: sources.base.memoized)."""
    return memoized(loaded, "packed_rnns", lambda: _find(loaded))


def _find(loaded: LoadedModel) -> tuple[str, ...]:
    found: tuple[str, ...] = ()
    if any(isinstance(m, _RNNS) for m in loaded.model.modules()):
        example = make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)
        names = {id(m): n for n, m in loaded.model.named_modules()}
        try:
            with torch.inference_mode():
                with rewritten() as seen:
                    got = loaded.flat(*example)
                    ran = list(dict.fromkeys(names.get(id(m), "") for m in seen))
                want = loaded.flat(*example)
            if ran and all(a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-4, equal_nan=True)
                           for a, b in zip(got, want)):
                found = tuple(ran)
        except Exception:  # noqa: BLE001 - a model the rewrite does not fit exports (or fails) as before
            found = ()
    return found


def diagnostic(modules: tuple[str, ...]) -> Diagnostic:
    names = ", ".join(f"`{m}`" if m else "the model" for m in modules)
    return info(CODE, f"packed sequences through {names} exported as ONNX recurrent ops with sequence_lens",
                module=modules[0] or None,
                hint="pack_padded_sequence / pad_packed_sequence were replaced by the lengths while exporting")
