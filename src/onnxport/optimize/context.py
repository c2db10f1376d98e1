"""What every variant builder is given (BuildContext) and returns (BuildOutcome), and how it says the variant
does not apply (Skip).

A builder is ``build(src, dst, ctx) -> BuildOutcome``: it writes ``dst`` from ``src`` and returns the details
for the report; it raises :class:`Skip` when the variant does not apply to the model. The PyTorch references
it reads are :class:`onnxport.prove.references.Refs` (re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxport.core.logs import Progress, noop
from onnxport.core.records import FP32, Tolerance
from onnxport.core.samples import Case
from onnxport.optimize.result import Proof, SkipReason
from onnxport.prove.references import Refs, references
from onnxport.prove.samples import SampleRefs
from onnxport.runtime.variant_sessions import SessionOptions
from onnxport.sources.base import LoadedModel

__all__ = ["BuildContext", "BuildOutcome", "Builder", "Refs", "Skip", "reference_outputs", "sample_refs"]


class Skip(Exception):
    """The variant does not apply to this model (the message says why; ``notes``: what was tried;
    ``reason``: the kind of why, :attr:`SkipReason.NOT_APPLICABLE` unless the machine lacks what it needs)."""

    def __init__(self, message: str, notes: Sequence[str] = (),
                 reason: SkipReason = SkipReason.NOT_APPLICABLE) -> None:
        super().__init__(message)
        self.notes = tuple(notes)
        self.reason = reason


def sample_refs(samples: SampleRefs) -> Refs:
    """The batches of the user's samples as references (:meth:`SampleRefs.as_refs`; the task metric and the int8
    search read them like the generated cases; :func:`~onnxport.optimize.policy.prove` judges them apart)."""
    return samples.as_refs()


def reference_outputs(loaded: LoadedModel, cases: Sequence[Case], known: Refs | None = None) -> Refs:
    """The inputs of ``cases`` and PyTorch's outputs on them (:func:`onnxport.prove.references.references`;
    ``known``: those already computed, the proof's)."""
    return references(loaded, cases, known)


@dataclass(frozen=True)
class BuildContext:
    """The model, its references and the policy inputs every builder may use."""

    loaded: LoadedModel
    tolerance: Tolerance = FP32
    refs: Refs | None = None
    transformer: dict | None = None  # num_heads / hidden_size / model_type / found_in, see transformer_params
    progress: Progress = noop
    deadline: float | None = None  # time.perf_counter() after which no search goes on (--budget)
    samples: SampleRefs | None = None  # the user's --samples with PyTorch's outputs: calibration and judging
    device: str = "cpu"  # where the variants run: "cuda" builds for and proves on the GPU providers
    out: Path | None = None  # OUT (TensorRT's engine and timing caches go under it)
    timed_at: dict | None = None  # the dim sizes the variants are timed at (TensorRT's opt profile shapes)
    built: Mapping[str, Path] = field(default_factory=dict)  # the variants written so far (fused+int8 reads fused)
    passed: Mapping[str, Path] = field(default_factory=dict)  # the files proven so far (cuda-graph picks one)
    options: Mapping[str, SessionOptions] = field(default_factory=dict)  # the session options of those run otherwise
    fastest: Callable[[dict[str, Path]], str] | None = None  # the fastest of some files (a short timing)
    thorough: bool = False  # the user asked for variants by name or "all": every setting is tried, not the CPU's

    def spent(self) -> bool:
        """Whether --budget (the default plan's or the user's) is spent: no further build or search step starts."""
        return self.deadline is not None and time.perf_counter() > self.deadline

    def seconds_left(self, cap: float) -> float:
        """Seconds a search step may take: ``cap``, less where --budget ends sooner (at least 1)."""
        return cap if self.deadline is None else max(1.0, min(cap, self.deadline - time.perf_counter()))

    @property
    def judged(self) -> Refs | None:
        """Where the task metric is judged: the user's samples when given, else the generated cases."""
        return sample_refs(self.samples) if self.samples is not None else self.refs


@dataclass(frozen=True)
class BuildOutcome:
    """What a builder found: the report ``details`` and, when the builder already proved ``dst`` against
    PyTorch (int8 with its sensitivity search), that proof and the seconds it took (counted as proving
    time, not building time). A variant that runs an existing file with other provider options gives that
    ``path``, its ``session_options`` and the ``policy`` it is proven under. ``notes``: how it was built (the
    routes tried), for kinds that report them."""

    details: dict = field(default_factory=dict)
    proof: Proof | None = None
    prove_seconds: float = 0.0
    path: Path | None = None  # the file the variant runs when it is not ``dst`` (a session-option variant)
    session_options: SessionOptions | None = None  # how it must be run; None: the device's defaults
    policy: str | None = None  # the tolerance policy's variant name when not its own (cuda-graph: its base's)
    notes: tuple[str, ...] = ()


Builder = Callable[[Path, Path, BuildContext], BuildOutcome]
