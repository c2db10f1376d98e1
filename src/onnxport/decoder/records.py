"""The records of a decoder export with a KV cache: the cache layout, the export, each proof case, each greedy
generation and the whole outcome (frozen dataclasses with ``to_dict`` for the report)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxport.core.errors import UsageError, one_line
from onnxport.core.greedy import GreedyRules
from onnxport.core.records import Tolerance
from onnxport.optimize.gates import GATES
from onnxport.optimize.passes import MIN_GAIN, choose_best, fastest
from onnxport.optimize.result import VariantRecord

__all__ = ["DECODER_GATES", "MIN_GAIN", "CacheLayout", "CacheVariants", "DecoderExport", "DecoderOutcome", "DecoderProof",
           "DecoderVariant", "DecoderVariants", "GenerationCheck", "StepCase"]

DECODER_GATES = GATES  # the quantized decoder variants pass the same gates as every other variant


@dataclass(frozen=True)
class CacheLayout:
    """What the exported cache tensors look like: ``past_key_values.{i}.key`` is [batch, kv_heads, past, head_dim]
    and ``.value`` [batch, kv_heads, past, value_dim] (``value_dim`` None: ``head_dim``) for i in range(layers).
    The shapes are the ones the model itself returns (multi-query and latent attention keep fewer heads or other
    widths than the config's ``num_attention_heads`` suggests)."""

    architecture: str
    model_type: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    position_ids: bool  # whether forward() takes position_ids (fed from the attention mask's cumsum)
    max_length: int  # the declared maximum of past + new tokens
    value_dim: int | None = None  # the values' last dim where it differs from the keys' (latent attention)
    sliding_window: int | None = None  # a window shorter than max_length: applied by the mask, the cache keeps all
    generation: GreedyRules | None = None  # the generation config's rules for greedy decoding (None: plain argmax)

    @property
    def value_head_dim(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    def past_shape(self, kind: str, batch: int, past: int) -> tuple[int, int, int, int]:
        """The shape of one ``past_key_values.{i}.{kind}`` (kind "key" or "value")."""
        return (batch, self.kv_heads, past, self.head_dim if kind == "key" else self.value_head_dim)

    @property
    def input_names(self) -> tuple[str, ...]:
        ids = ("input_ids", "attention_mask") + (("position_ids",) if self.position_ids else ())
        return ids + tuple(f"past_key_values.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value"))

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("logits",) + tuple(f"present.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value"))

    def to_dict(self) -> dict:
        return {"architecture": self.architecture, "model_type": self.model_type, "layers": self.layers,
                "heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim, "vocab": self.vocab,
                "position_ids": self.position_ids, "max_length": self.max_length,
                "value_dim": self.value_head_dim, "sliding_window": self.sliding_window,
                **({"generation": self.generation.to_dict()} if self.generation is not None else {})}


@dataclass(frozen=True)
class CacheVariants:
    """The optimized variants an export with a cache gets: ``names`` ("auto", "all" or names of the kind;
    True: all; None: none), the budget no variant is started after, onnxruntime's threads for judging and
    timing, and (decoders) the prompt length decode speed is timed after."""

    names: Sequence[str] | str | bool | None = None
    budget_s: float | None = None
    threads: int | None = None
    seq: int | None = None


@dataclass(frozen=True)
class DecoderExport:
    """The ONNX file with the cache as inputs and outputs; ``tried`` holds why newer opsets were left."""

    path: Path
    opset: int
    seconds: float
    tried: tuple[str, ...] = ()
    dtype: str = "float32"  # what the file computes in (and the model was proven in)
    source_dtype: str | None = None  # the model's own dtype when it was upcast to ``dtype`` for export and proof
    experts: str | None = None  # the transformers experts implementation the MoE layers were exported with
    notes: tuple[str, ...] = ()  # what else was set for the export (rope updates that cannot fire, ...)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "opset": self.opset, "seconds": round(self.seconds, 3),
                "tried": list(self.tried), "dtype": self.dtype, "source_dtype": self.source_dtype,
                "experts": self.experts, "notes": list(self.notes)}


