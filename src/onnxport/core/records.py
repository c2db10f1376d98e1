"""The typed records that flow between the stages (docs/architecture.md): frozen dataclasses, read by
the later stages and by the report builder, never patched."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from onnxport.core.diagnostics import Diagnostic


@dataclass(frozen=True)
class Attempt:
    """One try of one exporter."""

    exporter: str
    ok: bool
    seconds: float
    opset: int
    error: str | None = None
    detail: str | None = None
    guards: tuple[tuple[str, str, int], ...] = ()  # (guard expression, user file, line) from torch.export
    frozen: str | None = None  # why a successful export is known to have fixed a branch, loop or dynamic dim
    note: str | None = None  # what the strategy changed (e.g. the `if` rewritten as torch.cond)
    not_applicable: bool = False  # the strategy had nothing to do for this model (``error`` says why)
    unproven: str | None = None  # the export worked but its file was not proven (why): the next strategy was tried

    def to_dict(self) -> dict:
        error = f"not applicable: {self.error}" if self.not_applicable else self.error
        out = {"exporter": self.exporter, "ok": self.ok, "seconds": round(self.seconds, 3), "opset": self.opset,
               "error": error}
        if self.frozen:
            out["frozen"] = self.frozen
        if self.note:
            out["note"] = self.note
        if self.unproven:
            out["unproven"] = self.unproven
        return out


@dataclass(frozen=True)
class ExportResult:
    """The ONNX file written by the first exporter that succeeded, and all attempts."""

    path: Path
    exporter: str
    opset: int
    seconds: float
    attempts: tuple[Attempt, ...]
    external_data: bool
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def guards(self) -> tuple[tuple[str, str, int], ...]:
        """Shape guards from every attempt (a failed or frozen one names the thresholds of the branches)."""
        return tuple(dict.fromkeys(g for a in self.attempts for g in a.guards))


@dataclass(frozen=True)
class DimCheck:
    """A declared-dynamic dim of one input: symbolic in the graph? (``proven`` comes from parity)."""

    input: str
    axis: int
    symbol: str
    symbolic: bool
    fixed_to: int | None = None
    min: int | None = None
    max: int | None = None
    proven: bool = False
    sizes_passed: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"input": self.input, "axis": self.axis, "symbol": self.symbol, "proven": self.proven,
                "symbolic": self.symbolic, "fixed_to": self.fixed_to, "min": self.min, "max": self.max,
                "sizes_passed": list(self.sizes_passed)}


@dataclass(frozen=True)
class CheckResult:
    """Everything learned from the file without running it."""

    path: Path
    ok: bool
    checker_error: str | None
    shape_inference_error: str | None
    ir_version: int
    opset: int
    opsets: dict[str, int]
    producer: str
    nodes: int
    initializers: int
    parameters: int
    bytes: int
    op_histogram: dict[str, int]
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    dynamic_dims: tuple[DimCheck, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = field(default=())

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "checker_error": self.checker_error, "shape_inference_error": self.shape_inference_error,
            "ir_version": self.ir_version, "opset": self.opset, "opsets": self.opsets, "producer": self.producer,
            "nodes": self.nodes, "initializers": self.initializers, "parameters": self.parameters,
            "bytes": self.bytes, "op_histogram": self.op_histogram, "inputs": list(self.inputs),
            "outputs": list(self.outputs), "dynamic_dims": [d.to_dict() for d in self.dynamic_dims],
        }


@dataclass(frozen=True)
class Tolerance:
    """Elementwise pass rule: |onnx - torch| <= atol + rtol * |torch|, rtol relative to the expected (PyTorch's)
    value. The one place the rule is written: :meth:`bound`, :meth:`within`, :meth:`allows`."""

    atol: float = 1e-4
    rtol: float = 1e-3

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol}

    def bound(self, expected: ArrayLike) -> np.ndarray:
        """The error allowed at each element of ``expected``: ``atol + rtol * |expected|``, in ``expected``'s own
        float dtype (a float32 reference gives a float32 bound; Python numbers a float64 one). A NaN in
        ``expected`` gives a NaN bound, which nothing is within."""
        return self.atol + self.rtol * np.abs(expected)

    def within(self, error: ArrayLike, expected: ArrayLike, times: float = 1.0) -> np.ndarray:
        """``error <= times * bound(expected)`` elementwise (broadcast), for an error the caller measured itself
        (its own NaN and infinity rules); a NaN error is never within."""
        bound = self.bound(expected)
        return np.less_equal(error, bound if times == 1.0 else times * bound)

    def allows(self, actual: ArrayLike, expected: ArrayLike, times: float = 1.0) -> np.ndarray:
        """``|actual - expected| <= times * (atol + rtol * |expected|)`` elementwise (broadcast): the bool array
        of the elements that pass. A NaN on either side fails (two NaNs too), as does an infinity (its
        difference is NaN or infinite)."""
        with np.errstate(invalid="ignore"):
            error = np.abs(np.subtract(actual, expected))
        return self.within(error, expected, times)


@dataclass(frozen=True)
class Metric:
    """A task metric and its threshold (a value None: it could not be computed, and fails)."""

    name: str
    value: float | None
    threshold: float
    passed: bool

    def to_dict(self) -> dict:
        """The report form (value rounded to 6 places)."""
        return {"name": self.name, "value": None if self.value is None else round(float(self.value), 6),
                "threshold": self.threshold, "passed": self.passed}


FP32 = Tolerance(1e-4, 1e-3)


FP16 = Tolerance(1e-2, 1e-2)


# TF32 (the CUDA provider's use_tf32=1) rounds the operands of fp32 MatMul/Conv to a 10-bit mantissa (unit
# roundoff 2^-11 ~ 4.9e-4) but accumulates in fp32 and keeps fp32 activations between ops, so its error stays
# below fp16's: seen 2e-4 to 5e-3 on resnet18, a BERT and the TextClassifier (1e-6 with TF32 off).
TF32 = Tolerance(5e-3, 5e-3)


class Failure(str, Enum):
    """Why a parity case failed: what the diagnosis and the variant policy branch on (never the message)."""

    ORT_LOAD = "onnxruntime-load"  # onnxruntime cannot load the file at all
    TORCH = "pytorch"  # the PyTorch model itself fails on this case (a --dim range too wide)
    ORT_RUN = "onnxruntime-run"  # onnxruntime fails on this case (a baked-in size, a missing kernel)
    OUTPUT_COUNT = "output-count"  # the graphs return different numbers of outputs
    MISMATCH = "mismatch"  # both ran; an output differs in shape or beyond the tolerance


@dataclass(frozen=True)
class CaseResult:
    """One case of the matrix; ``failure`` is None when it passed."""

    label: str
    shapes: dict[str, list[int]]
    values: str
    max_abs_err: float
    max_rel_err: float
    passed: bool
    error: str | None = None
    outputs: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0
    sizes: dict[str, int] = field(default_factory=dict)
    failure: Failure | None = None

    @property
    def scaled(self) -> bool:
        """Whether the case was judged against its outputs' magnitude (inputs scaled up: compare.magnitudes) or
        without the rows or detections float32 cannot decide (prove/conditioning.py): a looser judgement that proves neither a
        dim nor a precision."""
        return any("tolerance_scale" in out or "float32_unreliable_rows" in out or "float32_unsteady" in out
                   for out in self.outputs.values())

    def to_dict(self) -> dict:
        return {"label": self.label, "sizes": self.sizes, "shapes": self.shapes, "values": self.values,
                "max_abs_err": finite(self.max_abs_err), "max_rel_err": finite(self.max_rel_err),
                "passed": self.passed, "error": self.error, "outputs": self.outputs,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class ParityResult:
    """All cases, and whether the model is proven."""

    passed: bool
    tolerance: Tolerance
    cases: tuple[CaseResult, ...]
    dynamic_dims: tuple[DimCheck, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = ()
    load_error: str | None = None
    cannot_tell: Mapping[str, str] = field(default_factory=dict)  # outputs whose references cannot tell, and why
    varying: Mapping[str, dict] = field(default_factory=dict)  # --compare rules judged over the cases (prove.across)

    @property
    def max_abs_err(self) -> float:
        return max((c.max_abs_err for c in self.cases), default=0.0)


def finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


@dataclass(frozen=True)
class Divergence:
    """Where PyTorch and ONNX part, and how the error grows from there."""

    module: str
    module_type: str
    node: str | None
    op: str | None
    max_abs_err: float | None
    case: str
    method: str
    trace: tuple[dict, ...] = field(default=())
    onnx_error: str | None = None
    root: str = ""  # the model's name, used when the divergence is in its own forward

    @property
    def label(self) -> str:
        return self.module or f"{self.root or self.module_type} (the model's own forward)"

    def to_dict(self) -> dict:
        return {"module": self.label, "module_path": self.module, "module_type": self.module_type,
                "node": self.node, "op": self.op,
                "max_abs_err": None if self.max_abs_err is None or not np.isfinite(self.max_abs_err)
                else float(self.max_abs_err),
                "case": self.case, "method": self.method, "onnx_error": self.onnx_error, "trace": list(self.trace)}


@dataclass(frozen=True)
class BatchInvariance:
    """Whether each row of a heterogeneous batch gets the answer it gets alone (what a batching server needs)."""

    rows: int  # the batch size checked
    passed: bool
    max_abs_diff: float  # largest |alone - batched| over rows and outputs
    worst_row: int | None = None
    applicable: bool = True  # False: the model has no batch axis to check
    reason: str | None = None
    cosine_centred: float | None = None  # lowest cosine of the rows centred by their mean alone (prove.varying)
    within_own_scale: float | None = None  # share of elements within the tolerance at the output's own scale
    cannot_tell: Mapping[str, str] = field(default_factory=dict)  # per output, why its centred rows cannot tell

    def to_dict(self) -> dict:
        return {"rows": self.rows, "passed": self.passed, "max_abs_diff": finite(self.max_abs_diff),
                "worst_row": self.worst_row, "applicable": self.applicable, "reason": self.reason,
                "cosine_centred": None if self.cosine_centred is None else round(self.cosine_centred, 6),
                "within_own_scale": None if self.within_own_scale is None else round(self.within_own_scale, 6),
                "cannot_tell": dict(self.cannot_tell)}
