"""Numerical parity of an ONNX file with PyTorch on the test-case matrix; the tolerance policy."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from onnxport.core.diagnostics import Diagnostic, error, info
from onnxport.core.errors import UsageError
from onnxport.core.records import FP32, CaseResult, DimCheck, Failure, ParityResult, Tolerance, finite
from onnxport.core.samples import Case, make_inputs, shapes_for, validation_cases
from onnxport.prove.across import Across, judge_across
from onnxport.prove.compare import IndexSource, defined, detection_params, judge, undefined_positions
from onnxport.prove.conditioning import against_exact, unsteady_detections
from onnxport.prove.references import Refs, as_numpy, case_key, torch_outputs
from onnxport.prove.telling import HINT, Seen, cannot_tell, summary, telling_cases
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel


def compare(loaded: LoadedModel, onnx_path: str | Path, *, cases: list[Case] | None = None,
            tolerance: Tolerance = FP32, dim_checks: tuple[DimCheck, ...] = (), sess=None,
            refs: Refs | None = None, sweep: Sequence[Case] = (), spent_before: float = 0.0,
            fail_fast: bool = False) -> ParityResult:
    """Run PyTorch and ONNX Runtime on every case and compare all outputs with ``tolerance``. ``refs``: PyTorch's
    inputs and outputs already computed for some of the cases (every variant is judged against the same ones), so
    PyTorch runs only on the cases they lack. ``sweep``: more cases (every size of a short range,
    :func:`~onnxport.core.samples.sweep_cases`) run after the others while they stay cheap: at most
    :data:`SWEEP_SHARE` of the time the others took (``spent_before``: the seconds ``refs`` took to compute), and
    at least :data:`SWEEP_MIN_S`. ``fail_fast``: stop at the first failing case (the cases after it, the sweep
    and the dims it would prove are left out: a file that is not proven either way)."""
    cases = cases if cases is not None else validation_cases(loaded.dims)
    known = {} if refs is None else refs.known()
    if sess is None:
        try:
            sess = session(onnx_path)
        except UsageError as e:
            return _not_loaded(loaded, cases, tolerance, dim_checks, e)
    feed = FeedMap.of(loaded.inputs, sess)
    onnx_outputs = [o.name for o in sess.get_outputs()]
    by_name = all(n in onnx_outputs for n in loaded.output_names)
    diags: list[Diagnostic] = []
    seen: list[dict[str, Seen] | None] = []
    kept: list[dict] = []
    results: list[CaseResult] = []
    for case in cases:
        results.append(_run_case(loaded, sess, feed, case, tolerance, onnx_outputs, by_name,
                                 known.get(case_key(case)), seen, kept))
        if fail_fast and not results[-1].passed:
            cases, sweep = cases[:len(results)], ()
            break
    spent = spent_before + sum(r.seconds for r in results)
    t_sweep = time.perf_counter()
    cases = list(cases)
    for case in sweep:
        if time.perf_counter() - t_sweep > max(SWEEP_MIN_S, SWEEP_SHARE * spent):
            break  # no longer cheap: the sizes left are not claimed (sizes_passed lists those proven)
        results.append(_run_case(loaded, sess, feed, case, tolerance, onnx_outputs, by_name,
                                 known.get(case_key(case)), seen, kept))
        cases.append(case)
    results = [replace(r, sizes=dict(c.sizes)) for c, r in zip(cases, results)]
    silent = cannot_tell(cases, seen)
    checks = _prove_dims(loaded, dim_checks, cases, results, telling_cases(seen, silent))
    alone = _alone_cases(loaded, checks, cases, results) if not fail_fast or all(r.passed for r in results) else []
    if alone:  # a dim unproven only because every case that changed it also changed another: change it alone
        cases = [*cases, *alone]
        results += [replace(_run_case(loaded, sess, feed, c, tolerance, onnx_outputs, by_name, seen=seen),
                            sizes=dict(c.sizes)) for c in alone]
        silent = cannot_tell(cases, seen)
        checks = _prove_dims(loaded, dim_checks, cases, results, telling_cases(seen, silent))
    outputs = {n for s in seen if s for n in s}
    told = bool(outputs) and not outputs <= set(silent)
    over = _across(loaded, kept, tolerance)
    passed = bool(results) and all(r.passed for r in results) and all(d.proven for d in checks) and told and \
        all(a.passed for a in over.values())
    diags.extend(_silent_note(silent, told))
    diags.extend(_across_note(over))
    failed = [r for r in results if not r.passed]
    if failed:
        worst = failed[0]
        diags.append(error(
            "parity-failed",
            f"{len(failed)} of {len(results)} validation cases fail; first: '{worst.label}' at "
            f"{_fmt_shapes(worst.shapes)}: {worst.error or 'outputs differ'}",
            hint=_parity_hint(failed, results),
        ))
    diags.extend(_borderline_note(results))
    diags.extend(_unreliable_note(results) + _unsteady_note(results))
    diags.extend(_exact_note(results))
    if told and any(r.passed and not r.scaled for r in results):
        diags.extend(_unproven_dims(checks))
    return ParityResult(passed, tolerance, tuple(results), checks, tuple(diags), cannot_tell=silent,
                        varying={n: a.to_dict() for n, a in over.items()})


def _not_loaded(loaded: LoadedModel, cases: Sequence[Case], tolerance: Tolerance, dim_checks: tuple[DimCheck, ...],
                e: UsageError) -> ParityResult:
    """Every case failed: onnxruntime cannot load the file (``e``)."""
    msg = e.message.split(": ", 1)[-1]
    failed = tuple(CaseResult(c.label, shapes_for(loaded.inputs, c.sizes), c.values, float("inf"), float("inf"),
                              False, f"onnxruntime cannot load the model: {msg}", sizes=dict(c.sizes),
                              failure=Failure.ORT_LOAD) for c in cases)
    hint = ("the graph uses an operator (or operator version) this onnxruntime has no kernel for; "
            "try another --opset, or replace the op in the model")
    diag = error("onnxruntime-load-failed", f"onnxruntime cannot load the model: {msg}",
                 node=_node_in(msg), hint=e.hint if "registered function/op" in msg else hint)
    return ParityResult(False, tolerance, failed, tuple(replace(d, proven=False) for d in dim_checks), (diag,),
                        load_error=msg)


def _unproven_dims(checks: Sequence[DimCheck]) -> list[Diagnostic]:
    """A symbolic dim the cases that pass do not prove (a size baked into a Reshape or Expand)."""
    return [error("dynamic-dim-unproven",
                  f"input '{d.input}' axis {d.axis} ('{d.symbol}') is symbolic but the model matches PyTorch at "
                  f"{len(d.sizes_passed)} size(s) only ({', '.join(map(str, d.sizes_passed)) or 'none'})",
                  hint="the export probably baked this size into a Reshape or Expand; see the failing cases")
            for d in checks if d.symbolic and not d.proven]


ACROSS = ("topk", "cosine", "detections")  # the --compare rules also judged over the cases (prove/across.py)


def _across(loaded: LoadedModel, kept: list[dict], tolerance: Tolerance) -> dict[str, Across]:
    """The ``--compare`` rules judged over every case on what varies between the inputs (prove/across.py)."""
    rules = {n: r for n, r in loaded.compare.items() if r in ACROSS}
    if not rules or not kept:
        return {}
    params = detection_params(loaded.model) if "detections" in rules.values() else None
    return judge_across(rules, kept, tolerance, params)


def _across_note(over: dict[str, Across]) -> list[Diagnostic]:
    """An error for each output whose rule fails over the cases; an info line for those judged by the fallback."""
    failed = {id(a): (n, a) for n, a in over.items() if not a.passed}  # a detection group: once
    out = [error("varying-failed", f"'{n}' ({a.rule}): {a.problem}", hint=HINT) for n, a in failed.values()]
    told = [f"'{n}': {'; '.join(a.cannot_tell.values())}" for n, a in over.items() if a.passed and a.fallback]
    if told:
        out.append(info("varying-cannot-tell", "judged element by element at the output's own scale where what "
                        "varies between the inputs cannot tell: " + "; ".join(told[:4]), hint=HINT))
    return out


SWEEP_SHARE = 0.5  # the sweep of short ranges may take half the time the matrix took
SWEEP_MIN_S = 2.0  # ... and at least this many seconds


def _silent_note(silent: dict[str, str], told: bool) -> list[Diagnostic]:
    """The outputs whose references cannot tell a right file from a wrong one (prove/telling.py): an error when
    none can (the proof proves nothing), else an info line naming them."""
    if not silent:
        return []
    what = "; ".join(f"'{n}' is {why}" for n, why in list(silent.items())[:4])
    if not told:
        return [error("cannot-tell", f"the comparison cannot tell a right file from a wrong one (PyTorch's {what})",
                      hint=HINT)]
    return [info("outputs-cannot-tell", f"judged on the other outputs: PyTorch's {what}, so comparing "
                 f"{'it' if len(silent) == 1 else 'them'} cannot tell a right file from a wrong one", hint=HINT)]


def _unreliable_note(results: list[CaseResult]) -> list[Diagnostic]:
    """Rows left out because PyTorch's own float32 answer there is outside the tolerance (prove/conditioning.py)."""
    seen = [(r.label, n, o["float32_unreliable_rows"]) for r in results for n, o in r.outputs.items()
            if o.get("float32_unreliable_rows")]
    if not seen:
        return []
    where = ", ".join(f"{n} row(s) {rows} in '{label}'" for label, n, rows in seen[:4])
    return [info("float32-undecidable",
                 f"{where}: PyTorch's own float32 result is outside the tolerance of the float64 result there "
                 f"(ill-conditioned input, e.g. a constant image into GroupNorm), so float32 cannot decide them; "
                 f"those rows were not compared, every other row was",
                 hint="such a case proves no dim; see docs/diagnostics.md")]


