"""Optimization variants of a proven export, each re-proven against PyTorch; the fastest safe one is chosen.

Every variant is a pass whose post-condition is parity with the *PyTorch* model (never with the fp32 ONNX
file it came from), judged by the tolerance policy of DESIGN.md §4:

* fp32-graph variants (``slim``, ``ort``, ``fused``): elementwise with the fp32 tolerance;
* ``fp16``: elementwise with atol/rtol 1e-2 *and* the task metric;
* ``int8`` (and ``fused+int8``): the task metric only — cosine similarity of the outputs (of the mean-pooled
  sentence embedding for Hugging Face encoders with ``last_hidden_state`` and an ``attention_mask``), plus
  top-1 agreement for classifiers (a 2-D logits output with more than one class).

Variants that do not apply are kept in the list, skipped with the reason. Failures carry the localized
divergence and are never chosen. Latency is measured with ONNX Runtime, interleaved with the plain export.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from . import custom_ops
from .backends import OrtBackend, default_threads
from .bench import bench_sizes, interleave, stats
from .check import check
from .errors import UsageError
from .export import copy_model, external_data_files, save_model
from .parity import FP16, FP32, ParityResult, Tolerance, compare, input_mapping, run_torch
from .runtime import session
from .samples import Case, make_inputs, validation_cases
from .sources.base import LoadedModel

Progress = Callable[[str], None]
VARIANTS = ("slim", "ort", "fused", "fp16", "int8", "fused+int8")
BASELINE = "export"
COSINE_MIN = 0.99
TOP1_MIN = 0.95
LARGE_BYTES = 1_500_000_000  # above this (or the export threshold, if lower), weights go to external data


def _large_bytes() -> int:
    from .export import external_threshold

    return min(LARGE_BYTES, external_threshold())
ORT_LEVEL = "extended"  # basic/extended graphs are portable; ORT_ENABLE_ALL layouts are hardware-specific


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Metric:
    """A task metric and its threshold."""

    name: str
    value: float | None
    threshold: float
    passed: bool

    def to_dict(self) -> dict:
        return {"name": self.name, "value": None if self.value is None else round(float(self.value), 6),
                "threshold": self.threshold, "passed": self.passed}


@dataclass(frozen=True)
class Variant:
    """One optimized file (or the plain export as baseline) and what proving and timing it found."""

    name: str
    path: str | None  # relative to OUT when inside it
    passed: bool
    reason: str | None = None
    skipped: str | None = None
    nodes: int | None = None
    bytes: int | None = None
    max_abs_err: float | None = None
    metric: dict | None = None
    metrics: tuple[Metric, ...] = ()
    latency_ms: dict[str, float] = field(default_factory=dict)
    speedup: float | None = None
    build_seconds: float = 0.0
    prove_seconds: float = 0.0
    tolerance: dict | None = None
    divergence: dict | None = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The report.json ``variants[]`` entry."""
        return {"name": self.name, "path": self.path, "nodes": self.nodes, "bytes": self.bytes,
                "passed": self.passed, "reason": self.reason, "skipped": self.skipped,
                "max_abs_err": self.max_abs_err, "metric": self.metric,
                "metrics": [m.to_dict() for m in self.metrics], "latency_ms": dict(self.latency_ms),
                "speedup": self.speedup, "build_seconds": round(self.build_seconds, 3),
                "prove_seconds": round(self.prove_seconds, 3), "tolerance": self.tolerance,
                "divergence": self.divergence, "details": self.details}


@dataclass(frozen=True)
class OptimizeResult:
    """All variants (baseline first) and the chosen one."""

    variants: tuple[Variant, ...]
    best: Variant | None
    best_path: Path | None
    threads: int
    ort_level: str = ORT_LEVEL

    def to_list(self) -> list[dict]:
        """report.json ``variants[]``."""
        return [v.to_dict() for v in self.variants]


MIN_GAIN = 1.05  # a variant must beat the plain export by 5% in the side-by-side timing to replace it


