"""What every variant builder is given (BuildContext) and returns (BuildOutcome), and the shared PyTorch references.

A builder is ``build(src, dst, ctx) -> BuildOutcome``: it writes ``dst`` from ``src`` and returns the details
for the report; it raises :class:`Skip` when the variant does not apply to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxport.core.logs import Progress, noop
from onnxport.core.records import FP32, Tolerance
from onnxport.core.samples import Case, make_inputs
from onnxport.optimize.result import Proof
from onnxport.prove.parity import run_torch
from onnxport.prove.samples import SampleRefs
from onnxport.sources.base import LoadedModel


class Skip(Exception):
    """The variant does not apply to this model (the message says why)."""


@dataclass(frozen=True)
class Refs:
    """PyTorch outputs per case, computed once and shared by every variant."""

    cases: tuple[Case, ...]
    inputs: tuple[tuple, ...]
    outputs: tuple[list[np.ndarray] | None, ...]

    def pick(self, i: int) -> Refs:
        """The references of case ``i`` alone."""
        return Refs(self.cases[i:i + 1], self.inputs[i:i + 1], self.outputs[i:i + 1])


def sample_refs(samples: SampleRefs) -> Refs:
    """The batches of the user's samples as references (the task metric and the int8 search read them like the
    generated cases; :func:`~onnxport.optimize.policy.prove` judges them apart). Batches PyTorch failed on are
    left out."""
    ran = [b for b in samples.batches if b.outputs is not None]
    return Refs(tuple(Case(f"samples {b.indices[0]}..{b.indices[-1]}", {}, "samples") for b in ran),
                tuple(b.inputs for b in ran), tuple(list(b.outputs) for b in ran))


def reference_outputs(loaded: LoadedModel, cases: Sequence[Case]) -> Refs:
    """The inputs of ``cases`` and PyTorch's outputs on them (None for a case PyTorch fails on: parity reports it)."""
    ins, outs = [], []
    for c in cases:
        t = make_inputs(loaded.inputs, c.sizes, c.values, c.seed)
        ins.append(t)
        try:
            outs.append(run_torch(loaded, t))
        except Exception:  # noqa: BLE001 - parity.compare reports it
            outs.append(None)
    return Refs(tuple(cases), tuple(ins), tuple(outs))


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

    @property
    def judged(self) -> Refs | None:
        """Where the task metric is judged: the user's samples when given, else the generated cases."""
        return sample_refs(self.samples) if self.samples is not None else self.refs


@dataclass(frozen=True)
class BuildOutcome:
    """What a builder found: the report ``details`` and, when the builder already proved ``dst`` against
    PyTorch (int8 with its sensitivity search), that proof and the seconds it took (counted as proving
    time, not building time). A variant that runs an existing file with other provider options gives that
    ``path``, its ``session_options`` and the ``policy`` it is proven under."""

    details: dict
    proof: Proof | None = None
    prove_seconds: float = 0.0
    path: Path | None = None  # the file the variant runs when it is not ``dst`` (a session-option variant)
    session_options: dict | None = None  # how it must be run (optimize/gpu.py); None: the device's defaults
    policy: str | None = None  # the tolerance policy's variant name when not its own (cuda-graph: its base's)


Builder = Callable[[Path, Path, BuildContext], BuildOutcome]
