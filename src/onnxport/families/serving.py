"""What a family's server part is written against (docs/architecture.md, "Model families"): the
:class:`Extension` a family adds to the server (its name in the server metadata, the verbs POSTed to
``/v2/models/{name}/{verb}``, its metrics, what a model without it answers) and the :class:`Bound` answer of
one served model; :class:`BadRequest`, what a client must fix. Below the families' packages, so that their
server parts and ``serve/`` share these without naming each other."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from onnxport.families.registry import Family, families


class BadRequest(Exception):
    """A request the client must fix (HTTP 400 unless ``status`` says otherwise)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Verb:
    """One route of an extension, ``POST /v2/models/{name}[/versions/{version}]/{name}``: answered with one JSON
    object, or (``stream``) with server-sent events."""

    name: str
    stream: bool = False


@dataclass(frozen=True)
class ExtensionMetrics:
    """The Prometheus metrics of an extension, each ``(name, help)``: its requests by model and outcome (a
    counter), their seconds (a histogram) and the units they produced (a counter)."""

    requests: tuple[str, str]
    seconds: tuple[str, str]
    units: tuple[str, str]


class Outcome(Protocol):
    """What one extension request did, for the metrics: the units it produced, its error, its seconds."""

    count: int
    error: str | None

    @property
    def seconds(self) -> float: ...


class Bound(Protocol):
    """An extension bound to one served model: a request checked before anything runs (BadRequest), its outcome
    started, its answer (one JSON object, or events), and the parameters it adds to the model's config."""

    def request(self, body: object, model: str) -> Any: ...

    def start(self, request: Any) -> Outcome: ...

    async def answer(self, sess: Any, request: Any, model: str, version: str, outcome: Outcome) -> dict: ...

    def events(self, sess: Any, request: Any, model: str, version: str,
               outcome: Outcome) -> AsyncIterator[bytes]: ...

    def config_parameters(self) -> dict[str, str]: ...


# (the served model's signature, its served file, its family's layout record or None) -> bound, None: not this
Bind = Callable[[Any, Path, object], "Bound | None"]


@dataclass(frozen=True)
class Extension:
    """A server extension a family adds: its ``name`` (listed in the server metadata), its ``verbs``, its
    ``metrics``, ``absent`` (what a model without it answers, formatted with ``model``), ``usage`` (the line a
    server start prints for a model with it, formatted with ``base`` and ``model``) and ``bind`` (the family's
    part: the extension bound to a served model). Families adding the same ``name`` share its routes and
    metrics (the first one's), each binding its own models."""

    name: str
    verbs: tuple[Verb, ...]
    metrics: ExtensionMetrics
    absent: str
    usage: str
    bind: Bind


class TritonEnum(str):
    """A protobuf enum value of a Triton config (``TYPE_INT64``, ``KIND_CPU``): written without quotes."""


@dataclass(frozen=True)
class RepositoryEntry:
    """A family's python-backend entry of a Triton repository, for a family served from several files (its
    ``files``, copied into ``1/`` by the writer): Triton's config (JSON form, enum values as
    :class:`TritonEnum`) and the comment lines heading its config.pbtxt, the text of ``1/model.py``, the files
    written into ``1/`` (name -> text) and the files or folders of the output folder copied into ``1/`` under
    their names (those that exist)."""

    config: dict
    notes: tuple[str, ...]
    model: str
    written: Mapping[str, str]
    copied: tuple[Path, ...]


def extensions() -> tuple[Extension, ...]:
    """The extensions the families add, one per name, in the families' order."""
    found: dict[str, Extension] = {}
    for family in families():
        ext = family.server_extension()
        if ext is not None:
            found.setdefault(ext.name, ext)
    return tuple(found.values())


def bind(sig: Any, served: Path, layout: object = None) -> dict[str, Bound]:
    """The extensions a served model answers, by name: for each, the first family's that binds it."""
    bound: dict[str, Bound] = {}
    for family in families():
        ext = family.server_extension()
        if ext is not None and ext.name not in bound and (b := ext.bind(sig, served, layout)) is not None:
            bound[ext.name] = b
    return bound


def family_layout(family: Family, data: object) -> object:
    """``data`` (a layout as report.json's section or a repository entry holds it) read back into the family's
    record by its ``layout`` (None when the family has none, or ``data`` does not read)."""
    if family.layout is None or not isinstance(data, dict):
        return None
    try:
        return family.layout(data)
    except (TypeError, KeyError, ValueError):
        return None


def read_layout(report: object) -> object:
    """The layout record of report.json's family section: the first family section the report holds, its
    ``layout`` read back by its family (None when there is none)."""
    if not isinstance(report, dict):
        return None
    family = next((f for f in families() if f.section is not None and report.get(f.section)), None)
    section = report[family.section] if family is not None else None
    return family_layout(family, section.get("layout")) if isinstance(section, dict) else None
