"""The one registry of variant builders, keyed by model kind and name, and the judge of each kind.

A variant is a pass whose post-condition is parity with PyTorch: its builder writes the file (or raises
:class:`~onnxport.optimize.context.Skip` when it does not apply), the judge of its model kind re-proves it
against PyTorch's references. :data:`MODEL` is the plain export (encoders, classifiers, CNNs...): builders
``(src, dst, ctx: BuildContext) -> BuildOutcome`` registered by :mod:`onnxport.optimize.choice`, judged by
:func:`onnxport.optimize.policy.prove`. A model family with variants of its own declares its kind with
:func:`declare` from its own package (a layer above this one), where it registers its builders and its judge.

The names of each kind are declared before anything slow runs (so that they can be checked first); the builders
register themselves when their module is imported. :func:`parse_names` reads a ``--variants`` value for a kind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from onnxport.core.errors import UsageError

MODEL = "model"  # the plain path: one ONNX file, proven on the case matrix
BASELINE = "export"  # the proven export itself: every kind's baseline
AUTO = "auto"  # the variants that can win for the model on the device (optimize/plan.py for MODEL)

VARIANTS = ("slim", "ort", "fused", "fp16", "int8", "fused+int8")
# the CPU on OpenVINO (optional extra; optimize/openvino.py): built when named or planned ("auto"), not by "all"
OPENVINO_VARIANTS = ("openvino", "openvino-bf16", "openvino-int8")
# --device cuda only: a file run with other provider options (fp16-nhwc: an fp16 file of its own, run in NHWC)
GPU_VARIANTS = ("tf32", "fp16-nhwc", "fp16-sdpa", "tensorrt", "cuda-graph")
ALL_VARIANTS = VARIANTS + OPENVINO_VARIANTS + GPU_VARIANTS

Builder = Callable[..., Any]  # (src, dst, ctx) -> BuildOutcome; the ctx type is the kind's
Judge = Callable[..., Any]  # the kind's proof of one built file against PyTorch


@dataclass
class Kind:
    """One model kind: its variant names (in build order), those "all" means, its builders and its judge."""

    name: str
    names: tuple[str, ...]
    default: tuple[str, ...]
    label: str = ""  # how an error message names it ("decoder " variant)
    builders: dict[str, Builder] = field(default_factory=dict)
    judge: Judge | None = None


KINDS: dict[str, Kind] = {MODEL: Kind(MODEL, ALL_VARIANTS, VARIANTS)}


def declare(name: str, names: tuple[str, ...], default: tuple[str, ...] | None = None, label: str = "") -> str:
    """Declare the model kind ``name`` (a family's, from its own package): its variant names in build order,
    those "all" means (``default``: all of them) and how an error message names it (``label``: "decoder ");
    returns ``name``. Declaring a kind again with the same names is a no-op; with others, a ValueError."""
    found = KINDS.get(name)
    if found is None:
        KINDS[name] = Kind(name, tuple(names), tuple(names if default is None else default), label)
    elif found.names != tuple(names):
        raise ValueError(f"the variant kind {name!r} is declared with {found.names}")
    return name


def kind(name: str) -> Kind:
    """The kind called ``name`` (KeyError for one not declared)."""
    return KINDS[name]


def register(kind_name: str, name: str, builder: Builder) -> Builder:
    """Register ``builder`` as variant ``name`` of ``kind_name`` (a name the kind declares); returns it."""
    k = KINDS[kind_name]
    if name not in k.names:
        raise ValueError(f"{name!r} is not a declared {kind_name} variant ({', '.join(k.names)})")
    k.builders[name] = builder
    return builder


def register_judge(kind_name: str, judge: Judge) -> Judge:
    """Register the judge of ``kind_name``; returns it."""
    KINDS[kind_name].judge = judge
    return judge


def builder(kind_name: str, name: str) -> Builder:
    """The registered builder of variant ``name`` of ``kind_name``."""
    return KINDS[kind_name].builders[name]


def judge(kind_name: str) -> Judge:
    """The registered judge of ``kind_name``."""
    found = KINDS[kind_name].judge
    if found is None:
        raise LookupError(f"no judge registered for {kind_name} variants")
    return found


def parse_names(names: Sequence[str] | str | None, kind_name: str = MODEL) -> list[str] | str:
    """The variant names of ``kind_name`` asked for (a list or a comma-separated string; None or "all": the
    kind's defaults — for :data:`MODEL` every one of :data:`VARIANTS`, the OpenVINO and GPU ones only when named),
    deduplicated in order; "auto": :data:`AUTO`, the kind's plan decides.

    Raises UsageError for a name the kind does not declare.
    """
    k = KINDS[kind_name]
    if names is None or names == "all" or names == ["all"]:
        return list(k.default)
    if names == AUTO or names == [AUTO]:
        return AUTO
    if isinstance(names, str):
        names = list(names.split(","))
    out = [n.strip() for n in names if n.strip()]
    unknown = [n for n in out if n not in k.names]
    if unknown:
        more = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise UsageError(f"unknown {k.label}variant '{unknown[0]}'{more} (--variants {','.join(unknown)})",
                         f"choose from {', '.join(k.names)}, or 'all', or 'auto'")
    return list(dict.fromkeys(out))


def chosen(names: Sequence[str] | str | None, kind_name: str) -> tuple[str, ...]:
    """The variants of ``kind_name`` a run builds besides the export, in the kind's build order: None: none;
    "all" or "auto": the kind's defaults (the plain model's plan, which "auto" means there, is
    :mod:`onnxport.optimize.plan`'s); the export named among them is left out (every kind's baseline, judged
    first whatever is asked). A name the kind does not declare is a UsageError (:func:`parse_names`)."""
    if names is None:
        return ()
    items = names.split(",") if isinstance(names, str) else list(names)
    rest = [n.strip() for n in items if n.strip() and n.strip() != BASELINE]
    wanted = parse_names(rest, kind_name) if rest else []
    if wanted == AUTO:  # "auto", and "export,auto" and the like
        wanted = list(KINDS[kind_name].default)
    return tuple(n for n in KINDS[kind_name].names if n in wanted)