@dataclass(frozen=True)
class StepCase:
    """One forward step: ``new`` tokens for ``batch`` rows on top of a cache holding ``past`` tokens."""

    batch: int
    past: int
    new: int
    max_abs_err_logits: float
    max_abs_err_presents: float
    max_rel_err: float
    passed: bool
    error: str | None = None
    past_shape: tuple[int, ...] = ()  # the shape of past_key_values.0.key in this step

    @property
    def max_abs_err(self) -> float:
        """The largest error of this step over everything it compares."""
        return max(self.max_abs_err_logits, self.max_abs_err_presents)

    # the step as one case of the report's validation (families.ProvenCase)
    @property
    def label(self) -> str:
        return f"batch {self.batch}, past {self.past}, {self.new} new"

    @property
    def shapes(self) -> dict[str, list[int]]:
        return {"input_ids": [self.batch, self.new], "past_key_values.0.key": list(self.past_shape)}

    @property
    def sizes(self) -> dict[str, int]:
        return {"batch": self.batch, "past": self.past, "seq": self.new}

    @property
    def errors(self) -> dict[str, float]:
        return {"logits": self.max_abs_err_logits, "presents": self.max_abs_err_presents}

    def to_dict(self) -> dict:
        return {"batch": self.batch, "past": self.past, "new": self.new,
                "max_abs_err_logits": self.max_abs_err_logits, "max_abs_err_presents": self.max_abs_err_presents,
                "max_rel_err": self.max_rel_err, "passed": self.passed, "error": self.error}


@dataclass(frozen=True)
class GenerationCheck:
    """Greedy generation by onnxruntime (presents fed back as past) against ``model.generate``."""

    name: str
    batch: int
    prompt_lengths: tuple[int, ...]  # per row, without the left padding
    new_tokens: int
    agreement: tuple[bool, ...]  # per step: every row's token equal
    first_divergent_step: int | None
    error: str | None = None
    stopped: bool = False  # both ended at the same step, every row at an end-of-sequence token

    @classmethod
    def judged(cls, name: str, lengths: tuple[int, ...], new_tokens: int, got: np.ndarray,
               want: np.ndarray) -> GenerationCheck:
        """The check of ``got`` against ``want`` ([batch, steps] token ids): the steps where every row agrees, the
        first that does not (or the first missing one when one of them stopped short of the other)."""
        agree = tuple(bool(np.array_equal(got[:, k], want[:, k])) for k in range(min(got.shape[1], want.shape[1])))
        first = next((k for k, same in enumerate(agree) if not same), None)
        stopped = first is None and got.shape == want.shape and len(agree) < new_tokens
        if first is None and len(agree) < new_tokens and not stopped:
            first = len(agree)
        return cls(name, len(lengths), lengths, new_tokens, agree, first, stopped=stopped)

    @classmethod
    def of(cls, name: str, lengths: tuple[int, ...], new_tokens: int,
           both: Callable[[], tuple[np.ndarray, np.ndarray]]) -> GenerationCheck:
        """:meth:`judged` on what ``both()`` returns (the exported model's tokens, ``generate()``'s); an exception
        it raises is the generation's failure, recorded (a UsageError is the user's, raised)."""
        try:
            got, want = both()
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - recorded as the generation's failure
            return cls(name, len(lengths), lengths, new_tokens, (), None, one_line(e, 240))
        return cls.judged(name, lengths, new_tokens, got, want)

    @property
    def passed(self) -> bool:
        return self.error is None and self.first_divergent_step is None and (
            len(self.agreement) == self.new_tokens or (self.stopped and bool(self.agreement)))

    def to_dict(self) -> dict:
        return {"name": self.name, "batch": self.batch, "prompt_lengths": list(self.prompt_lengths),
                "new_tokens": self.new_tokens, "steps_agreeing": sum(self.agreement),
                "agreement": list(self.agreement), "first_divergent_step": self.first_divergent_step,
                "passed": self.passed, "error": self.error, "stopped": self.stopped}


@dataclass(frozen=True)
class DecoderProof:
    """Every step case and every generation, judged with ``tolerance`` (the encoder-decoder's proof is the same
    record over its own step cases: :class:`onnxport.seq2seq.records.Seq2SeqProof`)."""

    tolerance: Tolerance
    cases: tuple[StepCase, ...]
    generations: tuple[GenerationCheck, ...]
    device: str = "cpu"  # where both sides ran (--device)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases) and all(g.passed for g in self.generations)

    @property
    def max_abs_err(self) -> float:
        return max((c.max_abs_err for c in self.cases), default=0.0)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "tolerance": self.tolerance.to_dict(), "max_abs_err": self.max_abs_err,
                "cases": [c.to_dict() for c in self.cases], "generations": [g.to_dict() for g in self.generations],
                "device": self.device}


def _round(x: float | None, digits: int = 4) -> float | None:
    """``x`` rounded for the report; None for None and for a non-finite value (report.json is strict JSON)."""
    return None if x is None or not np.isfinite(x) else round(float(x), digits)


