"""What optimizing finds: the task metric, the proof of one file, a variant entry and the whole result.

The ``to_dict``/``to_list`` methods write the report.json ``variants[]`` entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from onnxport.core.errors import UsageError

VARIANTS = ("slim", "ort", "fused", "fp16", "int8", "fused+int8")
GPU_VARIANTS = ("tf32", "tensorrt", "cuda-graph")  # --device cuda only: a file run with other provider options
ALL_VARIANTS = VARIANTS + GPU_VARIANTS
BASELINE = "export"
COSINE_MIN = 0.99
TOP1_MIN = 0.95
ORT_LEVEL = "extended"  # basic/extended graphs are portable; ORT_ENABLE_ALL layouts are hardware-specific


AUTO = "auto"  # the variants that can win for the model on the device (optimize/plan.py)


def parse_names(names: Sequence[str] | str | None) -> list[str] | str:
    """The variant names asked for (a list or a comma-separated string; None or "all": every one of
    :data:`VARIANTS`, and on ``--device cuda`` the :data:`GPU_VARIANTS` too), deduplicated in order; "auto":
    :data:`AUTO`, the plan decides.

    Raises UsageError for a name not in :data:`ALL_VARIANTS`.
    """
    if names is None or names == "all" or names == ["all"]:
        return list(VARIANTS)
    if names == AUTO or names == [AUTO]:
        return AUTO
    if isinstance(names, str):
        names = list(names.split(","))
    out = [n.strip() for n in names if n.strip()]
    unknown = [n for n in out if n not in ALL_VARIANTS]
    if unknown:
        raise UsageError(f"unknown variant(s): {', '.join(unknown)}",
                         f"choose from {', '.join(ALL_VARIANTS)}, or 'all', or 'auto'")
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Metric:
    """A task metric and its threshold."""

    name: str
    value: float | None
    threshold: float
    passed: bool

    def to_dict(self) -> dict:
        """The report form (value rounded to 6 places)."""
        return {"name": self.name, "value": None if self.value is None else round(float(self.value), 6),
                "threshold": self.threshold, "passed": self.passed}


@dataclass(frozen=True)
class Proof:
    """Parity of one file against PyTorch under the policy for its variant: the proof fields of a Variant.

    The defaults are the Variant's, so a proof that stopped early (the file does not load) leaves them unset.
    """

    passed: bool
    reason: str | None = None
    tolerance: dict | None = None
    max_abs_err: float | None = None
    metrics: tuple[Metric, ...] = ()
    metric: dict | None = None
    divergence: dict | None = None
    samples: dict | None = None  # the same policy on the user's --samples (report variants[].samples)

    def variant_fields(self) -> dict[str, Any]:
        """The Variant keyword arguments (shallow: the Metric objects stay as they are)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Variant:
    """One optimized file (or the plain export as baseline) and what proving and timing it found."""

    name: str
    path: str | None  # relative to OUT when inside it
    passed: bool
    reason: str | None = None
    skipped: str | None = None
    nodes: int | None = None
    bytes: int | None = None
    max_abs_err: float | None = None
    metric: dict | None = None
    metrics: tuple[Metric, ...] = ()
    latency_ms: dict[str, float] = field(default_factory=dict)
    speedup: float | None = None
    build_seconds: float = 0.0
    prove_seconds: float = 0.0
    tolerance: dict | None = None
    divergence: dict | None = None
    details: dict = field(default_factory=dict)
    batch_invariant: dict | None = None  # prove.batching: each row alone == inside a batch
    samples: dict | None = None  # judged on the user's --samples too (metrics, failing samples)
    session_options: dict | None = None  # how the file must be run: provider and its options (optimize/gpu.py)

    def to_dict(self) -> dict:
        """The report.json ``variants[]`` entry."""
        return {"name": self.name, "path": self.path, "nodes": self.nodes, "bytes": self.bytes,
                "passed": self.passed, "reason": self.reason, "skipped": self.skipped,
                "max_abs_err": self.max_abs_err, "metric": self.metric,
                "metrics": [m.to_dict() for m in self.metrics], "latency_ms": dict(self.latency_ms),
                "speedup": self.speedup, "build_seconds": round(self.build_seconds, 3),
                "prove_seconds": round(self.prove_seconds, 3), "tolerance": self.tolerance,
                "divergence": self.divergence, "details": self.details,
                **({"batch_invariant": self.batch_invariant} if self.batch_invariant is not None else {}),
                **({"samples": self.samples} if self.samples is not None else {}),
                **({"session_options": self.session_options} if self.session_options is not None else {})}


@dataclass(frozen=True)
class OptimizeResult:
    """All variants (baseline first) and the chosen one."""

    variants: tuple[Variant, ...]
    best: Variant | None
    best_path: Path | None
    threads: int
    ort_level: str = ORT_LEVEL
    timed_at: dict = field(default_factory=dict)  # the dim sizes the winner was chosen at (batch 1)

    def to_list(self) -> list[dict]:
        """report.json ``variants[]``."""
        return [v.to_dict() for v in self.variants]
