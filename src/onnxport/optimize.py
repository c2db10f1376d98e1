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

import contextlib
import functools
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
from .bench import bench_sizes, sizes_at, stats, timed_blocks
from .check import check, file_bytes
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
    timed_at: dict = field(default_factory=dict)  # the dim sizes the winner was chosen at (batch 1)

    def to_list(self) -> list[dict]:
        """report.json ``variants[]``."""
        return [v.to_dict() for v in self.variants]


TIMING_MEMORY_BYTES = 4 * 1024**3  # above this much ONNX on disk, variants are timed one at a time
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
    if file_bytes(src) > _large_bytes():
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    with custom_ops.prepare_session(src, opts) as load_path:  # custom-op libraries / Python implementations
        ort.InferenceSession(load_path, opts, providers=["CPUExecutionProvider"])
    if not dst.exists():
        raise RuntimeError("onnxruntime wrote no optimized model")
    return {"tool": f"onnxruntime {ort.__version__} offline optimization", "level": ORT_LEVEL, "portable": True,
            "note": "saved at ORT_ENABLE_EXTENDED, which is portable across machines; ORT_ENABLE_ALL adds "
                    "hardware-specific layouts (NCHWc) and is applied when the session loads"}


ATTENTION_OPS = ("Attention", "MultiHeadAttention", "PackedAttention", "QAttention")
FUSION_OPSET = 18  # below 23: no standard Attention op, so ONNX Runtime's attention fusions can match


def _fused_attention(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.domain == "com.microsoft" and n.op_type in ATTENTION_OPS)


def _fuse_onnxscript(src: Path) -> tuple[onnx.ModelProto, dict[str, int], str]:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model_ir, raw = optimize_for_ort(ir.load(str(src)))
    return (ir.serde.serialize_model(model_ir), {k: int(v) for k, v in raw.items() if v},
            "onnxscript.rewriter.ort_fusions.optimize_for_ort")


def _fuse_ort(src: Path, params: dict) -> tuple[onnx.ModelProto, dict[str, int], str]:
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions(params["model_type"])
    options.use_raw_attention_mask(True)  # a 1-D mask index changes rows whose mask is all zeros
    opt = optimizer.optimize_model(str(src), model_type=params["model_type"], num_heads=params["num_heads"],
                                   hidden_size=params["hidden_size"], opt_level=0, use_gpu=False,
                                   optimization_options=options)
    fused = {k: int(v) for k, v in (opt.get_fused_operator_statistics() or {}).items() if v}
    if fused.get("Attention") and not _fused_attention(opt.model):  # it counts the standard op too
        fused.pop("Attention")
    have = {o.domain for o in opt.model.opset_import}
    for domain in sorted({n.domain for n in opt.model.graph.node} - have - {"", "ai.onnx"}):
        opt.model.opset_import.append(onnx.helper.make_opsetid(domain, 1))  # save_model_to_file would add it
    return opt.model, fused, "onnxruntime.transformers.optimizer (model_type, heads, hidden from the modules)"


@contextlib.contextmanager
def _eager_attention(model):
    """Hugging Face models with the plain (eager) attention, whose graph ONNX Runtime's fusions recognize."""
    setter = getattr(model, "set_attn_implementation", None)
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if setter is None or before in (None, "eager"):
        yield False
        return
    setter("eager")
    try:
        yield True
    finally:
        setter(before)


def _reexport(loaded: LoadedModel, dst: Path, exporter: str, opset: int) -> str:
    from .export import export as run_export

    with _eager_attention(loaded.model) as eager:
        result = run_export(loaded, dst, exporter=exporter, opset=opset)
    return f"{exporter} re-export at opset {result.opset}" + (" with eager attention" if eager else "")