def _unsteady_note(results: list[CaseResult]) -> list[Diagnostic]:
    """Detections PyTorch itself does not keep under float32 rounding (prove/conditioning.py): not judged."""
    seen = sorted({(r.label, n.rsplit("_", 1)[0]) for r in results for n, o in r.outputs.items()
                   if o.get("float32_unsteady")})
    if not seen:
        return []
    where = ", ".join(f"{n} in '{label}'" for label, n in seen[:4])
    return [info("detections-undecidable",
                 f"{where}: PyTorch's own detections move more when the inputs are nudged by float32 rounding "
                 f"(1e-6 of their magnitude) than the file's differ from them (a degenerate input, e.g. a black "
                 f"image: tied scores, and rounding picks which boxes the top-k and NMS keep), so float32 cannot "
                 f"decide them; they were not judged",
                 hint="such a case proves no dim; see docs/diagnostics.md")]


def _exact_note(results: list[CaseResult]) -> list[Diagnostic]:
    """Failing outputs compared with the float64 answer instead (prove/conditioning.py)."""
    seen = [(r.label, n, o["float32_noise"]) for r in results for n, o in r.outputs.items()
            if o.get("compared_with") == "float64"]
    if not seen:
        return []
    where = ", ".join(f"{n} in '{label}' ({noise:.2g})" for label, n, noise in seen[:4])
    more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
    return [info("float32-noise",
                 f"outputs off PyTorch's float32 result were compared with the float64 result instead, each row "
                 f"allowed twice PyTorch's own float32 error there on top of the tolerance (at least 1e-4 of its "
                 f"magnitude where PyTorch itself misses the tolerance): {where}{more} (PyTorch's largest error "
                 f"in brackets)",
                 hint="nothing: the file is as close to the exact answer as PyTorch itself; see docs/diagnostics.md")]