def select_best(entries: Sequence[Variant | Mapping[str, Any]]) -> Variant | Mapping[str, Any] | None:
    """The fastest passing entry at batch 1 (ties: the smaller file); None when no entry passed and was timed."""

    def get(e, key):
        return e.get(key) if isinstance(e, Mapping) else getattr(e, key)

    def p50(e) -> float | None:
        lat = get(e, "latency_ms") or {}
        v = lat.get("1", lat.get(1))
        return None if v is None else float(v)

    ok = [e for e in entries if get(e, "passed") and not get(e, "skipped") and p50(e) is not None]
    if not ok:
        return None
    return min(ok, key=lambda e: (p50(e), get(e, "bytes") or 0))


# --------------------------------------------------------------------------- model facts


def transformer_params(loaded: LoadedModel) -> dict | None:
    """num_heads / hidden_size / model_type of a transformer, read from its modules; None otherwise."""
    import torch

    model = loaded.model
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if heads and hidden:
        mtype = getattr(config, "model_type", None) or "bert"
        return {"num_heads": int(heads), "hidden_size": int(hidden),
                "model_type": mtype if mtype in ("bert", "gpt2", "bart", "t5", "vit", "clip") else "bert",
                "found_in": "config"}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            return {"num_heads": int(m.num_heads), "hidden_size": int(m.embed_dim), "model_type": "bert",
                    "found_in": name or "model"}
    return None


def _is_cnn(model: onnx.ModelProto) -> bool:
    ops = [n.op_type for n in model.graph.node]
    return ops.count("Conv") >= max(1, ops.count("MatMul") + ops.count("Gemm"))


def _matmul_weights(model: onnx.ModelProto) -> int:
    inits = {i.name for i in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
               and n.input[1] in inits)


def _init_bytes(model: onnx.ModelProto) -> int:
    return sum(t.ByteSize() for t in model.graph.initializer)


def _save(model: onnx.ModelProto, path: Path) -> None:
    save_model(model, path, external=_init_bytes(model) > _large_bytes())


def _rel(path: Path, out: Path) -> str:
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:240]}" if text else type(e).__name__


# --------------------------------------------------------------------------- builders
# Each builder writes ``dst`` from ``src`` and returns details for the report; ``Skip`` when it does not apply.


class Skip(Exception):
    """The variant does not apply to this model (the message says why)."""


def build_slim(src: Path, dst: Path, ctx: dict) -> dict:
    try:
        import onnxslim
    except ImportError as e:
        raise Skip("onnxslim is not installed (pip install onnxslim)") from e
    model = onnxslim.slim(str(src))
    if model is None:
        raise Skip("onnxslim returned no model")
    _save(model, dst)
    return {"tool": f"onnxslim {getattr(onnxslim, '__version__', '')}".strip()}


def build_ort(src: Path, dst: Path, ctx: dict) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(dst)
    opts.log_severity_level = 3
    if sum(p.stat().st_size for p in [src, *external_data_files(src)]) > _large_bytes():
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    with custom_ops.prepare_session(src, opts) as load_path:  # custom-op libraries / Python implementations
        ort.InferenceSession(load_path, opts, providers=["CPUExecutionProvider"])
    if not dst.exists():
        raise RuntimeError("onnxruntime wrote no optimized model")
    return {"tool": f"onnxruntime {ort.__version__} offline optimization", "level": ORT_LEVEL, "portable": True,
            "note": "saved at ORT_ENABLE_EXTENDED, which is portable across machines; ORT_ENABLE_ALL adds "
                    "hardware-specific layouts (NCHWc) and is applied when the session loads"}