def _fusion_candidates(src: Path, ctx: dict, tmp: Path):
    """(label, fuse) pairs, cheapest first: the given file, then re-exports whose graphs the fusions know."""
    params = ctx["transformer"]
    yield "given export", lambda: _fuse_onnxscript(src)
    yield "given export", lambda: _fuse_ort(src, params)
    loaded: LoadedModel | None = ctx.get("loaded")
    if loaded is None:
        return
    if params.get("found_in") == "config":  # Hugging Face: the TorchScript graph of eager attention
        def ts() -> tuple:
            p = tmp / "torchscript.onnx"
            how = _reexport(loaded, p, "torchscript", min(FUSION_OPSET, 17))
            model, counts, tool = _fuse_ort(p, params)
            return model, counts, f"{tool}; {how}"
        yield "torchscript re-export", ts

    def dyn() -> tuple:
        p = tmp / "dynamo.onnx"
        how = _reexport(loaded, p, "dynamo", FUSION_OPSET)
        model, counts, tool = _fuse_onnxscript(p)
        return model, counts, f"{tool}; {how}"
    yield "dynamo re-export", dyn


def _quick_parity(loaded: LoadedModel, path: Path, ctx: dict) -> str | None:
    """None when ``path`` matches PyTorch on the two cheap cases of other shapes, else why not."""
    refs: _Refs | None = ctx.get("refs")
    if refs is None:
        return None
    cases = [c for c in refs.cases if c.label in ("min", "odd")] or list(refs.cases[:1])
    result = compare(loaded, path, cases=cases, tolerance=ctx.get("tolerance", FP32))
    if result.passed:
        return None
    bad = next(c for c in result.cases if not c.passed)
    return f"case '{bad.label}': {bad.error or f'max abs err {bad.max_abs_err:.3g}'}"


def build_fused(src: Path, dst: Path, ctx: dict) -> dict:
    """Transformer fusions (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization...).

    The given export is fused first; when no attention fused there, the model is re-exported in a form
    the fusion patterns were written for (TorchScript with eager attention for Hugging Face models, dynamo
    below opset 23 otherwise) and that graph is fused. A re-export must match PyTorch on the min and odd
    cases before it is kept; the variant is then re-proven on the whole matrix like every other.
    """
    params = ctx.get("transformer")
    if not params:
        raise Skip("not a transformer (no nn.MultiheadAttention or Hugging Face attention config found)")
    details: dict = {"num_heads": params["num_heads"], "hidden_size": params["hidden_size"],
                     "model_type": params["model_type"], "params_from": params["found_in"]}
    tried: list[str] = []
    fallback: tuple | None = None
    with tempfile.TemporaryDirectory(prefix="onnxport-fuse-", dir=dst.parent) as tmp_dir:
        tmp = Path(tmp_dir)
        for label, fuse in _fusion_candidates(src, ctx, tmp):
            try:
                model, counts, tool = fuse()
            except Exception as e:  # noqa: BLE001 - one fusion route failing leaves the others
                tried.append(f"{label}: {_short(e)}")
                continue
            if not counts:
                tried.append(f"{label} ({tool.split(' ')[0]}): no fusion matched")
                continue
            if not _fused_attention(model):
                tried.append(f"{label} ({tool.split(' ')[0]}): {sum(counts.values())} fusions, no attention")
                if fallback is None:
                    fallback = (model, counts, tool)
                continue
            cand = tmp / "candidate.onnx"
            _save(model, cand)
            why = None if label == "given export" else _quick_parity(ctx["loaded"], cand, ctx)
            if why:
                tried.append(f"{label}: attention fused but {why}")
                continue
            _copy_model(cand, dst)
            details.update(tool=tool, fusions=counts, graph=label, tried=tried)
            return details
    if fallback is None:
        raise Skip("no transformer fusion matched this graph (" + "; ".join(tried) + ")")
    model, counts, tool = fallback
    _save(model, dst)
    details.update(tool=tool, fusions=counts, graph="given export", tried=tried)
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


# what quantize_dynamic turns into integer ops (it leaves Gemm in fp32); Attention: ONNX Runtime's fused one,
# which becomes QAttention
QUANT_OPS = ("MatMul", "Attention")


def _quantize_dynamic(src: Path, dst: Path, exclude: Sequence[str] = (), reduce_range: bool = False) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ops = {n.op_type for n in _quant_candidates(onnx.load(str(src), load_external_data=False))}
    quantize_dynamic(str(src), str(dst), per_channel=True, reduce_range=reduce_range, weight_type=QuantType.QInt8,
                     op_types_to_quantize=[o for o in QUANT_OPS if o in ops] or ["MatMul"],
                     nodes_to_exclude=list(exclude),
                     use_external_data_format=file_bytes(src)
                     > _large_bytes(),
                     extra_options={"MatMulConstBOnly": True,
                                    # fused contrib ops have no shape-inferred types; their tensors are float
                                    "DefaultTensorType": onnx.TensorProto.FLOAT})


