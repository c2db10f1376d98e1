"""The encoder-decoder as three ONNX files in Optimum's layout (dynamo exporter; dynamic batch, source, decoder
tokens and past), all at the newest opset onnxruntime runs: ``encoder_model.onnx``, ``decoder_model.onnx``
(the first step) and ``decoder_with_past_model.onnx``; library code the exporter cannot trace is patched for
the export only (:mod:`.patches`)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch
from torch import nn

from onnxport.core.errors import ExportFailed, one_line
from onnxport.core.logs import captured_output
from onnxport.core.onnxfile import external_threshold, remove_model, state_bytes
from onnxport.decoder.export import MAX_BATCH, cache_opsets, worth_trying
from onnxport.exporters.evidence import first_line
from onnxport.exporters.opsets import lower_opsets
from onnxport.runtime.sessions import session
from onnxport.seq2seq.feeds import decoder_ids, encoder_inputs, first_inputs, random_cache, with_past_inputs
from onnxport.seq2seq.layout import Encoder, FirstStep, WithPast
from onnxport.seq2seq.patches import export_patches
from onnxport.seq2seq.records import DECODER_FILE, ENCODER_FILE, WITH_PAST_FILE, Seq2SeqExport, Seq2SeqLayout

EXAMPLE = {"batch": 2, "source": 5, "past": 4, "new": 3}  # never 0 or 1, all different (docs/architecture.md)


def _dims(layout: Seq2SeqLayout) -> dict:
    dim = torch.export.Dim
    source = dim("source", min=1, max=layout.max_source) if layout.dynamic else None
    return {"batch": dim("batch", min=1, max=MAX_BATCH), "source": source,
            "encoded": dim("encoded", min=1, max=layout.max_source) if layout.subsampled and source else source,
            "seq": dim("seq", min=1, max=layout.max_length),
            "past": dim("past", min=1, max=layout.max_length - 1)}


def _axes(batch, second=None, axis: int = 1) -> dict:
    return {0: batch} if second is None else {0: batch, axis: second}


def _example(model: nn.Module, layout: Seq2SeqLayout) -> tuple[list, torch.Tensor]:
    """The encoder's example inputs and its output on them: a source whose length, and whose encoder output's
    length, differ from every other example size (a subsampling encoder's output is shorter)."""
    taken = set(EXAMPLE.values()) - {EXAMPLE["source"]}
    encoder = Encoder(model, layout).eval()
    for source in (EXAMPLE["source"], 23, 41, 97, layout.max_source):
        enc = encoder_inputs(layout, EXAMPLE["batch"], min(source, layout.max_source), padded=True)
        with torch.inference_mode():
            states = encoder(*enc)
        if not layout.dynamic or not ({enc[0].shape[1], states.shape[1]} & taken):
            break
    return enc, states


def _files(model: nn.Module, layout: Seq2SeqLayout, folder: Path):
    """(path, wrapper, example inputs, input names, output names, dynamic shapes) of each file."""
    d, ex = _dims(layout), EXAMPLE
    enc, states = _example(model, layout)
    states = torch.randn(states.shape)
    mask = enc[1] if layout.encoder_mask else None
    cache = random_cache(layout, ex["batch"], ex["past"], states.shape[1])
    b, s, e = d["batch"], d["source"], d["encoded"]
    source_axis = 1 + layout.source_dims.index("source") if layout.dynamic else 1
    enc_shapes = tuple(_axes(b, s, source_axis if i == 0 else 1) for i in range(len(enc)))
    mask_shape = (_axes(b, s),) if layout.encoder_mask else ()
    cache_shapes = tuple(_axes(b, d["past"] if i % 4 < 2 else e, 2) for i in range(4 * layout.layers))
    return (
        (folder / ENCODER_FILE, Encoder(model, layout), enc, layout.encoder_inputs, ("last_hidden_state",),
         (enc_shapes,)),
        (folder / DECODER_FILE, FirstStep(model, layout),
         first_inputs(layout, decoder_ids(layout, ex["batch"], ex["new"]), states, mask),
         layout.decoder_inputs, layout.decoder_outputs, (_axes(b, d["seq"]), _axes(b, e)) + mask_shape),
        (folder / WITH_PAST_FILE, WithPast(model, layout),
         with_past_inputs(layout, decoder_ids(layout, ex["batch"], ex["new"]), mask, cache),
         layout.with_past_inputs, layout.with_past_outputs, (_axes(b, d["seq"]), mask_shape + cache_shapes)),
    )


def export_seq2seq(model: nn.Module, layout: Seq2SeqLayout, folder: str | Path, *, opset: int | None = None
                   ) -> Seq2SeqExport:
    """Export the three files into ``folder``; without ``opset`` the newest opset at which onnxruntime runs all
    three (newer ones are listed in ``tried``)."""
    folder = Path(folder)
    versions = cache_opsets(opset)
    files = _files(model, layout, folder)
    t0 = time.perf_counter()
    reasons: list[str] = []

    def build(version: int) -> Path:
        for path, wrapper, example, names, outputs, shapes in files:
            try:
                _export_once(model, wrapper, tuple(example), names, outputs, shapes, path, version)
            except Exception as e:  # noqa: BLE001 - torch.export fails alike at every opset
                raise ExportFailed(f"{path.name} could not be exported at opset {version}: {first_line(e)}",
                                   "export the plain forward with --input, or report the model",
                                   code="export-failed") from None
        return folder

    def why_not(version: int, _: Path) -> str | None:  # an opset the user gave is kept as it is
        reason = None if opset is not None else ort_cannot_run(files)
        reasons.append(reason or "")
        return reason

    with export_patches(model) as patches:
        kept, rejected = lower_opsets(worth_trying(versions, reasons), build, why_not)
    tried = tuple(f"opset {version}: {reason}" for version, _, reason in rejected)
    if kept is None:
        raise ExportFailed(f"the encoder-decoder could not be exported ({'; '.join(tried)})",
                           "try another --opset, or export the plain forward with --input", code="export-failed")
    return Seq2SeqExport(tuple(f[0] for f in files), kept[0], time.perf_counter() - t0, tried, patches)


def _export_once(model: nn.Module, wrapper: nn.Module, example: tuple, names, outputs, shapes, path: Path,
                 opset: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_model(path)
    chatter: list[str] = []
    with warnings.catch_warnings(), captured_output(chatter), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(wrapper.eval(), example, dynamo=True, dynamic_shapes=shapes,
                                    input_names=list(names), output_names=list(outputs), opset_version=opset,
                                    optimize=True, verbose=False)
        program.save(str(path), external_data=state_bytes(model) > external_threshold())


def _first_line(e: BaseException) -> str:
    return one_line(getattr(e, "message", e), 240) or type(e).__name__


def ort_cannot_run(files) -> str | None:
    """Why onnxruntime cannot load or run one of the files on its example (None when it runs all three)."""
    for path, _, example, names, _, _ in files:
        try:
            sess = session(path, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - any refusal is the answer
            return f"onnxruntime cannot load {path.name}: {_first_line(e)}"
        try:
            sess.run(None, {n: t.numpy() for n, t in zip(names, example)})
        except Exception as e:  # noqa: BLE001
            return f"onnxruntime cannot run {path.name}: {_first_line(e)}"
    return None