def build_fused(src: Path, dst: Path, ctx: dict) -> dict:
    params = ctx.get("transformer")
    if not params:
        raise Skip("not a transformer (no nn.MultiheadAttention or Hugging Face attention config found)")
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    details: dict = {"num_heads": params["num_heads"], "hidden_size": params["hidden_size"],
                     "model_type": params["model_type"], "params_from": params["found_in"]}
    counts: dict[str, int] = {}
    try:
        model_ir = ir.load(str(src))
        model_ir, raw = optimize_for_ort(model_ir)
        counts = {k: int(v) for k, v in raw.items() if v}
        if counts:
            proto = ir.serde.serialize_model(model_ir)
            _save(proto, dst)
            details.update(tool="onnxscript.rewriter.ort_fusions.optimize_for_ort", fusions=counts)
            return details
    except Exception as e:  # noqa: BLE001 - fall back to onnxruntime's transformer optimizer
        details["onnxscript_error"] = _short(e)
    from onnxruntime.transformers import optimizer

    opt = optimizer.optimize_model(str(src), model_type=params["model_type"], num_heads=params["num_heads"],
                                   hidden_size=params["hidden_size"], opt_level=0, use_gpu=False)
    fused = {k: int(v) for k, v in (opt.get_fused_operator_statistics() or {}).items() if v}
    if not fused:
        raise Skip("no transformer fusion matched this graph (onnxscript and onnxruntime.transformers)")
    _save(opt.model, dst)
    details.update(tool="onnxruntime.transformers.optimizer", fusions=fused)
    return details


def build_fp16(src: Path, dst: Path, ctx: dict) -> dict:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=_init_bytes(model) > _large_bytes())
    _save(half, dst)
    return {"tool": "onnxruntime.transformers.float16", "keep_io_types": True}


def _calibration(loaded: LoadedModel, src: Path, n: int = 8):
    """A CalibrationDataReader over generated inputs at several sizes (export size, min, odd)."""
    from onnxruntime.quantization import CalibrationDataReader

    sess = session(src, opt_level="disable")
    mapping = input_mapping(loaded.inputs, [i.name for i in sess.get_inputs()])
    cases = validation_cases(loaded.dims)
    cheap = [c for c in cases if c.label in ("export", "odd", "min", "edge values")] or cases[:2]
    feeds = []
    for k in range(n):
        c = cheap[k % len(cheap)]
        tensors = make_inputs(loaded.inputs, c.sizes, c.values, 1000 + k)
        feeds.append({mapping[s.name]: t.numpy() for s, t in zip(loaded.inputs, tensors) if s.name in mapping})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    return Reader()


def _quantize_dynamic(src: Path, dst: Path, exclude: Sequence[str] = ()) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gemm"], nodes_to_exclude=list(exclude),
                     use_external_data_format=sum(p.stat().st_size for p in [src, *external_data_files(src)])
                     > _large_bytes(),
                     extra_options={"MatMulConstBOnly": True})