def build_int8(src: Path, dst: Path, ctx: dict) -> dict:
    loaded: LoadedModel = ctx["loaded"]
    model = onnx.load(str(src), load_external_data=False)
    if _is_cnn(model):
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        quantize_static(str(src), str(dst), _calibration(loaded, src), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        return {"tool": "onnxruntime.quantization.quantize_static", "format": "QDQ", "per_channel": True,
                "calibration": "8 generated inputs at the export, min and odd sizes"}
    if _matmul_weights(model) == 0:
        raise Skip("no MatMul/Gemm with constant weights and no Conv: nothing to quantize")
    reduce_range, margins = _quantize_best(loaded, src, dst, ctx.get("refs"))
    return {"tool": "onnxruntime.quantization.quantize_dynamic", "per_channel": True,
            "weights": "int8 (7-bit range)" if reduce_range else "int8", "reduce_range": reduce_range,
            "activations": "uint8, per tensor, at run time", "metric_margin": margins}


def _quantize_best(loaded: LoadedModel, src: Path, dst: Path, refs: _Refs | None,
                   exclude: Sequence[str] = ()) -> tuple[bool, dict]:
    """Dynamic int8 with 8-bit and with 7-bit weights; ``dst`` keeps the one with the better task metric.

    8-bit weights can saturate the int16 pair sums of the int8 kernels on CPUs without VNNI (AVX2); 7-bit
    weights (reduce_range) cannot, and give the same result everywhere.
    """
    scores: dict[bool, float] = {}
    for rr in (False, True):
        _quantize_dynamic(src, dst, exclude=exclude, reduce_range=rr)
        if refs is None:
            return False, {}
        scores[rr] = _margin(task_metrics(loaded, refs, session(dst)))
    reduce_range = scores[True] > scores[False]
    if not reduce_range:
        _quantize_dynamic(src, dst, exclude=exclude, reduce_range=False)
    return reduce_range, {"8-bit": _r(scores[False]), "7-bit": _r(scores[True])}


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 5)


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
    """p50 ms per name and batch, all files timed in interleaved warm blocks on the same inputs and threads."""
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
        times = timed_blocks({n: functools.partial(backends[n].run, feeds_by[n]) for n in names}, seconds=seconds)
        for n in names:
            out[n][str(batch)] = round(stats(times[n], batch)["p50_ms"], 4)
    for b in backends.values():
        b.close()
    return out


# --------------------------------------------------------------------------- sensitivity


def _quant_candidates(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes dynamic int8 quantizes: MatMul and ONNX Runtime's Attention with a constant weight."""
    inits = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in QUANT_OPS and len(n.input) > 1 and n.input[1] in inits
            and n.name and (n.op_type != "Attention" or n.domain == "com.microsoft")]


def _fake_int8_weight(w: np.ndarray, axis: int, levels: int = 127) -> np.ndarray:
    """``w`` rounded to symmetric int8 per output channel (``axis``) and back, as quantize_dynamic stores it
    (``levels`` 63 for QAttention, whose weights onnxruntime quantizes with a reduced 7-bit range)."""
    red = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    scale = np.abs(w).max(axis=red, keepdims=True) / levels if red else np.abs(w) / levels
    scale = np.where(scale == 0, 1.0, scale)
    return (np.clip(np.round(w / scale), -levels, levels) * scale).astype(w.dtype)


