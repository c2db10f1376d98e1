"""Build the report.json dictionary (the public contract) from the stage records.

The pipeline keeps one :class:`Outcome` (the records of every stage run so far) and, at each checkpoint,
replaces it with one that holds more and writes ``build_report(outcome)``: the dictionary is never patched.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from onnxport.bench import BenchResult
from onnxport.core.diagnostics import Diagnostic
from onnxport.core.records import (
    Attempt,
    BatchInvariance,
    CheckResult,
    Divergence,
    ExportResult,
    ParityResult,
)
from onnxport.core.spec import Dim
from onnxport.core.version import __version__
from onnxport.optimize import OptimizeResult
from onnxport.prove.branches import Site
from onnxport.prove.samples import SampleProof
from onnxport.runtime import Placement, environment
from onnxport.sources.base import LoadedModel


class Section(Protocol):
    """A record a model family makes for its own report.json section (``Outcome.sections``)."""

    def to_dict(self) -> dict: ...


def _attempt(a: Attempt) -> dict:
    """One export attempt of report.json (``not_applicable``: the strategy had nothing to do here)."""
    return {"not_applicable": a.not_applicable, **a.to_dict()}


def _patches(result: ExportResult | None) -> list[str]:
    """The library patches applied while making the kept export (their ``export-patch`` diagnostics)."""
    if result is None:
        return []
    return list(dict.fromkeys(d.message.split(" patched while exporting", 1)[0] for d in result.diagnostics
                              if d.code == "export-patch" and " attempt: " not in d.message))


def _dim(d: Dim) -> dict:
    """One dim of report.json's ``model.dims``; ``sizes`` (and the ``rule`` they follow) for a dim the model runs
    at some sizes of only."""
    out: dict = {"min": d.min, "max": d.max, "export": d.example}
    if d.sizes:
        out["sizes"] = list(d.sizes)
    if d.rule:
        out["rule"] = d.rule
    return out


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Outcome:
    """Everything one run has produced so far, stage by stage (None: the stage has not run)."""

    loaded: LoadedModel
    command: str | None
    diagnostics: tuple[Diagnostic, ...]
    timings: Mapping[str, float]
    created_at: str = field(default_factory=_now)
    export: ExportResult | None = None
    attempts: tuple[Attempt, ...] = ()  # the tries of an export that failed (else export.attempts)
    check: CheckResult | None = None
    parity: ParityResult | None = None
    branches: tuple[Site, ...] = ()
    placement: Placement | None = None
    divergence: Divergence | None = None
    divergence_module: str | None = None  # the divergence's module as the user knows it (diagnose.explain.label)
    model_path: str | None = None  # where the export now lies (a name in OUT, or the user's file)
    optimized: OptimizeResult | None = None
    stage_seconds: Mapping[str, float] = field(default_factory=dict)  # optimize / bench, rounded in the report
    benchmark: BenchResult | None = None
    batch_invariance: BatchInvariance | None = None  # the export's rows alone vs inside a batch
    samples: SampleProof | None = None  # the export on the user's --samples
    log: str | None = None  # the file beside report.json holding what the libraries printed (the CLI writes it)
    custom_functions: tuple[Any, ...] = ()  # autograd.Functions with symbolic() the export found (CustomFunction)
    sections: Mapping[str, Section] = field(default_factory=dict)  # a family's own report sections, by key

    def but(self, **changes: Any) -> Outcome:
        """A copy with ``changes`` (the next checkpoint)."""
        return dataclasses.replace(self, **changes)


def status_of(export: ExportResult | None, check: CheckResult | None, parity: ParityResult | None,
              diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> str:
    """ok, validation_failed or export_failed."""
    if export is None:
        return "export_failed"
    if check is not None and check.ok and parity is not None and parity.passed and not any(
            d.severity == "error" for d in diagnostics):
        return "ok"
    return "validation_failed"


def build_report(o: Outcome) -> dict:
    """The report.json dictionary (docs/architecture.md; schema in report/schema.json)."""
    loaded, result, checked, parity = o.loaded, o.export, o.check, o.parity
    status = status_of(result, checked, parity, o.diagnostics)
    spec_io = [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in loaded.inputs]
    rep: dict[str, Any] = {
        "onnxport_version": __version__,
        "status": status,
        "summary": "",
        "created_at": o.created_at,
        "command": o.command,
        "model": {"source": loaded.source, "name": loaded.name, "parameters": loaded.parameters,
                  "kind": loaded.kind,
                  "dims": {k: _dim(d) for k, d in loaded.dims.items()}},
        "export": {
            "exporter": result.exporter if result else None,
            "opset": result.opset if result else None,
            "seconds": round(result.seconds if result else o.timings.get("export", 0.0), 3),
            "path": o.model_path,
            "external_data": bool(result.external_data) if result else False,
            "inputs": list(checked.inputs) if checked else spec_io,
            "outputs": list(checked.outputs) if checked else [{"name": n, "dtype": "unknown", "shape": None}
                                                              for n in loaded.output_names],
            "attempts": [_attempt(a) for a in (result.attempts if result else o.attempts)],
            "custom_ops": [f.to_dict() for f in o.custom_functions],
            "patches": _patches(result),
        },
        "check": None,
        "validation": None,
        "variants": o.optimized.to_list() if o.optimized is not None else [],
        "benchmark": o.benchmark.to_dict() if o.benchmark is not None else None,
        "diagnostics": [d.to_dict() for d in o.diagnostics],
        "timings": {**{k: round(v, 3) for k, v in o.timings.items()},
                    **{k: round(v, 3) for k, v in o.stage_seconds.items()}},
        "environment": environment.summary(),
    }
    if checked is not None:
        c = checked.to_dict()
        if parity is not None:
            c["dynamic_dims"] = [d.to_dict() for d in parity.dynamic_dims]
        rep["check"] = c
    if parity is not None:
        divergence = None
        if o.divergence is not None:
            divergence = {**o.divergence.to_dict(), "module": o.divergence_module}
        rep["validation"] = {"passed": parity.passed, "tolerance": parity.tolerance.to_dict(),
                             "cases": [c.to_dict() for c in parity.cases], "divergence": divergence,
                             "branches": [s.to_dict() for s in o.branches], "compare": dict(loaded.compare),
                             "cannot_tell": dict(parity.cannot_tell), "varying": dict(parity.varying),
                             "own_scale": _own_scale(parity)}
        if o.batch_invariance is not None:
            rep["validation"]["batch_invariance"] = o.batch_invariance.to_dict()
        if o.samples is not None:
            rep["validation"]["samples"] = o.samples.to_dict()
    if o.placement is not None:
        rep["runtime"] = o.placement.to_dict()
    if o.optimized is not None:
        best = o.optimized.best
        options = None if best is None else best.session_options
        rep["best"] = None if best is None else {"name": best.name, "path": "best.onnx", "speedup": best.speedup,
                                                 "timed_at": o.optimized.timed_at,
                                                 "judged_on": o.optimized.judged_on,
                                                 **({"timing": o.optimized.timing} if o.optimized.timing else {}),
                                                 "session_options": {} if options is None else options.to_dict()}
    for name, section in o.sections.items():  # the records a family keeps that the contract has no field for
        rep[name] = section.to_dict()
    if o.log:
        rep["log"] = o.log
    rep["summary"] = summary_sentence(rep)
    return rep


def _own_scale(parity: ParityResult) -> dict[str, dict]:
    """Per output judged at its own scale (prove/compare.py own_tolerance): the smallest atol it was judged at and
    its magnitude there."""
    out: dict[str, dict] = {}
    for case in parity.cases:
        for name, rec in case.outputs.items():
            if "atol" in rec and (name not in out or rec["atol"] < out[name]["atol"]):
                out[name] = {"atol": rec["atol"], "magnitude": rec.get("magnitude"), "case": case.label}
    return out


def proven_sizes(dynamic_dims: list[dict], cases: list[dict]) -> str:
    """'; batch proven at 1, 2, 9, 64; seq at 2-16': the sizes of each dynamic dim proven (its ``sizes_passed``,
    and those the passing cases ran at); a size between them is not proven: a model wrong at batch 7 alone passes
    at 1, 2, 9 and 64, so the summary says which sizes it claims."""
    sizes: dict[str, set[int]] = {}
    for d in dynamic_dims:
        found = sizes.setdefault(d["symbol"], set())
        found.update(n for n in d.get("sizes_passed") or () if isinstance(n, int))  # the proof's own record
        for c in cases:
            shape = c.get("shapes", {}).get(d["input"]) if c.get("passed") else None
            if isinstance(shape, list) and d["axis"] < len(shape) and isinstance(shape[d["axis"]], int):
                found.add(shape[d["axis"]])
    parts = [f"{sym} {'proven at ' if not i else 'at '}{_runs(sorted(got))}" if got else f"{sym} proven"
             for i, (sym, got) in enumerate(sizes.items())]
    return "; " + "; ".join(parts) if parts else ""


def _runs(values: list[int]) -> str:
    """1, 2, 3, 4, 9 -> '1-4, 9': three or more consecutive sizes as one range."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            run = values[start:i]
            out.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)))
            start = i
    return ", ".join(out)


