"""The typed results of a model family's hooks (:class:`onnxport.families.Hooks`, docs/architecture.md, "Model
families"): what its export made (the files and its typed layout), what its proof found (its cases and its extra
proofs) and what its variants made. The one pipeline's stages build the report's records (the export's
attempts, the validation's cases) from these, so that they name no family and a family builds none of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from onnxport.core.diagnostics import Diagnostic
from onnxport.core.records import Tolerance


@dataclass(frozen=True)
class Exported:
    """What a family's export made: the file its proof takes (in the run's scratch folder), how it was made
    (``tried``: why each other attempt was left, one line each; ``note``: what the kept one was set to), the
    diagnostics the export adds and the family's typed record of it (its layout: read by its proof, its
    variants and its section)."""

    path: Path
    exporter: str
    opset: int
    seconds: float
    record: Any
    tried: tuple[str, ...] = ()
    note: str | None = None
    diagnostics: tuple[Diagnostic, ...] = ()


class ProvenCase(Protocol):
    """One case of a family's proof, as report.json's validation shows it: the sizes it ran at, an input's shape
    or two, its largest errors and per group of outputs its largest absolute error (``errors``)."""

    @property
    def label(self) -> str: ...

    @property
    def shapes(self) -> Mapping[str, list[int]]: ...

    @property
    def sizes(self) -> Mapping[str, int]: ...

    @property
    def errors(self) -> Mapping[str, float]: ...

    max_abs_err: float
    max_rel_err: float
    passed: bool
    error: str | None


@dataclass(frozen=True)
class Proved:
    """What a family's proof found: every case judged with ``tolerance``, whether the whole proof holds (its
    extra proofs included: ``passed``), the diagnostics it adds and the family's typed record of it."""

    tolerance: Tolerance
    cases: tuple[ProvenCase, ...]
    passed: bool
    record: Any
    diagnostics: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True)
class Optimized:
    """What a family's variants made (its typed record, in its section) and the diagnostics they add."""

    record: Any
    diagnostics: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True)
class Made:
    """The family's records of one run so far (None: that stage has not run; ``Run.made``), read by its section."""

    exported: Exported
    proved: Proved | None = None
    optimized: Optimized | None = None

    def but(self, **changes: Any) -> Made:
        return dataclasses.replace(self, **changes)