def build_int8(src: Path, dst: Path, ctx: dict) -> dict:
    loaded: LoadedModel = ctx["loaded"]
    model = onnx.load(str(src), load_external_data=False)
    if _is_cnn(model):
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        quantize_static(str(src), str(dst), _calibration(loaded, src), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        return {"tool": "onnxruntime.quantization.quantize_static", "format": "QDQ", "per_channel": True,
                "calibration": "8 generated inputs at the export, min and odd sizes"}
    if _matmul_weights(model) == 0:
        raise Skip("no MatMul/Gemm with constant weights and no Conv: nothing to quantize")
    _quantize_dynamic(src, dst)
    return {"tool": "onnxruntime.quantization.quantize_dynamic", "per_channel": True, "weights": "int8"}


BUILDERS: dict[str, Callable[[Path, Path, dict], dict]] = {
    "slim": build_slim, "ort": build_ort, "fused": build_fused, "fp16": build_fp16, "int8": build_int8,
}


# --------------------------------------------------------------------------- task metric


@dataclass(frozen=True)
class _Refs:
    """PyTorch outputs per case, computed once and shared by every variant."""

    cases: tuple[Case, ...]
    inputs: tuple[tuple, ...]
    outputs: tuple[list[np.ndarray] | None, ...]


def _refs(loaded: LoadedModel, cases: Sequence[Case]) -> _Refs:
    ins, outs = [], []
    for c in cases:
        t = make_inputs(loaded.inputs, c.sizes, c.values, c.seed)
        ins.append(t)
        try:
            outs.append(run_torch(loaded, t))
        except Exception:  # noqa: BLE001 - parity.compare reports it
            outs.append(None)
    return _Refs(tuple(cases), tuple(ins), tuple(outs))


def task_kind(loaded: LoadedModel, ref: Sequence[np.ndarray]) -> str:
    """'sentence-embedding' (mean-pooled, masked), 'classifier' (2-D logits) or 'cosine' (outputs as rows)."""
    names = [s.name for s in loaded.inputs]
    if "last_hidden_state" in loaded.output_names and "attention_mask" in names:
        return "sentence-embedding"
    first = ref[0] if ref else None
    if first is not None and first.ndim == 2 and first.shape[1] > 1 and np.issubdtype(first.dtype, np.floating):
        return "classifier"
    return "cosine"


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of ``hidden`` [B,S,H] over the positions where ``mask`` [B,S] is set."""
    m = mask.astype(np.float64)[..., None]
    return (hidden.astype(np.float64) * m).sum(1) / np.maximum(m.sum(1), 1e-9)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows (1.0 where both rows are ~zero)."""
    a = a.reshape(a.shape[0], -1).astype(np.float64) if a.ndim else a.reshape(1, 1).astype(np.float64)
    b = b.reshape(b.shape[0], -1).astype(np.float64) if b.ndim else b.reshape(1, 1).astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = (a * b).sum(1) / np.maximum(na * nb, 1e-30)
    both_zero = (na < 1e-12) & (nb < 1e-12)
    cos[both_zero] = 1.0
    cos[~np.isfinite(cos)] = -1.0
    return cos


def task_metrics(loaded: LoadedModel, refs: _Refs, sess, cosine_min: float = COSINE_MIN,
                 top1_min: float = TOP1_MIN) -> tuple[Metric, ...]:
    """Cosine (worst row over the matrix) and, for classifiers, top-1 agreement of ``sess`` against PyTorch."""
    mapping = input_mapping(loaded.inputs, [i.name for i in sess.get_inputs()])
    onnx_out = [o.name for o in sess.get_outputs()]
    by_name = all(n in onnx_out for n in loaded.output_names)
    cosines: list[np.ndarray] = []
    agree: list[np.ndarray] = []
    kind = None
    failed = False
    for tensors, ref in zip(refs.inputs, refs.outputs):
        if ref is None:
            continue
        kind = kind or task_kind(loaded, ref)
        feeds = {mapping[s.name]: t.numpy() for s, t in zip(loaded.inputs, tensors) if s.name in mapping}
        try:
            got = sess.run(None, feeds)
        except Exception:  # noqa: BLE001 - counted as a failed metric
            failed = True
            continue
        got_by = dict(zip(onnx_out, got)) if by_name else dict(zip(loaded.output_names, got))
        first = loaded.output_names[0]
        if kind == "sentence-embedding":
            i = loaded.output_names.index("last_hidden_state")
            mask = tensors[[s.name for s in loaded.inputs].index("attention_mask")].numpy()
            r, g = mean_pool(ref[i], mask), mean_pool(np.asarray(got_by["last_hidden_state"]), mask)
        else:
            r, g = ref[0], np.asarray(got_by[first])
        if r.shape != g.shape:
            failed = True
            continue
        cosines.append(row_cosines(r, g))
        if kind == "classifier":
            agree.append(r.argmax(-1) == g.argmax(-1))
    name = "cosine (mean-pooled embedding)" if kind == "sentence-embedding" else "cosine"
    if failed or not cosines:
        out = [Metric(name, None, cosine_min, False)]
        if kind == "classifier":
            out.append(Metric("top1_agreement", None, top1_min, False))
        return tuple(out)
    cmin = float(np.concatenate(cosines).min())
    out = [Metric(name, cmin, cosine_min, cmin >= cosine_min)]
    if kind == "classifier":
        a = float(np.concatenate(agree).mean())
        out.append(Metric("top1_agreement", a, top1_min, a >= top1_min))
    return tuple(out)


def _headline(metrics: Sequence[Metric]) -> dict | None:
    """The entry's ``metric``: the failing one if any, else the first."""
    if not metrics:
        return None
    bad = [m for m in metrics if not m.passed]
    return (bad[0] if bad else metrics[0]).to_dict()


# --------------------------------------------------------------------------- proving


def _policy(name: str, tolerance: Tolerance) -> tuple[Tolerance, bool, bool]:
    """(elementwise tolerance, elementwise decides, metric decides) for a variant name."""
    if "int8" in name:
        return tolerance, False, True
    if "fp16" in name:
        return Tolerance(max(tolerance.atol, FP16.atol), max(tolerance.rtol, FP16.rtol)), True, True
    return tolerance, True, False


def prove(loaded: LoadedModel, name: str, path: Path, refs: _Refs, tolerance: Tolerance) -> dict:
    """Parity of ``path`` against PyTorch with the policy for ``name``: fields for the Variant."""
    tol, by_elements, by_metric = _policy(name, tolerance)
    try:
        sess = session(path)
    except UsageError as e:
        return {"passed": False, "reason": e.message, "tolerance": tol.to_dict()}
    result: ParityResult = compare(loaded, path, cases=list(refs.cases), tolerance=tol, sess=sess)
    metrics = task_metrics(loaded, refs, sess)
    reasons = []
    if by_elements and not result.passed:
        bad = [c for c in result.cases if not c.passed]
        first = bad[0] if bad else None
        reasons.append(f"{len(bad)} of {len(result.cases)} cases outside atol {tol.atol:g} / rtol {tol.rtol:g}"
                       + (f"; first '{first.label}': {first.error or 'outputs differ'}" if first else ""))
    if by_metric:
        for m in metrics:
            if not m.passed:
                val = "n/a" if m.value is None else f"{m.value:.4f}"
                reasons.append(f"{m.name} {val} below {m.threshold}")
    if not by_elements and any(c.error and c.error.startswith("onnxruntime fails") for c in result.cases):
        reasons.append(next(c.error for c in result.cases if c.error and c.error.startswith("onnxruntime fails")))
    passed = not reasons
    err = result.max_abs_err
    fields: dict = {"passed": passed, "reason": "; ".join(reasons) or None, "tolerance": tol.to_dict(),
                    "max_abs_err": float(err) if np.isfinite(err) else None, "metrics": metrics,
                    "metric": _headline(metrics)}
    if not passed:
        fields["divergence"] = _localize(loaded, path, refs, result, tol)
    return fields


def _localize(loaded: LoadedModel, path: Path, refs: _Refs, result: ParityResult, tol: Tolerance) -> dict | None:
    from . import localize

    failing = next((c for c, r in zip(refs.cases, result.cases) if not r.passed), refs.cases[0])
    try:
        d = localize.find(loaded, path, failing, tol)
    except Exception as e:  # noqa: BLE001 - localization is best effort; the failure itself is reported
        return {"error": _short(e)}
    return d.to_dict() if d else None


# --------------------------------------------------------------------------- timing


def measure(paths: dict[str, Path], loaded: LoadedModel, batches: Sequence[int], *, seq: int | None = None,
            seconds: float = 1.5, threads: int | None = None) -> dict[str, dict[str, float]]:
    """p50 ms per name and batch, all files interleaved round-robin on the same inputs and thread count."""
    threads = threads or default_threads()
    backends = {}
    for name, p in paths.items():
        b = OrtBackend(p, threads=threads, name=name)
        try:
            b.open()
        except Exception:  # noqa: BLE001 - a file that cannot load was already reported by prove()
            continue
        backends[name] = b
    out: dict[str, dict[str, float]] = {n: {} for n in paths}
    sizes, _ = bench_sizes(loaded, batches, [seq] if seq else None)
    for batch, _s, dims in sizes:
        tensors = make_inputs(loaded.inputs, dims, "random", 7)
        feeds_by = {}
        for name, b in backends.items():
            mapping = input_mapping(loaded.inputs, [i.name for i in b.inputs])
            feeds_by[name] = {mapping[s.name]: t.numpy() for s, t in zip(loaded.inputs, tensors)
                              if s.name in mapping}
        names = []
        for n, b in backends.items():
            try:
                b.run(feeds_by[n])
            except Exception:  # noqa: BLE001 - a file that fails at this shape is not timed here
                continue
            names.append(n)
        times: dict[str, list[float]] = {n: [] for n in names}
        end = time.perf_counter() + seconds
        r = 0
        while time.perf_counter() < end or any(len(t) < 5 for t in times.values()):
            for n in interleave(names, r):
                t0 = time.perf_counter()
                backends[n].run(feeds_by[n])
                times[n].append(time.perf_counter() - t0)
            r += 1
            if r > 10000:
                break
        for n in names:
            out[n][str(batch)] = round(stats(times[n], batch)["p50_ms"], 4)
    for b in backends.values():
        b.close()
    return out


# --------------------------------------------------------------------------- sensitivity


def sensitive_matmuls(loaded: LoadedModel, src: Path, refs: _Refs, case_indices: Sequence[int] = (0,)) -> list[str]:
    """MatMul/Gemm nodes with constant weights, most int8-sensitive first.

    The error of each node is measured locally, as the localization does: the fp32 graph is run once with
    every candidate's input exposed, and the relative error of simulating ONNX Runtime's dynamic int8
    (activations per tensor uint8, weights per output channel int8) on that very input is the node's cost,
    summed over the cases ``case_indices`` (the failing ones).
    """
    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    cands = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
             and n.input[1] in inits and n.name]
    if not cands:
        return []
    existing = {o.name for o in model.graph.output}
    for n in cands:
        if n.input[0] not in existing:
            model.graph.output.append(onnx.ValueInfoProto(name=n.input[0]))
            existing.add(n.input[0])
    with tempfile.TemporaryDirectory(prefix="onnxport-sens-") as tmp:
        p = Path(tmp) / "exposed.onnx"
        _save(model, p)
        sess = session(p, opt_level="disable")
        mapping = input_mapping(loaded.inputs, [i.name for i in sess.get_inputs()])
        names = [o.name for o in sess.get_outputs()]
        runs = []
        for idx in case_indices:
            tensors = refs.inputs[idx]
            feeds = {mapping[s.name]: t.numpy() for s, t in zip(loaded.inputs, tensors) if s.name in mapping}
            runs.append(dict(zip(names, sess.run(None, feeds))))
        del sess
        cost: dict[str, float] = {}
        for n in cands:  # saving with external data moved the weights to tmp: read them from there
            w = onnx.numpy_helper.to_array(inits[n.input[1]], base_dir=tmp).astype(np.float32)
            if n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute):
                w = w.T
            for values in runs:
                x = values.get(n.input[0])
                if x is None or not np.issubdtype(np.asarray(x).dtype, np.floating) or not np.size(x):
                    continue
                x2 = np.asarray(x, dtype=np.float32).reshape(-1, w.shape[0])
                cost[n.name] = cost.get(n.name, 0.0) + _int8_error(x2, w)
    return sorted(cost, key=lambda k: -cost[k])