def summary_sentence(rep: dict) -> str:
    """The verdict in one sentence."""
    status = rep["status"]
    if status == "export_failed":
        root = next((d for d in rep["diagnostics"] if d["severity"] == "error" and d["code"] != "export-failed"),
                    None)  # the ranked root cause (rootcause.rank), not the last strategy's shrug
        errs = [a["error"] for a in rep["export"]["attempts"] if a.get("error") and not a.get("not_applicable")]
        reason = root["message"] if root else errs[0] if errs else "no exporter produced a model"
        return "Export failed: " + reason.rstrip(".") + "."
    val = rep.get("validation") or {}
    cases = val.get("cases", [])
    n_ok = sum(c["passed"] for c in cases)
    if status == "ok":
        worst = max((c["max_abs_err"] or 0.0 for c in cases), default=0.0)
        dyn = proven_sizes(rep["check"]["dynamic_dims"], cases)
        mine = val.get("samples")
        also = f" and on {mine['count']} samples of {mine['file']}" if mine else ""
        worst = max(worst, (mine or {}).get("max_abs_err") or 0.0)
        return (f"Proven: the ONNX model matches PyTorch on {n_ok}/{len(cases)} cases{also} "
                f"(max abs error {worst:.2e}){dyn}.")
    first = next((d for d in rep["diagnostics"] if d["severity"] == "error"), None)
    reason = first["message"] if first else "validation failed"
    return f"Not proven ({n_ok}/{len(cases)} cases pass): {reason}"