@dataclass(frozen=True)
class DecoderVariant(VariantRecord):
    """One optimized file of a proven decoder, re-proven against PyTorch and timed. ``cosine``: the lowest logit
    cosine over the step cases; ``top1``: teacher-forced top-1 agreement (PyTorch's greedy tokens fed, the
    variant's argmax compared per step); ``greedy_steps``: its own greedy tokens equal to PyTorch's before the
    first difference (information only); ``decode_tok_s``: tokens per second at batch 1 after the prompt."""

    name: str
    path: Path | None
    size_bytes: int | None = None
    fused_ops: tuple[tuple[str, int], ...] = ()  # op type (domain-prefixed when not ONNX) -> count
    max_abs_err: float | None = None  # logits and presents, over the step cases
    strict: bool | None = None  # within the fp32 tolerance on every step case
    cosine: float | None = None
    top1: float | None = None
    greedy_steps: int | None = None
    greedy_tokens: int | None = None
    decode_tok_s: float | None = None
    prompt_ms: float | None = None
    passed: bool = False
    error: str | None = None
    notes: tuple[str, ...] = ()  # how it was built, and the routes that matched nothing
    varying: dict | None = None  # the centred logit figures and what cannot tell (prove.judging.varying_record)
    session_options: dict | None = None  # how it must be run (its CUDA graph); None: the device's defaults

    def to_dict(self) -> dict:
        return {"name": self.name, "path": None if self.path is None else str(self.path),
                "size_bytes": self.size_bytes, "fused_ops": dict(self.fused_ops),
                "max_abs_err": _round(self.max_abs_err, 8), "strict": self.strict, "cosine": _round(self.cosine, 6),
                "top1_agreement": _round(self.top1), "greedy_steps_agreeing": self.greedy_steps,
                "greedy_tokens": self.greedy_tokens, "decode_tok_s": _round(self.decode_tok_s, 2),
                "prompt_ms": _round(self.prompt_ms, 3), "passed": self.passed, "error": self.error,
                "notes": list(self.notes), "skip_reason": None if self.skip_reason is None else self.skip_reason.value,
                **({"varying": self.varying} if self.varying is not None else {}),
                "session_options": self.session_options}




@dataclass(frozen=True)
class DecoderVariants:
    """Every variant tried (built or not), the thresholds it was judged by and the fastest passing one."""

    variants: tuple[DecoderVariant, ...]
    cosine_min: float
    top1_min: float
    threads: int | None = None
    prompt: int | None = None  # the prompt length decode speed was timed after
    device: str = "cpu"  # where the variants were judged and timed (--device)

    @property
    def best(self) -> DecoderVariant | None:
        """The fastest passing variant by decode tokens/s; the export itself unless another decodes at least
        ``MIN_GAIN`` faster (:func:`~onnxport.optimize.passes.choose_best`, every kind's best-selection)."""
        base = self.get("export")
        base_speed = base.decode_tok_s if base is not None and base.passed and base.decode_tok_s else None

        def speedup(v: DecoderVariant) -> float | None:
            if not v.decode_tok_s:
                return None
            return v.decode_tok_s / base_speed if base_speed else v.decode_tok_s

        if base_speed is None:  # no timed export to be clearly faster than: the fastest passing one
            return fastest(self.variants, speedup)
        return choose_best(self.variants, speedup)

    def get(self, name: str) -> DecoderVariant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def speedup(self) -> float | None:
        """The best variant's decode tokens/s over the export's."""
        best, base = self.best, self.get("export")
        if best is None or base is None or not base.decode_tok_s:
            return None
        return best.decode_tok_s / base.decode_tok_s

    def to_dict(self) -> dict:
        best = self.best
        return {"best": None if best is None else best.name, "speedup_vs_export": _round(self.speedup, 3),
                "cosine_min": self.cosine_min, "top1_min": self.top1_min, "threads": self.threads,
                "speed_prompt": self.prompt, "device": self.device,
                "variants": [v.to_dict() for v in self.variants]}


@dataclass(frozen=True)
class DecoderOutcome:
    """What :func:`onnxport.decoder.run` did: ``path`` is ``model.onnx`` when proven, else
    ``model.unverified.onnx``."""

    path: Path
    layout: CacheLayout
    export: DecoderExport
    proof: DecoderProof
    variants: DecoderVariants | None = None  # built only when asked for and the proof passed

    @property
    def passed(self) -> bool:
        return self.proof.passed

    def to_dict(self) -> dict:
        return {"path": str(self.path), "passed": self.passed, "layout": self.layout.to_dict(),
                "export": self.export.to_dict(), "proof": self.proof.to_dict(),
                "variants": None if self.variants is None else self.variants.to_dict()}