def _int8_error(x: np.ndarray, w: np.ndarray) -> float:
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / 255 or 1.0
    zp = np.clip(np.round(-lo / scale), 0, 255)
    xq = (np.clip(np.round(x / scale) + zp, 0, 255) - zp) * scale
    ws = np.abs(w).max(axis=0) / 127
    ws[ws == 0] = 1.0
    wq = np.clip(np.round(w / ws), -127, 127) * ws
    y = x @ w
    return float(np.linalg.norm(xq @ wq - y) / max(np.linalg.norm(y), 1e-12))


# --------------------------------------------------------------------------- entry point


def parse_names(names: Sequence[str] | str | None) -> list[str]:
    if names is None:
        return list(VARIANTS)
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    out = [n.strip() for n in names if n.strip()]
    unknown = [n for n in out if n not in VARIANTS]
    if unknown:
        raise UsageError(f"unknown variant(s): {', '.join(unknown)}", f"choose from {', '.join(VARIANTS)}")
    return list(dict.fromkeys(out))


def _file_facts(path: Path) -> dict:
    try:
        c = check(path)
        return {"nodes": c.nodes, "bytes": c.bytes}
    except Exception:  # noqa: BLE001
        return {"nodes": None, "bytes": path.stat().st_size if path.exists() else None}


