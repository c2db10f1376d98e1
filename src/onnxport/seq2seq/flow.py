"""The encoder-decoder entry points: load a local model, export its three files with their cache, prove them,
and keep the proven names only when everything passes (else ``*.unverified.onnx``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from torch import nn

from onnxport.core.errors import UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import move_model, remove_model
from onnxport.core.records import FP32, Tolerance
from onnxport.core.spec import InputSpec
from onnxport.decoder.exportable import upcast
from onnxport.decoder.records import CacheVariants
from onnxport.optimize.registry import chosen
from onnxport.seq2seq.export import export_seq2seq
from onnxport.seq2seq.generation import open_sessions
from onnxport.seq2seq.kind import SEQ2SEQ
from onnxport.seq2seq.layout import NO_CACHE_HINT, is_seq2seq, seq2seq_layout
from onnxport.seq2seq.prove import NEW_TOKENS, prove_seq2seq
from onnxport.seq2seq.records import FILES, WITH_PAST_FILE, Seq2SeqLayout, Seq2SeqOutcome, final_name
from onnxport.seq2seq.source import describe
from onnxport.seq2seq.variants import optimize_seq2seq
from onnxport.sources.base import LoadedModel, count_parameters
from onnxport.sources.hf import hf_model

MAX_LENGTH = 128  # decoder tokens the self-attention cache holds
MAX_SOURCE = 512  # source tokens (capped by the model's positions)
SEQ2SEQ_TASKS = ("text2text-generation", "text2text-generation-with-past", "automatic-speech-recognition",
                 "translation", "summarization", "image-to-text")


def wants_seq2seq(source: str, task: str | None) -> bool:
    """Whether a pipeline source gets the encoder-decoder export with its cache: an ``hf:DIR`` whose
    ``config.json`` names an encoder-decoder, with ``--task`` left out or a sequence-to-sequence task."""
    if not source.startswith("hf:") or (task is not None and task not in SEQ2SEQ_TASKS):
        return False
    return is_seq2seq(source.split(":", 1)[1])


def load(source: str, *, trust_remote_code: bool = False, **_: object) -> LoadedModel:
    """The encoder-decoder in ``hf:DIR`` (local only), loaded by the one ``hf:DIR`` loader
    (:func:`onnxport.sources.hf.hf_model`) with the class its config names and its cache kept; its inputs are the
    encoder's. (The plain loader also runs the model's forward, which needs decoder inputs here.)"""
    path = Path(source.split(":", 1)[1])
    if not is_seq2seq(path):
        raise UsageError(f"{path} holds no encoder-decoder that generates", NO_CACHE_HINT)
    model = hf_model(path, trust_remote_code=trust_remote_code).eval()
    config, arch = model.config, type(model).__name__
    found = describe(model)
    inputs = (InputSpec(found.name, "int64" if found.name == "input_ids" else "float32", ("batch", *found.dims)),
              *(InputSpec(n, "int64", ("batch", "source")) for n in found.masks_named))
    return LoadedModel(source=source, name=arch, kind="hf", model=model, flat=model, inputs=inputs, dims={},
                       output_names=("logits",), parameters=count_parameters(model),
                       extra={"model_type": getattr(config, "model_type", None), "architecture": arch})


def run(model_dir: str | Path, out: str | Path, **kw) -> Seq2SeqOutcome:
    """Load the encoder-decoder in ``model_dir`` (local only, as ``hf:DIR``) and hand it to :func:`run_model`."""
    trust = bool(kw.pop("trust_remote_code", False))
    return run_model(load(f"hf:{model_dir}", trust_remote_code=trust).model, out, **kw)


def prepared(model: nn.Module, max_length: int, max_source: int, new_tokens: int) -> Seq2SeqLayout:
    """``model`` in eval mode and float32 (a bfloat16 / float16 one upcast, exactly) and the layout of its three
    files at ``max_length`` decoder tokens and ``max_source`` source tokens; a length that leaves no room for
    ``new_tokens`` generated tokens is a UsageError."""
    model.eval()
    upcast(model)
    layout = seq2seq_layout(model, max_length, max_source)
    if new_tokens < 1 or new_tokens > max_length:
        raise UsageError(f"--max-length {max_length} leaves no room for {new_tokens} generated tokens",
                         f"give --max-length {new_tokens} or more")
    return layout


def run_model(model: nn.Module, out: str | Path, *, max_length: int = MAX_LENGTH, max_source: int = MAX_SOURCE,
              opset: int | None = None, tolerance: Tolerance = FP32, new_tokens: int = NEW_TOKENS,
              progress: Progress = noop, variants: CacheVariants | None = None) -> Seq2SeqOutcome:
    """Export ``model`` (a transformers encoder-decoder) as ``encoder_model.onnx``, ``decoder_model.onnx`` and
    ``decoder_with_past_model.onnx`` into ``out`` and prove them: step cases against PyTorch and greedy
    generation against ``model.generate``. The files keep these names only when every check passes, else
    they are written as ``*.unverified.onnx``. A model in bfloat16 / float16 is upcast to float32 (exactly).
    With ``variants`` (its ``names``: "auto", "all" or names; None: none) proven files get their optimized
    variants in ``out/variants/<name>/`` (:func:`~onnxport.seq2seq.variants.optimize_seq2seq`, with the
    record's budget and threads)."""
    variants = variants or CacheVariants()
    names = chosen(variants.names, SEQ2SEQ)  # an unknown name fails before the (slow) export
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layout = prepared(model, max_length, max_source, new_tokens)
    progress(f"exporting the encoder and the decoder with its cache ({layout.layers} layers, {layout.heads} heads, "
             f"up to {max_length} decoder tokens)")
    with tempfile.TemporaryDirectory(prefix=".onnxport-seq2seq-", dir=out) as work:
        made = export_seq2seq(model, layout, Path(work), opset=opset)
        progress(f"proving at opset {made.opset}: step cases and greedy generation against PyTorch")
        proof = prove_seq2seq(model, layout, open_sessions(work, paths=made.paths), tolerance=tolerance,
                              new_tokens=new_tokens)
        keep_files(Path(work), out, proof.passed)
    built = None
    if names and proof.passed:
        built = optimize_seq2seq(model, layout, out, out, names=names, tolerance=tolerance,
                                 threads=variants.threads, budget_s=variants.budget_s, progress=progress)
    return Seq2SeqOutcome(out, layout, made, proof, built)


def keep_files(work: Path, out: Path, proven: bool) -> Path:
    """The three files moved from ``work`` into ``out`` under the names their proof earns (``*.unverified.onnx``
    when not proven), any earlier ones removed; the decoder with past (the file every generated token runs)."""
    for name in FILES:
        remove_model(out / final_name(name, True))
        remove_model(out / final_name(name, False))
        move_model(work / name, out / final_name(name, proven))
    return out / final_name(WITH_PAST_FILE, proven)
