"""The model families and how each is told apart: a :class:`Family` per kind of model (the plain model, the
causal LM with its KV cache, the encoder-decoder, …), found by :func:`detect` and looked up by name or report
section. The built-in families are the ``FAMILY`` of each module in :data:`FAMILY_MODULES`, read by the loader
(whatever was imported before); :func:`register` adds one more (a plugin, a test)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol

from onnxport.core.options import Options
from onnxport.families.run import Hooks, Stage
from onnxport.sources import validate
from onnxport.sources.base import LoadedModel

Detect = Callable[[str, "str | None"], bool]  # (source, --task) -> whether the family takes the model
Refuse = Callable[[Options], Options]  # the options when the family takes them all; else a UsageError naming why
Loader = Callable[..., LoadedModel]  # load_model's signature: (source, **load options)
Served = Callable[[Path, object], "Path | None"]  # (output folder, report.json) -> the file serve and triton take


@dataclass(frozen=True)
class Part:
    """One model of a model made of several (a diffusion pipeline's text encoders, denoiser and autoencoder
    halves): its folder in OUT, its source, the keywords its family's loader takes beyond the source, and
    whether its report heads the whole one (``main``: the model a user serves first)."""

    name: str
    source: str
    keywords: Mapping[str, Any] = field(default_factory=dict)
    main: bool = False


Parts = Callable[[str], "tuple[Part, ...]"]  # source -> its parts, each run through the one pipeline (): one model


class JointProof(Protocol):
    """What a family proves over its parts together once each is proven alone (a pipeline's denoising run)."""

    passed: bool

    @property
    def summary(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


# (source, OUT, the parts, options) -> the proof over the parts together (None: nothing to prove)
Joint = Callable[[str, Path, "tuple[Part, ...]", Options], "JointProof | None"]

# The built-in families, in the order detection tries them (the plain model, whose ``detects`` is None, is the
# one taken when no other is). A new family is its package and one line here.
FAMILY_MODULES: tuple[str, ...] = ("onnxport.seq2seq.family", "onnxport.decoder.family", "onnxport.diffusion.family",
                                    "onnxport.pipeline")
# A family whose ``stages`` are these runs the one pipeline's stages (export, prove, optimize, bench) on the
# model its loader makes.
PIPELINE_STAGES: tuple[Stage, ...] = ()


def _takes_all(options: Options) -> Options:
    return options


@dataclass(frozen=True)
class Family:
    """One model family: its name, its stages (:data:`PIPELINE_STAGES`: the one pipeline's), how it is detected (``detects``: from the source string and
    --task; None: the plain model, taken when no other family is), which options it refuses and why
    (``refuse``), how it loads (``load``: None, the generic loader; ``load_task``: the task that loader is given;
    ``check_seq``: whether --seq is checked against the loaded dims), the optimize kind whose names --variants
    takes (``variant_kind``: None, the family checks them itself), its report.json section (``section``: the key
    of ``Outcome.sections``), how its section's ``layout`` is read back (``layout``: a dict -> the family's layout
    record, with ``to_dict``, e.g. the record's ``from_dict``), the extension it adds to the server
    (``extension``: ``"module:attr"`` of a :class:`onnxport.families.serving.Extension`, None for none) and the
    file serve and triton take from its output folder when it has no ``best.onnx``/``model.onnx`` (``served``),
    with the files a repository entry holds together (``files``, the served one last) and that entry's python
    backend (``repository``: ``(OUT, report.json, name, *, instance_count, threads, gpu)`` -> its
    :class:`onnxport.families.serving.RepositoryEntry`)."""

    name: str
    stages: tuple[Stage, ...]
    detects: Detect | None = None
    refuse: Refuse = _takes_all
    device_first: bool = False  # the device is checked before ``refuse`` (the plain model's order)
    load: Loader | None = None
    load_task: str | None = None
    check_seq: bool = True
    variant_kind: str | None = None
    scratch: bool = False  # the run gets a scratch folder in OUT (run.work), removed at the end
    section: str | None = None
    layout: Callable[[dict], Any] | None = None
    extension: str | None = None
    served: Served | None = None
    files: tuple[str, ...] = ()  # the ONNX files served together (the served one last), beside ``{section}.json``
    repository: Callable[..., Any] | None = None  # their Triton entry's python backend (``onnxport triton``)
    parts: Parts | None = None  # a source made of several models: each part proven alone into OUT/<part>/
    joint: Joint | None = None  # then proven together (its record under report.json's ``joint_proof``)
    hooks: Hooks | None = None  # what differs in the one pipeline's stages (export, proof, variants, section)
    # the session options (report.json's form) a GPU Triton entry of its served file runs with when the report
    # records none for it, and without a CUDA graph (Triton's backend replays captured shapes); None: the default
    gpu_session: Mapping[str, Any] | None = None

    def server_extension(self) -> Any:
        """The server extension ``extension`` names (imported when first asked for; None when it names none)."""
        if self.extension is None:
            return None
        module, _, name = self.extension.partition(":")
        return getattr(import_module(module), name)


_builtin: tuple[Family, ...] | None = None
_added: dict[str, Family] = {}


def _builtins() -> tuple[Family, ...]:
    global _builtin
    if _builtin is None:
        _builtin = tuple(import_module(m).FAMILY for m in FAMILY_MODULES)
    return _builtin


def register(family: Family) -> Family:
    """Add ``family`` (replacing one of the same name added before); detection tries it after the built-in
    families and before the plain model."""
    if family.name in {f.name for f in _builtins()}:
        raise ValueError(f"the family {family.name!r} is built in")
    _added[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove the family :func:`register` added under ``name`` (nothing when there is none)."""
    _added.pop(name, None)


def families() -> tuple[Family, ...]:
    """Every family, in the order :func:`detect` tries them: the built-in ones, those registered, the plain
    model last."""
    builtin = _builtins()
    return (*(f for f in builtin if f.detects is not None), *_added.values(),
            *(f for f in builtin if f.detects is None))


def get(name: str) -> Family:
    """The family called ``name`` (KeyError when none is)."""
    found = next((f for f in families() if f.name == name), None)
    if found is None:
        raise KeyError(name)
    return found


def detect(source: str, task: str | None, inputs_given: bool = False) -> Family:
    """The family that takes ``source`` with --task ``task``: the first whose ``detects`` says so; the plain
    model when none does, or when --input is given (the plain forward, exported as declared). A Hugging Face
    folder's config.json that cannot be read is a SourceError here, before any family reads it."""
    if source.startswith("hf:"):
        validate.readable(Path(source.split(":", 1)[1]))
    ordered = families()
    if not inputs_given:
        for family in ordered:
            if family.detects is not None and family.detects(source, task):
                return family
    return next(f for f in ordered if f.detects is None)


def sections() -> tuple[str, ...]:
    """The report.json sections the families add, in the families' order."""
    return tuple(f.section for f in families() if f.section is not None)
