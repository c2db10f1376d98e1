"""What optimizing finds: the task metric, the proof of one file, a variant entry and the whole result.

The ``to_dict``/``to_list`` methods write the report.json ``variants[]`` entries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from pathlib import Path
from typing import Any

from onnxport.core.records import BatchInvariance, Divergence, Metric, Tolerance, finite
from onnxport.optimize.gates import COSINE_MIN, TOP1_MIN
from onnxport.optimize.registry import (
    ALL_VARIANTS,
    AUTO,
    BASELINE,
    GPU_VARIANTS,
    OPENVINO_VARIANTS,
    VARIANTS,
    parse_names,
)
from onnxport.runtime.variant_sessions import SessionOptions, is_openvino

__all__ = ["ALL_VARIANTS", "AUTO", "BASELINE", "COSINE_MIN", "GPU_VARIANTS", "OPENVINO_VARIANTS", "ORT_LEVEL", "TOP1_MIN", "VARIANTS",
           "Metric", "OptimizeResult", "Proof", "SampleJudgement", "SessionOptions", "SkipReason", "Variant", "VariantRecord",
           "parse_names"]

ORT_LEVEL = "extended"  # basic/extended graphs are portable; ORT_ENABLE_ALL layouts are hardware-specific

class SkipReason(str, enum.Enum):
    """Why a variant was not built: what the report, the terminal and the HTML branch on (never the message)."""

    NOT_APPLICABLE = "not-applicable"  # its builder found nothing to do for this model (Skip)
    NOT_BUILT = "not-built"  # this machine cannot build or run it (a library or provider is missing)
    BUDGET = "budget"  # --budget was spent before it started
    NOT_PLANNED = "not-planned"  # the default plan leaves it out: it cannot win for this model here


@dataclass(frozen=True)
class SampleJudgement:
    """A variant judged on the user's --samples under its policy (report ``variants[].samples``).
    ``agreement`` is :func:`onnxport.prove.samples.agreement`'s free-form task summary."""

    file: str
    count: int
    passed: bool
    max_abs_err: float | None
    failed: int
    first_failure: str | None
    metrics: tuple[Metric, ...] = ()
    metric_decides: bool = False  # the task metric was judged here, not on the generated cases
    agreement: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"file": self.file, "count": self.count, "passed": self.passed,
                "max_abs_err": None if self.max_abs_err is None else finite(self.max_abs_err),
                "failed": self.failed, "first_failure": self.first_failure,
                "metrics": [m.to_dict() for m in self.metrics], "metric_decides": self.metric_decides,
                "agreement": dict(self.agreement)}


