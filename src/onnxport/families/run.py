"""What one pipeline run carries from stage to stage (:class:`Run`), one stage of it (:class:`Stage`) and a
family's parts of the one pipeline's stages (:class:`Hooks`): the types a family is written against, below the
families so that each may use them."""

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
from onnxport.families.hooks import Exported, Made, Optimized, Proved
from onnxport.prove.references import Refs
from onnxport.prove.samples import SampleRefs
from onnxport.report.build import Outcome, Section, status_of
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
    hooks: Hooks | None = None  # the family's parts of the stages (None: a plain forward's export, proof, variants)
    section: str | None = None  # the family's report.json section (``Family.section``), made by ``hooks.section``
    made: Made | None = None  # the family's own records so far (its hooks' typed results)

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


@dataclass(frozen=True)
class Hooks:
    """A family's parts of the one pipeline: ``export(run)`` makes its files in ``run.work``; ``prove(run,
    exported)`` proves the file at ``run.result.path``; ``optimize(run, made)`` makes and judges its variants
    of the proven file at ``run.model_file`` (None: it has none); ``section(run)`` is its report.json section
    (the family's ``section`` key) from ``run.made`` once its proof has run; ``bench``: whether the one
    benchmark times its file (False: its variants are its timing); ``keep(run, proven)`` moves the export's files
from ``run.work`` into ``run.out`` under the names the proof earns and returns the one the report names (None:
the one file, as ``model.onnx`` or ``model.unverified.onnx``). The stages that call them are
    :mod:`onnxport.families.steps`; their typed results are :mod:`onnxport.families.hooks`'."""

    export: Callable[[Run], Exported]
    prove: Callable[[Run, Exported], Proved]
    section: Callable[[Run], Section]
    optimize: Callable[[Run, Made], Optimized] | None = None
    bench: bool = False
    keep: Callable[[Run, bool], Path] | None = None
