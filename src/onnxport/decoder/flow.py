"""The decoder entry points: load a local causal LM, export it with its KV cache, prove it, and write
``model.onnx`` only when proven (else ``model.unverified.onnx``)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from onnxport.core.errors import UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import move_model
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.export import export_decoder
from onnxport.decoder.exportable import upcast
from onnxport.decoder.layout import NO_CACHE_HINT, architectures, cache_layout, is_causal_lm
from onnxport.decoder.prove import NEW_TOKENS, prove_decoder
from onnxport.decoder.records import CacheLayout, CacheVariants, DecoderOutcome
from onnxport.decoder.variants import optimize_decoder, variant_names
from onnxport.optimize.passes import install_best
from onnxport.optimize.registry import BASELINE
from onnxport.runtime.binding import CPU_TARGET, Target

Names = Sequence[str] | str | None  # None: no variants; "auto", "all" or names of the decoder kind

MAX_LENGTH = 128


CACHE_TASKS = ("text-generation", "text-generation-with-past")


def wants_cache(source: str, task: str | None) -> bool:
    """Whether a pipeline source gets the decoder export with a KV cache: an ``hf:DIR`` source whose
    ``config.json`` names a causal LM, with ``--task`` left out or a text-generation task."""
    if not source.startswith("hf:") or (task is not None and task not in CACHE_TASKS):
        return False
    return is_causal_lm(source.split(":", 1)[1])


def run(model_dir: str | Path, out: str | Path, *, max_length: int = MAX_LENGTH, opset: int | None = None,
        tolerance: Tolerance = FP32, new_tokens: int = NEW_TOKENS, trust_remote_code: bool = False,
        variants: CacheVariants | None = None, progress: Progress = noop) -> DecoderOutcome:
    """Load the causal LM in ``model_dir`` (local only, as ``hf:DIR``) and hand it to :func:`run_model`."""
    from onnxport.sources.hf import load_hf

    if (Path(model_dir) / "config.json").is_file() and not is_causal_lm(model_dir):
        named = ", ".join(architectures(model_dir)) or "no architecture"
        raise UsageError(f"{model_dir} holds {named}, not a causal language model: no KV cache to export",
                         NO_CACHE_HINT)
    progress(f"loading {model_dir}")
    loaded = load_hf(f"hf:{model_dir}", [], [], task="text-generation", trust_remote_code=trust_remote_code)
    return run_model(loaded.model, out, max_length=max_length, opset=opset, tolerance=tolerance,
                     new_tokens=new_tokens, variants=variants, progress=progress)


def prepared(model: nn.Module, max_length: int, new_tokens: int, progress: Progress = noop
             ) -> tuple[CacheLayout, str | None]:
    """``model`` made ready for its export with a cache: in eval mode, upcast to float32 in place when in
    bfloat16 or float16 (exactly; the dtype it had is returned), and its cache layout for ``max_length`` tokens.
    A model without a standard cache, or a ``max_length`` that leaves no room for a prompt and ``new_tokens``,
    is a UsageError before anything is exported."""
    model.eval()
    source_dtype = upcast(model)  # a bfloat16 / float16 checkpoint is exported and proven in float32
    layout = cache_layout(model, max_length)
    if new_tokens < 1 or max_length - new_tokens < 1:
        raise UsageError(f"--max-length {max_length} leaves no room for a prompt and {new_tokens} generated tokens",
                         f"give --max-length {new_tokens + 5} or more")
    progress(f"exporting with the KV cache ({layout.layers} layers, {layout.kv_heads} kv heads, "
             f"up to {max_length} tokens)")
    return layout, source_dtype


def _names(variants: Names | bool) -> Names:
    """The variant names asked for (True, an older spelling: "all"; False: none)."""
    if isinstance(variants, bool):
        return "all" if variants else None
    return variants


def run_model(model: nn.Module, out: str | Path, *, max_length: int = MAX_LENGTH, opset: int | None = None,
              tolerance: Tolerance = FP32, new_tokens: int = NEW_TOKENS, progress: Progress = noop,
              variants: CacheVariants | None = None, target: Target = CPU_TARGET) -> DecoderOutcome:
    """Export ``model`` (a transformers causal LM in eval mode) with its cache into ``out`` and prove it: step
    cases against PyTorch and greedy generation against ``model.generate``. ``out/model.onnx`` is written only
    when every check passes, else ``out/model.unverified.onnx``. A model in bfloat16 or float16 is upcast to
    float32 in place (exactly) and exported and proven in float32. A model without a standard cache, or a
    ``max_length`` it cannot take, is a UsageError before anything is exported. With ``variants`` (its
    ``names``: "auto", "all" or names of the decoder kind; None: none) a proven export gets its optimized
    variants in ``out/variants/`` (:func:`optimize_decoder`, with the record's budget, threads and ``seq``) and
    the best one, when not the export itself, is copied to ``out/best.onnx``. ``target``: where the proof and
    the variants run (the export is made on the CPU)."""
    variants = variants or CacheVariants()
    names = _names(variants.names)
    if names is not None:
        variant_names(names)  # an unknown name fails before the (slow) export
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layout, source_dtype = prepared(model, max_length, new_tokens, progress)
    with tempfile.TemporaryDirectory(prefix=".onnxport-decoder-", dir=out) as work:
        made = export_decoder(model, layout, Path(work) / "decoder.onnx", opset=opset)
        progress(f"proving at opset {made.opset}: step cases and greedy generation against PyTorch")
        proof = prove_decoder(model, layout, made.path, tolerance=tolerance, new_tokens=new_tokens, target=target)
        final = out / ("model.onnx" if proof.passed else "model.unverified.onnx")
        for stale in ("model.onnx", "model.unverified.onnx"):
            for leftover in (out / stale, out / (stale + ".data")):
                leftover.unlink(missing_ok=True)
        move_model(made.path, final)
    built = None
    if names is not None and proof.passed:
        built = optimize_decoder(model, layout, final, out, names=names, tolerance=tolerance, progress=progress,
                                 settings=variants, target=target)
        best = built.best
        if best is not None and best.name != BASELINE and best.path is not None:
            install_best(best.path, out)  # what serve and triton take
    return DecoderOutcome(final, layout, dataclasses.replace(made, path=final, source_dtype=source_dtype), proof,
                          built)
