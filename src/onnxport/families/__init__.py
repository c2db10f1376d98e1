"""The model families (docs/architecture.md, "Model families"): a :class:`Family` record per kind of model —
how it is detected, the options it refuses, how it loads, its stages, its variant kind, its report section and
the generator the server uses — and the :class:`Run`/:class:`Stage` its stages are written against. Below the
families' packages and above the report, so that pipeline, report readers and serve ask it instead of naming
a family."""

from onnxport.families.hooks import Exported, Made, Optimized, Proved, ProvenCase
from onnxport.families.registry import (
    FAMILY_MODULES,
    PIPELINE_STAGES,
    Family,
    Part,
    detect,
    families,
    get,
    register,
    sections,
    unregister,
)
from onnxport.families.run import Hooks, Run, Stage, Step

__all__ = [
    "FAMILY_MODULES",
    "PIPELINE_STAGES",
    "Exported",
    "Family",
    "Hooks",
    "Made",
    "Optimized",
    "Proved",
    "ProvenCase",
    "Part",
    "Run",
    "Stage",
    "Step",
    "detect",
    "families",
    "get",
    "register",
    "sections",
    "unregister",
]