def _borderline_note(results: list[CaseResult]) -> list[Diagnostic]:
    """Detections that came and went at the score threshold, the top-k cut or an NMS tie: said, not failed."""
    seen = [(r.label, o["borderline"]) for r in results for n, o in r.outputs.items()
            if o.get("compare") == "detections" and n.endswith("boxes") and o.get("borderline")]
    if not seen:
        return []
    where = ", ".join(f"{n} in '{label}'" for label, n in seen[:4])
    return [info("detections-borderline",
                 f"detections at the score threshold, the top-k cut or an NMS tie differ between PyTorch and "
                 f"onnxruntime ({where}); every other detection matches by IoU",
                 hint="rounding decides these; they are reported, not failed")]


def _run_case(loaded: LoadedModel, sess, feed: FeedMap, case: Case, tolerance: Tolerance,
              onnx_outputs: list[str], by_name: bool, known: tuple[tuple, list[np.ndarray]] | None = None,
              seen: list[dict[str, Seen] | None] | None = None, kept: list[dict] | None = None) -> CaseResult:
    """PyTorch and ONNX Runtime on one case, every output compared (``known``: PyTorch's inputs and outputs of
    this case, already computed; ``seen`` gets what PyTorch returned per output, None where it failed; ``kept``
    both sides of the outputs judged over the cases too, :data:`ACROSS`, in a case not scaled up)."""
    if seen is not None:
        seen.append(None)
    t0 = time.perf_counter()
    inputs = known[0] if known else make_inputs(loaded.inputs, case.sizes, case.values, case.seed)
    shapes = shapes_for(loaded.inputs, case.sizes)

    def failed(kind: Failure, message: str) -> CaseResult:
        return CaseResult(case.label, shapes, case.values, float("inf"), float("inf"), False, message,
                          seconds=time.perf_counter() - t0, failure=kind)

    try:
        ref = known[1] if known else torch_outputs(loaded, inputs)
    except Exception as e:  # noqa: BLE001
        return failed(Failure.TORCH, f"PyTorch itself fails: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    try:
        got = sess.run(None, feed(inputs))
    except Exception as e:  # noqa: BLE001
        return failed(Failure.ORT_RUN, f"onnxruntime fails: {short_ort_error(str(e))}")
    if by_name:
        got_by = dict(zip(onnx_outputs, got))
        pairs = [(n, r, got_by[n]) for n, r in zip(loaded.output_names, ref)]
    elif len(got) == len(ref):
        pairs = [(n, r, g) for n, r, g in zip(loaded.output_names, ref, got)]
    else:
        return failed(Failure.OUTPUT_COUNT, f"PyTorch returns {len(ref)} outputs, the ONNX model {len(got)}")
    if seen is not None:
        seen[-1] = {n: summary(n, r, loaded.compare.get(n, "exact")) for n, r, _ in pairs}
    sources, undefined, scaled = index_sources(loaded, inputs, ref), undefined_outputs(loaded, inputs, pairs), \
        scaled_up(loaded, case)
    per_out, worst_abs, worst_rel, ok, problems = judge(loaded, pairs, tolerance, index_sources=sources,
                                                        undefined=undefined, scaled=scaled)
    if kept is not None and not scaled:
        kept.append({n: (r, defined(r, np.asarray(g), undefined.get(n))) for n, r, g in pairs
                     if loaded.compare.get(n) in ACROSS})
    failing = {n for n, rec in per_out.items() if not rec["passed"] and loaded.compare.get(n, "exact") == "exact"}
    if failing and (exact := against_exact(loaded, inputs, pairs, failing, tolerance)):
        left_out = exact.undecidable
        per_out, worst_abs, worst_rel, ok, problems = judge(
            loaded, [(n, exact.exact.get(n, r), g) for n, r, g in pairs], tolerance, index_sources=sources,
            scaled=scaled, floors=exact.floors,
            undefined={n: np.broadcast_to(undefined.get(n, False), shape) | np.broadcast_to(left_out.get(n, False),
                                                                                             shape)
                       for n, r, _ in pairs if n in undefined or n in left_out for shape in [r.shape]})
        for n, rows in left_out.items():
            per_out[n]["float32_unreliable_rows"] = [int(i) for i in np.flatnonzero(rows)]
        for n, noise in exact.noise.items():
            per_out[n].update(compared_with="float64", float32_noise=finite(noise))
    if not ok and (unsteady := unsteady_detections(loaded, inputs, pairs, per_out, tolerance)):
        for n, own in unsteady.items():  # float32 cannot decide them: left out, like undecidable rows
            per_out[n].update(passed=True, float32_unsteady=own)
        ok = all(rec["passed"] for rec in per_out.values())
        problems = [p for p in problems if p.split(":", 1)[0] not in unsteady]
    return CaseResult(case.label, shapes, case.values, worst_abs, worst_rel, ok, "; ".join(problems) or None,
                      per_out, time.perf_counter() - t0, failure=None if ok else Failure.MISMATCH)


def scaled_up(loaded: LoadedModel, case: Case) -> bool:
    """Whether the case drives float inputs beyond the export's scale (edge values: times 3; ``scaled:F``, |F| > 1):
    its float outputs are judged against their magnitude (compare.magnitudes)."""
    if not any(s.dtype.startswith(("float", "bfloat")) for s in loaded.inputs):
        return False
    if case.values == "edge":
        return True
    if case.values.startswith("scaled:"):
        try:
            return abs(float(case.values.split(":", 1)[1])) > 1.0
        except ValueError:
            return False
    return False


def undefined_outputs(loaded: LoadedModel, inputs: tuple, pairs: list[tuple[str, np.ndarray, np.ndarray]]
                      ) -> dict[str, np.ndarray]:
    """Per output, the positions the attention masks among the inputs (named ``*attention_mask*``, 1: attend)
    leave undefined (compare.undefined_positions): padding positions of ``[batch, seq, ...]`` outputs."""
    masks = [np.asarray(as_numpy(t)) for s, t in zip(loaded.inputs, inputs)
             if "attention_mask" in s.name.lower() and (s.dtype == "bool" or (s.value_range or (0, 1)) == (0, 1))]
    out: dict[str, np.ndarray] = {}
    for name, r, _ in pairs:
        for m in masks:
            where = undefined_positions(m, r.shape)
            if where is not None:
                out[name] = where if name not in out else out[name] | where
    return out


INDEX_OPS = {"topk": (2, -1, True), "sort": (1, -1, True), "argsort": (1, -1, True), "argmax": (1, None, False),
             "argmin": (1, None, False), "max": (1, None, False), "min": (1, None, False),
             "kthvalue": (2, -1, False)}  # op: (position of dim, its default, indices distinct along dim)


class _IndexCapture(TorchFunctionMode):
    """Records every topk/sort/argsort/argmax/argmin/max/min(dim)/kthvalue PyTorch runs: its input, dim and the
    indices it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[torch.Tensor, IndexSource]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = getattr(func, "__name__", "")
        if op in INDEX_OPS and args and isinstance(args[0], torch.Tensor):
            at, default, distinct = INDEX_OPS[op]
            indices = out[1] if isinstance(out, tuple) else out if op.startswith("arg") else None  # not max(x)
            dim = kwargs.get("dim", args[at] if len(args) > at else default)
            keep = kwargs.get("keepdim", args[at + 1] if op not in ("topk", "sort", "argsort") and len(args) > at + 1
                              else op in ("topk", "sort", "argsort"))
            if isinstance(indices, torch.Tensor) and not indices.is_floating_point() and \
                    (dim is None or isinstance(dim, int)) and isinstance(keep, bool):
                self.seen.append((indices, IndexSource(op, as_numpy(args[0]), dim, keep, distinct)))
        return out


def index_sources(loaded: LoadedModel, inputs: tuple, ref: list[np.ndarray]) -> dict[str, IndexSource]:
    """The integer outputs (not judged as detections) that are the indices of a topk, sort, argmax… in PyTorch,
    with the tensor each picked from: PyTorch is run again with :class:`_IndexCapture` (only when such an output
    exists), and an output is the indices an op returned when it is that tensor or equal to it (the last such
    op). An index computed further (``idx + 1``) has no source and is judged exactly."""
    wanted = [i for i, (n, r) in enumerate(zip(loaded.output_names, ref))
              if np.issubdtype(r.dtype, np.integer) and loaded.compare.get(n, "exact") == "exact"]
    if not wanted:
        return {}
    capture = _IndexCapture()
    try:
        with torch.inference_mode(), capture:
            outs = loaded.flat(*inputs)
    except Exception:  # noqa: BLE001 - no capture: the indices are judged exactly
        return {}
    found: dict[str, IndexSource] = {}
    for i in wanted:
        o = outs[i] if i < len(outs) else None
        if not isinstance(o, torch.Tensor):
            continue
        for indices, src in reversed(capture.seen):
            if indices is o or (indices.shape == o.shape and indices.dtype == o.dtype and torch.equal(indices, o)):
                found[loaded.output_names[i]] = src
                break
    return found


def _alone_cases(loaded: LoadedModel, checks: tuple[DimCheck, ...], cases: list[Case],
                 results: list[CaseResult]) -> list[Case]:
    """For each unproven symbolic dim, cases that change that dim alone (the others at a size that passed), so
    that one baked-in size does not leave every other dim unproven too."""
    base = next((c for c, r in zip(cases, results) if r.passed and c.values == "random"), None)
    if base is None or len(loaded.dims) < 2:
        return []
    extra: list[Case] = []
    for d in checks:
        dim = loaded.dims.get(d.symbol)
        if not d.symbolic or d.proven or dim is None or d.symbol not in base.sizes:
            continue
        for size in dict.fromkeys((dim.min, dim.max, (dim.min + dim.max) // 2 | 1)):
            if size != base.sizes[d.symbol] and dim.min <= size <= dim.max:
                extra.append(Case(f"{d.symbol} alone at {size}", {**base.sizes, d.symbol: size}, "random",
                                  100 + len(extra)))
    return extra[:8]



def _prove_dims(loaded: LoadedModel, dim_checks: tuple[DimCheck, ...], cases: list[Case],
                results: list[CaseResult], tells: Sequence[bool] | None = None) -> tuple[DimCheck, ...]:
    """Each dim proven at the sizes of the cases that pass at the plain bound and could tell (``tells``)."""
    tells = [True] * len(cases) if tells is None else tells
    proven = []
    for d in dim_checks:
        sizes = sorted({c.sizes[d.symbol] for c, r, t in zip(cases, results, tells)  # plain bound, not a scaled one
                        if r.passed and t and d.symbol in c.sizes and not r.scaled})
        dim = loaded.dims.get(d.symbol)
        needed = 1 if dim is not None and dim.min == dim.max else 2  # a range of one size is proven at it
        proven.append(replace(d, sizes_passed=tuple(sizes), proven=d.symbolic and len(sizes) >= needed))
    return tuple(proven)


ORT_NODE_ERROR = re.compile(r"running (\w+) node\. Name:'([^']*)'(?: Status Message: (.*))?")


def short_ort_error(message: str) -> str:
    """onnxruntime's error in one short line: the node and the reason, without source paths."""
    text = " ".join(message.split())
    m = ORT_NODE_ERROR.search(text)
    if m and m.group(3):
        reason = m.group(3).split(" was false. ")[-1]
        reason = re.sub(r"/onnxruntime_src/\S+ ", "", reason)
        return f"{m.group(1)} node '{m.group(2)}': {reason}"[:240]
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)[:240]


def _node_in(message: str) -> str | None:
    m = re.search(r"node with name '([^']+)'", message)
    return m.group(1) if m else None


def _fmt_shapes(shapes: dict[str, list[int]]) -> str:
    return ", ".join(f"{k}{v}" for k, v in shapes.items())


def _parity_hint(failed: list[CaseResult], results: list[CaseResult]) -> str:
    if any(r.failure is Failure.ORT_RUN for r in failed):
        if any(r.passed for r in results):
            return ("the graph runs at some shapes only: a size was baked in during export (often a Reshape "
                    "from tracing); try --exporter dynamo, or make the model's reshapes use -1 / x.shape")
        return "onnxruntime cannot run the graph; run 'onnxport check' on it"
    if any(r.failure is Failure.TORCH for r in failed):
        return "the declared --dim ranges include sizes the PyTorch model cannot take; narrow them"
    if any(r.passed for r in results):
        return ("outputs differ at some inputs only: a branch or value may have been frozen during export; "
                "compare the failing cases' shapes and values with the passing ones")
    return "outputs differ everywhere: check model.eval(), random ops, or an operator exported wrongly"