@dataclass(frozen=True)
class Proof:
    """Parity of one file against PyTorch under the policy for its variant: the proof fields of a Variant.

    The defaults are the Variant's, so a proof that stopped early (the file does not load) leaves them unset.
    """

    passed: bool
    reason: str | None = None
    tolerance: Tolerance | None = None
    max_abs_err: float | None = None
    metrics: tuple[Metric, ...] = ()
    metric: Metric | None = None  # the headline: the failing one if any, else the first
    divergence: Divergence | None = None
    divergence_error: str | None = None  # why localizing the divergence failed
    samples: SampleJudgement | None = None  # the same policy on the user's --samples
    varying: dict | None = None  # the task metric on what varies between the inputs (policy.varying_record)

    def variant_fields(self) -> dict[str, Any]:
        """The Variant keyword arguments (shallow: the records stay as they are)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class VariantRecord:
    """What every model kind's variant is, the one result type the variant loop (:mod:`onnxport.optimize.passes`),
    the best-selection and the report read: its name, its file and, keyword-only, its task metrics against
    their gates and why it was not built. Each kind adds ``passed``, its own facts (the plain model's latency
    per batch, a decoder's decode tokens/s) and its report form (``to_dict``): :class:`Variant` for the plain
    model, :class:`onnxport.decoder.records.DecoderVariant` for the decoder and encoder-decoder kinds."""

    name: str
    path: Path | str | None
    _: KW_ONLY
    metrics: tuple[Metric, ...] = ()
    skip_reason: SkipReason | None = None


@dataclass(frozen=True)
class Variant(VariantRecord):
    """One optimized file of a plain model (or the export itself as baseline) and what proving and timing it
    found. ``details`` is the builder's free-form report detail (what it tried, the int8 search...), written as is."""

    path: str | None  # relative to OUT when inside it
    passed: bool
    reason: str | None = None
    skipped: str | None = None  # why it was not built, in words (``skip_reason`` says which kind of why)
    nodes: int | None = None
    bytes: int | None = None
    max_abs_err: float | None = None
    metric: Metric | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    speedup: float | None = None
    build_seconds: float = 0.0
    prove_seconds: float = 0.0
    tolerance: Tolerance | None = None
    divergence: Divergence | None = None
    details: dict = field(default_factory=dict)
    batch_invariant: BatchInvariance | None = None  # prove.batching: each row alone == inside a batch
    samples: SampleJudgement | None = None  # judged on the user's --samples too (metrics, failing samples)
    session_options: SessionOptions | None = None  # how the file must be run (optimize/gpu.py, optimize/openvino.py)
    divergence_error: str | None = None  # localizing the divergence failed (report ``divergence.error``)
    varying: dict | None = None  # centred figures and what cannot tell (report ``varying``; prove.varying)

    @classmethod
    def skip(cls, name: str, why: str, reason: SkipReason, build_seconds: float = 0.0) -> Variant:
        """A variant not built, with why in words and as a :class:`SkipReason`."""
        return cls(name, None, False, reason=why, skipped=why, skip_reason=reason, build_seconds=build_seconds)

    @property
    def backend(self) -> str:
        """The runtime the file runs on: "openvino" when its session options say so, else "onnxruntime"."""
        return "openvino" if is_openvino(self.session_options) else "onnxruntime"

    def _divergence(self) -> dict | None:
        if self.divergence is not None:
            return self.divergence.to_dict()
        return {"error": self.divergence_error} if self.divergence_error else None

    def to_dict(self) -> dict:
        """The report.json ``variants[]`` entry."""
        return {"name": self.name, "path": self.path, "backend": self.backend, "nodes": self.nodes, "bytes": self.bytes,
                "passed": self.passed, "reason": self.reason, "skipped": self.skipped,
                "skip_reason": None if self.skip_reason is None else self.skip_reason.value,
                "max_abs_err": self.max_abs_err, "metric": None if self.metric is None else self.metric.to_dict(),
                "metrics": [m.to_dict() for m in self.metrics], "latency_ms": dict(self.latency_ms),
                "speedup": self.speedup, "build_seconds": round(self.build_seconds, 3),
                "prove_seconds": round(self.prove_seconds, 3),
                "tolerance": None if self.tolerance is None else self.tolerance.to_dict(),
                "divergence": self._divergence(), "details": self.details,
                **({"batch_invariant": self.batch_invariant.to_dict()} if self.batch_invariant is not None else {}),
                **({"samples": self.samples.to_dict()} if self.samples is not None else {}),
                **({"session_options": self.session_options.to_dict()} if self.session_options is not None else {}),
                **({"varying": self.varying} if self.varying is not None else {})}


@dataclass(frozen=True)
class OptimizeResult:
    """All variants (baseline first) and the chosen one."""

    variants: tuple[Variant, ...]
    best: Variant | None
    best_path: Path | None
    threads: int
    ort_level: str = ORT_LEVEL
    timed_at: dict = field(default_factory=dict)  # the dim sizes the winner was chosen at (batch 1)
    judged_on: dict = field(default_factory=dict)  # the case labels every variant was judged on, and those left out
    timing: str | None = None  # how the variants were timed (report ``best.timing``; bench/resident.py)

    def to_list(self) -> list[dict]:
        """report.json ``variants[]``."""
        return [v.to_dict() for v in self.variants]