def _switch_model(model: onnx.ModelProto, cands: Sequence[onnx.NodeProto], reduce_range: bool = False) -> list[str]:
    """Rewrite ``model`` in place so that each candidate runs fp32 or simulated dynamic int8 per run.

    Every candidate gets a boolean scalar input: when set, its activation goes through
    DynamicQuantizeLinear/DequantizeLinear (uint8 per tensor, as ONNX Runtime quantizes it at run time) and
    its weight is the int8-rounded copy. One session then answers "which nodes may be int8" for any subset,
    with no re-quantization and no new session per question.
    """
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    targets = {id(n): i for i, n in enumerate(cands)}
    switches, nodes = [], []
    for n in g.node:
        i = targets.get(id(n))
        if i is None:
            nodes.append(n)
            continue
        sw, x, w_name = f"onnxport_int8_{i}", n.input[0], n.input[1]
        switches.append(sw)
        g.input.append(helper.make_tensor_value_info(sw, onnx.TensorProto.BOOL, []))
        w = numpy_helper.to_array(inits[w_name])
        wq = numpy_helper.from_array(_fake_int8_weight(w, -1,
                                                    63 if reduce_range or n.op_type == "Attention" else 127), f"{w_name}__int8_{i}")
        g.initializer.append(wq)
        p = f"onnxport_int8_{i}_"
        nodes += [helper.make_node("DynamicQuantizeLinear", [x], [p + "xq", p + "xs", p + "xz"]),
                  helper.make_node("DequantizeLinear", [p + "xq", p + "xs", p + "xz"], [p + "xd"]),
                  helper.make_node("Where", [sw, p + "xd", x], [p + "x"]),
                  helper.make_node("Where", [sw, wq.name, w_name], [p + "w"])]
        n.input[0], n.input[1] = p + "x", p + "w"
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return switches


class _Switched:
    """A session on the switch model that looks like the plain model's (task_metrics runs it unchanged)."""

    def __init__(self, sess, switches: Sequence[str]) -> None:
        self.sess, self.switches = sess, list(switches)
        self.fp32: set[str] = set()
        self._inputs = [i for i in sess.get_inputs() if i.name not in set(switches)]

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self.sess.get_outputs()

    def run(self, names, feeds):
        flags = {s: np.array(s not in self.fp32) for s in self.switches}
        return self.sess.run(names, {**feeds, **flags})


def _margin(metrics: Sequence[Metric]) -> float:
    """How far the worst metric is above its threshold (negative: failing)."""
    return min((m.value - m.threshold) if m.value is not None else -1.0 for m in metrics)


POOL = 8  # candidates re-tried after the first greedy step


@dataclass(frozen=True)
class Int8Search:
    """Greedy choice of the nodes kept in fp32, on the simulated-int8 switch model."""

    kept: tuple[str, ...]  # in the order chosen, most useful first
    candidates: int
    margin: float
    evaluations: int
    seconds: float