def variants(loaded: LoadedModel, model_path: str | Path, out_dir: str | Path, *, names: Sequence[str] | None = None,
             tolerance: Tolerance = FP32, cases: list[Case] | None = None, progress: Progress | None = None,
             bench_batches: Sequence[int] = (1, 8), bench_seq: int | None = None,
             bench_seconds: float = 1.5) -> OptimizeResult:
    """Build the ``names`` variants of ``model_path`` under OUT/variants/, prove each against PyTorch, time
    them interleaved with the plain export, and copy the fastest passing one (or the export) to OUT/best.onnx.
    """
    say = progress or (lambda _m: None)
    wanted = parse_names(names)
    model_path, out = Path(model_path), Path(out_dir)
    if not model_path.is_file():
        raise UsageError(f"ONNX file not found: {model_path}", "pass the model.onnx that onnxport export wrote")
    vdir = out / "variants"
    vdir.mkdir(parents=True, exist_ok=True)
    cases = cases if cases is not None else validation_cases(loaded.dims)
    refs = _refs(loaded, cases)
    ctx = {"loaded": loaded, "transformer": transformer_params(loaded)}
    threads = default_threads()

    say("proving the plain export (baseline)")
    t0 = time.perf_counter()
    base_fields = prove(loaded, BASELINE, model_path, refs, tolerance)
    base_fields.pop("divergence", None)
    entries: list[Variant] = [Variant(BASELINE, _rel(model_path, out), prove_seconds=time.perf_counter() - t0,
                                      **_file_facts(model_path), **base_fields)]
    built: dict[str, Path] = {}
    for name in wanted:
        say(f"variant {name}: building")
        dst = vdir / f"{name}.onnx"
        for stale in [dst, *([p for p in [vdir / (dst.name + ".data")]])]:
            stale.unlink(missing_ok=True)
        t0 = time.perf_counter()
        try:
            details = _build(name, model_path, dst, ctx, built, loaded, refs, tolerance, say)
        except Skip as e:
            entries.append(Variant(name, None, False, reason=str(e), skipped=str(e),
                                   build_seconds=time.perf_counter() - t0))
            continue
        except Exception as e:  # noqa: BLE001 - a tool that crashes is a failed variant, not a crash
            entries.append(Variant(name, None, False, reason=f"building failed: {_short(e)}",
                                   build_seconds=time.perf_counter() - t0))
            continue
        build_s = time.perf_counter() - t0
        say(f"variant {name}: proving against PyTorch")
        t1 = time.perf_counter()
        proved_in_build = details.pop("_proved", None)
        fields = proved_in_build or prove(loaded, name, dst, refs, tolerance)
        prove_s = details.pop("_prove_seconds", 0.0) + time.perf_counter() - t1
        build_s -= details.pop("_prove_seconds_in_build", 0.0)
        entries.append(Variant(name, _rel(dst, out), build_seconds=build_s, prove_seconds=prove_s,
                               details=details, **_file_facts(dst), **fields))
        built[name] = dst

    say("timing the variants against the plain export")
    timed = {BASELINE: model_path, **{e.name: vdir / f"{e.name}.onnx" for e in entries[1:] if e.path}}
    lat = measure(timed, loaded, bench_batches, seq=bench_seq, seconds=bench_seconds, threads=threads)
    base1 = lat.get(BASELINE, {}).get("1") or next(iter(lat.get(BASELINE, {}).values()), None)
    first_key = str(list(bench_batches)[0]) if bench_batches else "1"
    final = []
    for e in entries:
        lm = lat.get(e.name, {})
        mine = lm.get("1", lm.get(first_key))
        speed = round(base1 / mine, 3) if base1 and mine else None
        final.append(replace(e, latency_ms=lm, speedup=speed))
    best = select_best([v for v in final if v.passed])
    if best is None or best.name == BASELINE or not (best.speedup and best.speedup >= MIN_GAIN):
        best = final[0] if final[0].passed else None
    best_path = None
    if best is not None:
        src = model_path if best.name == BASELINE else vdir / f"{best.name}.onnx"
        best_path = out / "best.onnx"
        _copy_model(src, best_path)
    return OptimizeResult(tuple(final), best, best_path, threads)


