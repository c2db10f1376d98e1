"""The encoder-decoder family's registration (docs/architecture.md, "Model families"): an encoder-decoder in
``hf:DIR`` exported with its cache as three files (docs/seq2seq.md), run through the one pipeline's stages with its
parts (:mod:`onnxport.seq2seq.hooks`)."""

from __future__ import annotations

import re
from pathlib import Path

from onnxport.core.outdir import VARIANTS_DIR
from onnxport.families import PIPELINE_STAGES, Family
from onnxport.seq2seq.flow import load, wants_seq2seq
from onnxport.seq2seq.hooks import HOOKS
from onnxport.seq2seq.kind import SEQ2SEQ
from onnxport.seq2seq.outcome import SECTION
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout
from onnxport.seq2seq.stage import checked
from onnxport.seq2seq.triton import repository_entry

_NAME = re.compile(r"[A-Za-z0-9\-]([A-Za-z0-9_.\-]*[A-Za-z0-9\-])?")  # a folder name as serve names models


def served_file(out: Path, report: object = None) -> Path | None:
    """The file serve and triton take from an encoder-decoder's output folder: its decoder with past, the file
    every generated token runs (the encoder and the first step are opened beside it): the one in
    ``variants/<name>/`` when report.json's ``seq2seq.variants.best`` names a variant whose three files are
    there, else the proven one (None when there is none: an unproven export keeps ``*.unverified.onnx``)."""
    proven = out / WITH_PAST_FILE
    if not proven.is_file():
        return None
    section = report.get(SECTION) if isinstance(report, dict) else None
    variants = section.get("variants") if isinstance(section, dict) else None
    best = variants.get("best") if isinstance(variants, dict) else None
    if not isinstance(best, str) or best == "export" or not _NAME.fullmatch(best):
        return proven
    folder = out / VARIANTS_DIR / best
    return folder / WITH_PAST_FILE if all((folder / f).is_file() for f in FILES) else proven


FAMILY = Family(
    "seq2seq", PIPELINE_STAGES, detects=wants_seq2seq, refuse=checked,
    load=load, check_seq=False, variant_kind=SEQ2SEQ, section=SECTION, layout=Seq2SeqLayout.from_dict,
    extension="onnxport.seq2seq.serving:EXTENSION",
    served=served_file, files=FILES, repository=repository_entry,
    scratch=True, hooks=HOOKS,  # the one pipeline's stages, its export, proof, variants and section through HOOKS
)