def int8_search(loaded: LoadedModel, src: Path, sub: _Refs, *, start: Sequence[str] = (), target: float = 0.004,
                max_kept: int | None = None, budget_s: float = 60.0, min_steps: int = 0,
                reduce_range: bool = False) -> Int8Search:
    """Keep in fp32, one at a time, the node whose fp32 restores the task metric most (greedy forward
    selection), until the metric on the cases ``sub`` clears its threshold by ``target``.

    Each question is one run of the switch model (simulated dynamic int8 for every node not kept), so the
    search costs candidates x steps short runs instead of that many quantizations; the caller re-proves
    the real quantized file against PyTorch on the whole matrix.
    """
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    cands = _quant_candidates(model)
    names = [n.name for n in cands]
    switches = _switch_model(model, cands, reduce_range)
    by_name = dict(zip(names, switches))
    with tempfile.TemporaryDirectory(prefix="onnxport-int8-") as tmp:
        p = Path(tmp) / "switch.onnx"
        _save(model, p)
        sw = _Switched(session(p), switches)
    kept = [n for n in start if n in by_name]
    limit = max_kept if max_kept is not None else max(1, len(names) // 2)
    evals = 0

    def score(fp32: Sequence[str]) -> float:
        nonlocal evals
        evals += 1
        sw.fp32 = {by_name[n] for n in fp32}
        return _margin(task_metrics(loaded, sub, sw))

    current = score(kept)
    steps = 0
    pool = list(names)
    while ((current < target or steps < min_steps) and len(kept) < limit
           and time.perf_counter() - t0 < budget_s):
        steps += 1
        trials = [(score([*kept, n]), n) for n in pool if n not in kept]
        if not trials:
            break
        if steps == 1:  # later steps only try the nodes that helped most on their own
            pool = [n for _, n in sorted(trials, reverse=True)[:POOL]]
        best, node = max(trials)
        kept.append(node)
        current = best
    return Int8Search(tuple(kept), len(names), current, evals, time.perf_counter() - t0)


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

    The winner is the fastest at batch 1 and, for token inputs, sequence length ``bench_seq`` (default: the
    export size): int8 and fusions pay off differently at 16 and at 128 tokens, so time at your traffic's length.
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
    ctx = {"loaded": loaded, "transformer": transformer_params(loaded), "refs": refs, "tolerance": tolerance}
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
    first_key = str(list(bench_batches)[0]) if bench_batches else "1"
    on_disk = {n: file_bytes(p) for n, p in timed.items() if p.exists()}
    if sum(on_disk.values()) <= TIMING_MEMORY_BYTES:
        lat = measure(timed, loaded, bench_batches, seq=bench_seq, seconds=bench_seconds, threads=threads)
        base = dict.fromkeys(timed, lat.get(BASELINE, {}).get("1")
                             or next(iter(lat.get(BASELINE, {}).values()), None))
    else:  # large files: one variant at a time beside the export, so at most two sessions are in memory
        lat, base = {}, {}
        for name, p in timed.items():
            if name == BASELINE:
                continue
            pair = measure({BASELINE: model_path, name: p}, loaded, bench_batches, seq=bench_seq,
                           seconds=bench_seconds, threads=threads)
            lat[name] = pair.get(name, {})
            lat.setdefault(BASELINE, pair.get(BASELINE, {}))
            base[name] = pair.get(BASELINE, {}).get("1") or pair.get(BASELINE, {}).get(first_key)
        base[BASELINE] = lat.get(BASELINE, {}).get("1") or lat.get(BASELINE, {}).get(first_key)
    final = []
    for e in entries:
        lm = lat.get(e.name, {})
        mine = lm.get("1", lm.get(first_key))
        base1 = base.get(e.name)
        speed = round(base1 / mine, 3) if base1 and mine else None
        final.append(replace(e, latency_ms=lm, speedup=speed))
    best = select_best([v for v in final if v.passed])
    if best is not None and best.name != BASELINE and best.speedup and best.speedup >= MIN_GAIN:
        # the round-robin over every variant gives each few runs: confirm the winner against the export alone,
        # longer, before it replaces the export (a noisy machine otherwise picks a slower file)
        say(f"confirming {best.name} against the plain export")
        again = measure({BASELINE: model_path, best.name: vdir / f"{best.name}.onnx"}, loaded, [1], seq=bench_seq,
                        seconds=max(2 * bench_seconds, 3.0), threads=threads)
        b1, m1 = again.get(BASELINE, {}).get("1"), again.get(best.name, {}).get("1")
        confirmed = round(b1 / m1, 3) if b1 and m1 else None
        best = replace(best, details={**best.details, "confirmed_speedup": confirmed})
        final = [best if v.name == best.name else v for v in final]
        if not (confirmed and confirmed >= MIN_GAIN):
            best = None
    if best is None or best.name == BASELINE or not (best.speedup and best.speedup >= MIN_GAIN):
        best = final[0] if final[0].passed else None
    best_path = None
    if best is not None:
        src = model_path if best.name == BASELINE else vdir / f"{best.name}.onnx"
        best_path = out / "best.onnx"
        _copy_model(src, best_path)
    return OptimizeResult(tuple(final), best, best_path, threads, timed_at=sizes_at(loaded, bench_seq))


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
    """int8; when dynamic int8 fails its metric, keep the fewest nodes in fp32 that make it pass.

    The nodes are chosen by :func:`int8_search` on the failing cases; the real quantized file is then
    checked on the whole matrix, and a case that still fails joins the search (at most four rounds).
    """
    details = build_int8(src, dst, ctx)
    if details.get("format") == "QDQ":
        return details
    t0 = time.perf_counter()
    proved = prove(loaded, name, dst, refs, tolerance)
    spent = time.perf_counter() - t0
    if proved["passed"]:
        return {**details, "_proved": proved, "_prove_seconds": spent, "_prove_seconds_in_build": spent}
    first_metric = proved.get("metric")
    failing = _failing_cases(loaded, refs, session(dst))
    kept: tuple[str, ...] = ()
    search = None
    rounds = evaluations = 0
    t_search = time.perf_counter()
    while failing and rounds < 4:
        rounds += 1
        say(f"variant {name}: searching which nodes to keep in fp32 (round {rounds}, {len(failing)} case(s))")
        # after round 1 the simulation said "passes" where the real kernels did not: one more node at least
        search = int8_search(loaded, src, _worst_rows(loaded, refs, failing, session(dst)), start=kept,
                             min_steps=int(rounds > 1), reduce_range=details["reduce_range"])
        evaluations += search.evaluations
        if search.kept == kept:
            break
        kept = search.kept
        details["reduce_range"], details["metric_margin"] = _quantize_best(loaded, src, dst, refs, kept)
        details["weights"] = "int8 (7-bit range)" if details["reduce_range"] else "int8"
        failing = _failing_cases(loaded, refs, session(dst))
    t0 = time.perf_counter()
    proved = prove(loaded, name, dst, refs, tolerance)
    spent = time.perf_counter() - t0
    note = ("greedy: the node whose fp32 restores the task metric most is kept in fp32, one at a time, on a "
            "model simulating dynamic int8 per node (one run per question); then the real file is re-proven")
    sens = {"kept_fp32": list(kept), "of": search.candidates if search else 0, "plain_int8_metric": first_metric,
            "method": note, "rounds": rounds, "evaluations": evaluations,
            "search_seconds": round(time.perf_counter() - t_search - spent, 3)}
    return {**details, "quantized_ops": list(QUANT_OPS), "sensitivity": sens, "_proved": proved,
            "_prove_seconds": spent, "_prove_seconds_in_build": spent}


def _failing_cases(loaded: LoadedModel, refs: _Refs, sess) -> list[int]:
    out = []
    for i in range(len(refs.cases)):
        if refs.outputs[i] is None:
            continue
        one = _Refs(refs.cases[i:i + 1], refs.inputs[i:i + 1], refs.outputs[i:i + 1])
        if not all(m.passed for m in task_metrics(loaded, one, sess)):
            out.append(i)
    return out


def _worst_rows(loaded: LoadedModel, refs: _Refs, idx: Sequence[int], sess) -> _Refs:
    """Each failing case cut down to its worst batch row under ``sess`` (rows are independent, and the
    search runs them many times: one row of the largest case costs a fraction of the whole case)."""
    cases, inputs, outputs = [], [], []
    for i in idx:
        case, tensors, ref = refs.cases[i], refs.inputs[i], refs.outputs[i]
        batched = [bool(s.shape) and isinstance(s.shape[0], str) and t.ndim > 0 for s, t in zip(loaded.inputs, tensors)]
        sizes = {int(t.shape[0]) for b, t in zip(batched, tensors) if b}
        rows = next(iter(sizes)) if len(sizes) == 1 else 1

        def cut(k: int, tensors=tensors, batched=batched) -> tuple:
            return tuple(t[k:k + 1] if b else t for b, t in zip(batched, tensors))

        if rows > 1 and all(o.ndim and o.shape[0] == rows for o in ref):
            worst, r = 2.0, 0
            for k in range(rows):
                one = _Refs((case,), (cut(k),), ([o[k:k + 1] for o in ref],))
                worst, r = min((worst, r), (_margin(task_metrics(loaded, one, sess)), k))
            tensors, ref = cut(r), [o[r:r + 1] for o in ref]
        cases.append(case)
        inputs.append(tensors)
        outputs.append(ref)
    return _Refs(tuple(cases), tuple(inputs), tuple(outputs))


def _copy_model(src: Path, dst: Path) -> None:
    """Copy an ONNX file (and its external data, renamed to ``<dst>.data``) to ``dst``."""
    data = external_data_files(src)
    dst.unlink(missing_ok=True)
    Path(str(dst) + ".data").unlink(missing_ok=True)
    if not data:
        shutil.copyfile(src, dst)
        return
    copy_model(src, dst)  # bytes copied, weights never loaded (models over 2 GB)
