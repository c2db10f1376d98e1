"""The decoder with its KV cache as ONE ONNX model (dynamo exporter, dynamic batch / seq / past / total), at the
newest opset onnxruntime can run."""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from onnxport.core.errors import ExportFailed, UsageError, one_line
from onnxport.core.logs import captured_output
from onnxport.core.onnxfile import external_threshold, remove_model, state_bytes
from onnxport.decoder.exportable import exportable
from onnxport.decoder.layout import CachedDecoder, step_inputs
from onnxport.decoder.records import CacheLayout, DecoderExport
from onnxport.exporters.evidence import first_line
from onnxport.exporters.opsets import MIN_OPSET, default_opset, exporter_max_opset, lower_opsets, op_version
from onnxport.runtime.sessions import session

EXAMPLE = {"batch": 2, "past": 5, "new": 3}  # never 0 or 1, all different (docs/architecture.md)
MAX_BATCH = 64
OPSET_TRIES = 4  # newest first, until onnxruntime runs one


def dynamic_shapes(layout: CacheLayout) -> tuple:
    """torch.export dims: batch, seq (new tokens), past (0..max-1) and total (the mask: past + seq)."""
    dim = torch.export.Dim
    batch = dim("batch", min=1, max=MAX_BATCH)
    seq = dim("seq", min=1, max=layout.max_length)
    past = dim("past", min=0, max=layout.max_length - 1)
    total = dim("total", min=1, max=layout.max_length)
    rest = (({0: batch, 1: seq},) if layout.position_ids else ()) + tuple(
        {0: batch, 2: past} for _ in range(2 * layout.layers))
    return ({0: batch, 1: seq}, {0: batch, 1: total}, rest)  # CachedDecoder.forward(ids, mask, *rest)


def export_decoder(model: nn.Module, layout: CacheLayout, path: str | Path, *, opset: int | None = None
                   ) -> DecoderExport:
    """Export ``model`` with its cache to ``path``; without ``opset`` the newest opset whose export
    onnxruntime runs at past 0 and past > 0 (newer ones are listed in ``tried``)."""
    path = Path(path)
    versions = cache_opsets(opset)
    t0 = time.perf_counter()
    reasons: list[str] = []

    def build(version: int) -> Path:
        try:
            _export_once(model, layout, path, version)
        except Exception as e:  # noqa: BLE001 - torch.export fails alike at every opset
            raise ExportFailed(f"the decoder with its cache could not be exported at opset {version}: "
                               f"{first_line(e)}", _export_hint(e), code="export-failed") from None
        return path

    def why_not(version: int, _: Path) -> str | None:  # an opset the user gave is kept as it is
        reason = None if opset is not None else ort_cannot_run(path, layout)
        reasons.append(reason or "")
        return reason

    with exportable(model, layout.max_length) as (experts, notes):
        kept, rejected = lower_opsets(worth_trying(versions, reasons), build, why_not)
    tried = tuple(f"opset {version}: {reason}" for version, _, reason in rejected)
    if kept is not None:
        return DecoderExport(path, kept[0], time.perf_counter() - t0, tried, experts=experts, notes=tuple(notes))
    raise ExportFailed(f"the decoder with its cache could not be exported ({'; '.join(tried)})",
                       "a kernel onnxruntime lacks at every opset tried: report the model, or export without a "
                       "cache" if MISSING_KERNEL.search(tried[-1] if tried else "") else
                       "try another --opset, or export without a cache", code="export-failed")


MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\)")


def cache_opsets(opset: int | None) -> list[int]:
    """The opsets an export with a cache tries, newest first: ``opset`` alone when given (a UsageError when the
    exporter or onnxruntime cannot take it), else the newest ``OPSET_TRIES`` + 1 down to MIN_OPSET."""
    newest = default_opset("dynamo")
    if opset is not None and not MIN_OPSET <= opset <= min(newest, exporter_max_opset("dynamo")):
        raise UsageError(f"opset {opset} is not supported here (newest usable: {newest})",
                         f"pick an opset between {MIN_OPSET} and {newest}, or leave --opset out")
    return [opset] if opset is not None else list(range(newest, max(MIN_OPSET, newest - OPSET_TRIES) - 1, -1))


def worth_trying(candidates: Iterable[int], reasons: list[str]) -> Iterator[int]:
    """``candidates`` less those that would bring the very kernel onnxruntime lacked last (``reasons``: why each
    rejected opset was, read as the candidates are drawn)."""
    for version in candidates:
        if not reasons or not same_kernel(reasons[-1], version):
            yield version


def same_kernel(reason: str, version: int) -> bool:
    """Whether ``reason`` is onnxruntime lacking a kernel for an operator (``Mul(14)``) that opset ``version``
    still uses at the same operator version: exporting at that opset would meet the same refusal."""
    found = MISSING_KERNEL.search(reason)
    return found is not None and op_version(found.group(1), version) == int(found.group(2))


def _export_hint(e: BaseException) -> str:
    """What to do when torch.export fails on the decoder: a data-dependent guard is a Python branch on a tensor
    value in the model's code (the message names the expression)."""
    if "GuardOnDataDependentSymNode" in type(e).__name__ + str(e)[:200]:
        return ("the model branches on a tensor's value (a data-dependent guard) inside its forward; export it "
                "without a cache, or report the model with this message")
    return "export it without a cache, or report the model"


def _export_once(model: nn.Module, layout: CacheLayout, path: Path, opset: int) -> None:
    wrapper = CachedDecoder(model, layout).eval()
    example = step_inputs(layout, batch=EXAMPLE["batch"], past=EXAMPLE["past"], new=EXAMPLE["new"])
    size = state_bytes(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_model(path)
    chatter: list[str] = []
    with warnings.catch_warnings(), captured_output(chatter), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(wrapper, tuple(example), dynamo=True, dynamic_shapes=dynamic_shapes(layout),
                                    input_names=list(layout.input_names), output_names=list(layout.output_names),
                                    opset_version=opset, optimize=True, verbose=False)
        program.save(str(path), external_data=size > external_threshold())


def ort_cannot_run(path: Path, layout: CacheLayout) -> str | None:
    """Why onnxruntime cannot load ``path`` or run it on a prompt (past 0) and on a step with a cache (None
    when it can)."""
    try:
        sess = session(path, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        return f"onnxruntime cannot load it: {_first_line(e)}"
    for past, new in ((0, 3), (EXAMPLE["past"], 1)):
        feeds = step_inputs(layout, batch=1, past=past, new=new)
        try:
            sess.run(None, {n: t.numpy() for n, t in zip(layout.input_names, feeds)})
        except Exception as e:  # noqa: BLE001
            return f"onnxruntime cannot run it at past {past}: {_first_line(e)}"
    return None


def _first_line(e: BaseException) -> str:
    """An onnxruntime error on one line (an onnxport error's message without its hint), or its type."""
    return one_line(getattr(e, "message", e), 240) or type(e).__name__