def _build(name: str, src: Path, dst: Path, ctx: dict, built: dict[str, Path], loaded: LoadedModel, refs: _Refs,
           tolerance: Tolerance, say: Progress) -> dict:
    if name == "fused+int8":
        base = built.get("fused")
        if base is None:
            with tempfile.TemporaryDirectory(prefix="onnxport-fused-") as tmp:
                tmp_fused = Path(tmp) / "fused.onnx"
                build_fused(src, tmp_fused, ctx)  # raises Skip for non-transformers
                return _int8_with_sensitivity("fused+int8", tmp_fused, dst, ctx, loaded, refs, tolerance, say)
        return _int8_with_sensitivity(name, base, dst, ctx, loaded, refs, tolerance, say)
    if name == "int8":
        return _int8_with_sensitivity(name, src, dst, ctx, loaded, refs, tolerance, say)
    return BUILDERS[name](src, dst, ctx)


def _int8_with_sensitivity(name: str, src: Path, dst: Path, ctx: dict, loaded: LoadedModel, refs: _Refs,
                           tolerance: Tolerance, say: Progress) -> dict:
    """int8; when dynamic int8 fails its metric, keep the most sensitive MatMuls in fp32 until it passes."""
    details = build_int8(src, dst, ctx)
    if details.get("format") == "QDQ":
        return details
    t0 = time.perf_counter()
    proved = prove(loaded, name, dst, refs, tolerance)
    spent = time.perf_counter() - t0
    if proved["passed"]:
        return {**details, "_proved": proved, "_prove_seconds": spent, "_prove_seconds_in_build": spent}
    per_case = []
    plain = session(dst)
    for i in range(len(refs.cases)):
        one = _Refs(refs.cases[i:i + 1], refs.inputs[i:i + 1], refs.outputs[i:i + 1])
        per_case.append(all(m.passed for m in task_metrics(loaded, one, plain)))
    del plain
    failing = [i for i, ok in enumerate(per_case) if not ok and refs.outputs[i] is not None] or [0]
    order = sensitive_matmuls(loaded, src, refs, failing)
    total = len(order)
    first_metric = proved.get("metric")
    k = 1
    while order and k <= max(1, total // 2):
        say(f"variant {name}: keeping the {k} most int8-sensitive MatMul(s) in fp32")
        _quantize_dynamic(src, dst, exclude=order[:k])
        if all(m.passed for m in task_metrics(loaded, refs, session(dst))):  # cheap: PyTorch refs are cached
            break
        k *= 2
    kept = order[:min(k, total)]
    t0 = time.perf_counter()
    proved = prove(loaded, name, dst, refs, tolerance)
    spent = time.perf_counter() - t0
    note = ("per-node simulated int8 error on the failing cases' inputs; the k most sensitive kept in fp32 "
            "(k doubling until the metric passes)")
    return {**details, "sensitivity": {"kept_fp32": kept, "of": total, "plain_int8_metric": first_metric,
                                        "method": note}, "_proved": proved,
            "_prove_seconds": spent, "_prove_seconds_in_build": spent}


def _copy_model(src: Path, dst: Path) -> None:
    """Copy an ONNX file (and its external data, renamed to ``<dst>.data``) to ``dst``."""
    data = external_data_files(src)
    dst.unlink(missing_ok=True)
    Path(str(dst) + ".data").unlink(missing_ok=True)
    if not data:
        shutil.copyfile(src, dst)
        return
    copy_model(src, dst)  # bytes copied, weights never loaded (models over 2 GB)
