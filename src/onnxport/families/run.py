"""What one pipeline run carries from stage to stage (:class:`Run`) and one stage of it (:class:`Stage`): the
types a family's stages are written against, below the families so that each may use them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxport import runtime
from onnxport.core.logs import Progress, noop
from onnxport.core.options import Options
from onnxport.core.records import ExportResult
from onnxport.exporters.chain import Candidates
from onnxport.prove.references import Refs
from onnxport.prove.samples import SampleRefs
from onnxport.report.build import Outcome, status_of
from onnxport.sources.base import LoadedModel
from onnxport.sources.datasets import SampleSet


@dataclass(frozen=True)
class Run:
    """What one run carries from stage to stage: its options, the loaded model and output folder, and the
    records made so far (``outcome``: the report's records, None before the first one). A stage returns a
    new Run; ``stopped`` ends the run after it (an export that failed: nothing left to prove)."""

    options: Options
    loaded: LoadedModel
    out: Path
    progress: Progress = noop
    timings: Mapping[str, float] = field(default_factory=dict)  # the finer timings (load, check, parity, …)
    samples: SampleSet | None = None
    work: Path | None = None  # a scratch folder in OUT, removed at the end
    source_file: Path | None = None  # compare/optimize/bench: the user's ONNX file, proven in place
    result: ExportResult | None = None
    outcome: Outcome | None = None
    sample_refs: SampleRefs | None = None
    references: Refs | None = None  # PyTorch's outputs on the proof's cases (the variants are judged on them)
    model_file: Path | None = None  # where the proven (or unproven) export now lies
    stopped: bool = False
    candidates: Candidates | None = None  # auto: the exporter chain, asked for its next file when one is not proven

    def but(self, **changes: Any) -> Run:
        return dataclasses.replace(self, **changes)

    def timed(self, **seconds: float) -> Run:
        """This run with ``seconds`` set in its timings (a new mapping: the runs before keep theirs)."""
        return self.but(timings={**self.timings, **seconds})

    @property
    def proven(self) -> bool:
        o = self.outcome
        return (o is not None and self.result is not None
                and status_of(self.result, o.check, o.parity, o.diagnostics) == "ok")

    @property
    def device(self) -> str:
        return self.options.runtime.device

    def providers(self) -> list:
        """The provider chain of the run's device (ONNX Runtime's CPU provider on the CPU)."""
        return runtime.runtime_providers(self.options.runtime)


Step = Callable[[Run], Run]


def _always(run: Run) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    """One stage of a run: its name, what it does, whether the report is written after it, when it applies
    (default: always), and whether its seconds go to the report's timings under its name (stages that time
    their own parts — export, check, parity, localize — say False)."""

    name: str
    step: Step
    checkpoint: bool = False
    applies: Callable[[Run], bool] = _always
    timed: bool = True
