"""int8 that passes its task metric: when plain int8 fails, keep the fewest nodes in fp32 that make it pass.

The nodes are chosen by a greedy search on a *switch model*: one ONNX graph in which every quantizable node
runs fp32 or int8 depending on a boolean input, so each question ("does the metric pass with these nodes in
fp32?") is one short run instead of one quantization and one new session. Two switch models share the search:
:func:`switch_model` simulates ONNX Runtime's dynamic int8 (``int8``, ``fused+int8``), :func:`qdq_switch_model`
switches the quantized activations of a static QDQ file (NNCF's, ``openvino-int8``: optimize/nncf_int8.py).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from onnxport.optimize.context import BuildContext, BuildOutcome, Refs
from onnxport.optimize.graph import save
from onnxport.optimize.policy import metric_margin, prove, task_metrics
from onnxport.optimize.quantize import QUANT_OPS, build_int8, quant_candidates, quantize_best, weight_ranges
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

POOL = 8  # candidates re-tried after the first greedy step
SEARCH_ROWS = 8  # the worst rows a search round runs on (the user's samples may fail in many batches)
MAX_ROUNDS = 4  # search, quantize, re-check: a case the real kernels still fail joins the next round
METHOD = ("greedy: the node whose fp32 restores the task metric most is kept in fp32, one at a time, on a "
          "model simulating dynamic int8 per node (one run per question); then the real file is re-proven")


# --------------------------------------------------------------------------- the switch model


def fake_int8_weight(w: np.ndarray, axis: int, levels: int = 127) -> np.ndarray:
    """``w`` rounded to symmetric int8 per output channel (``axis``) and back, as quantize_dynamic stores it
    (``levels`` 63 for QAttention, whose weights onnxruntime quantizes with a reduced 7-bit range)."""
    red = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    scale = np.abs(w).max(axis=red, keepdims=True) / levels if red else np.abs(w) / levels
    scale = np.where(scale == 0, 1.0, scale)
    return (np.clip(np.round(w / scale), -levels, levels) * scale).astype(w.dtype)


def switch_model(model: onnx.ModelProto, cands: Sequence[onnx.NodeProto], reduce_range: bool = False) -> list[str]:
    """Rewrite ``model`` in place so that each candidate runs fp32 or simulated dynamic int8 per run.

    Every candidate gets a boolean scalar input: when set, its activation goes through
    DynamicQuantizeLinear/DequantizeLinear (uint8 per tensor, as ONNX Runtime quantizes it at run time) and
    its weight is the int8-rounded copy. One session then answers "which nodes may be int8" for any subset,
    with no re-quantization and no new session per question. Returns the switch input names, in ``cands`` order.
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
        levels = 63 if reduce_range or n.op_type == "Attention" else 127
        wq = numpy_helper.from_array(fake_int8_weight(w, -1, levels), f"{w_name}__int8_{i}")
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


QDQ_OPS = ("MatMul", "Gemm", "Conv")  # the nodes of a QDQ file whose quantized activations the search switches

Rewrite = Callable[[onnx.ModelProto], tuple[list[str], list[str]]]  # model -> (node names, their switch inputs)


def qdq_switch_model(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """Rewrite a static QDQ ``model`` (NNCF's, QuantizeLinear -> DequantizeLinear before each quantized input)
    in place so that each quantized MatMul/Gemm/Conv takes its activations quantized or not per run.

    Every such node gets a boolean scalar input: when set, it reads the dequantized activation, as the file
    does; when not, the float tensor the QuantizeLinear read (after SmoothQuant's scaling, where the weight was
    scaled to match). Its weight stays the stored int8 one either way (per-channel weight rounding costs
    little; the real file with the node left out of int8 is re-proven). Returns (node names, switch inputs).
    """
    from onnx import helper

    g = model.graph
    made = {o: n for n in g.node for o in n.output}
    names: list[str] = []
    switches: list[str] = []
    before: dict[int, list[onnx.NodeProto]] = {}
    for n in g.node:
        if n.op_type not in QDQ_OPS or not n.name:
            continue
        routes = []
        for k, x in enumerate(n.input):
            dq = made.get(x)
            q = made.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":  # an activation (a weight's DQ reads an int8 constant)
                routes.append((k, q.input[0]))
        if not routes:
            continue
        sw = f"onnxport_int8_{len(names)}"
        names.append(n.name)
        switches.append(sw)
        g.input.append(helper.make_tensor_value_info(sw, onnx.TensorProto.BOOL, []))
        before[id(n)] = []
        for k, fp in routes:
            y = f"{sw}_x{k}"
            before[id(n)].append(helper.make_node("Where", [sw, n.input[k], fp], [y]))
            n.input[k] = y
    for n in g.node:  # NNCF may write output_dtype beside a zero point of another type: the zero point's is used
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2]:
            keep = [a for a in n.attribute if a.name != "output_dtype"]
            del n.attribute[:]
            n.attribute.extend(keep)
    nodes = [m for n in g.node for m in [*before.get(id(n), []), n]]
    del g.node[:]
    g.node.extend(nodes)
    return names, switches


class SwitchedSession:
    """A session on the switch model that looks like the plain model's (task_metrics runs it unchanged);
    the switches named in ``fp32`` run their node in fp32, the others in simulated int8."""

    def __init__(self, sess, switches: Sequence[str]) -> None:
        self.sess, self.switches = sess, list(switches)
        self.fp32: set[str] = set()
        self._inputs = [i for i in sess.get_inputs() if i.name not in set(switches)]

    def get_inputs(self):
        """The plain model's inputs (the switches hidden)."""
        return self._inputs

    def get_outputs(self):
        """The model's outputs."""
        return self.sess.get_outputs()

    def run(self, names, feeds):
        """Run with the switches set from ``fp32``."""
        flags = {s: np.array(s not in self.fp32) for s in self.switches}
        return self.sess.run(names, {**feeds, **flags})


# --------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Int8Search:
    """Greedy choice of the nodes kept in fp32, on the simulated-int8 switch model."""

    kept: tuple[str, ...]  # in the order chosen, most useful first
    candidates: int
    margin: float
    evaluations: int
    seconds: float


@dataclass(frozen=True)
class SearchOptions:
    """How :func:`int8_search` searches.

    ``start``: nodes already kept in fp32 (an earlier round's); ``target``: the margin the metric must clear
    its threshold by; ``max_kept``: at most this many nodes kept (default: half the candidates);
    ``budget_s``: seconds before the search stops; ``min_steps``: nodes added even when the metric already
    passes; ``reduce_range``: simulate 7-bit weights; ``rewrite``: how the file becomes the switch model
    (default: :func:`switch_model` on :func:`~onnxport.optimize.quantize.quant_candidates`, simulated dynamic
    int8; :func:`qdq_switch_model` for a static QDQ file); ``opt_level``: onnxruntime's graph optimizations on
    the switch model ("basic" for a QDQ file: onnxruntime's later QDQ rewrites reject NNCF's opset-23 QDQ nodes).
    """

    start: Sequence[str] = ()
    target: float = 0.004
    max_kept: int | None = None
    budget_s: float = 60.0
    min_steps: int = 0
    reduce_range: bool = False
    rewrite: Rewrite | None = None
    opt_level: str = "all"


def int8_search(loaded: LoadedModel, src: Path, sub: Refs, options: SearchOptions = SearchOptions()) -> Int8Search:
    """Keep in fp32, one at a time, the node whose fp32 restores the task metric most (greedy forward
    selection), until the metric on the cases ``sub`` clears its threshold by ``options.target``.

    Each question is one run of the switch model (int8 for every node not kept), so the search costs
    candidates x steps short runs instead of that many quantizations; the caller re-proves the real quantized
    file against PyTorch on the whole matrix.
    """
    o = options
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    if o.rewrite is None:
        cands = quant_candidates(model)
        names = [n.name for n in cands]
        switches = switch_model(model, cands, o.reduce_range)
    else:
        names, switches = o.rewrite(model)
    by_name = dict(zip(names, switches))
    with tempfile.TemporaryDirectory(prefix="onnxport-int8-") as tmp:
        p = Path(tmp) / "switch.onnx"
        save(model, p)
        sw = SwitchedSession(session(p, opt_level=o.opt_level), switches)
    kept = [n for n in o.start if n in by_name]
    limit = o.max_kept if o.max_kept is not None else max(1, len(names) // 2)
    evals = 0

    def score(fp32: Sequence[str]) -> float:
        nonlocal evals
        evals += 1
        sw.fp32 = {by_name[n] for n in fp32}
        return metric_margin(task_metrics(loaded, sub, sw))

    current = score(kept)
    steps = 0
    pool = list(names)
    while ((current < o.target or steps < o.min_steps) and len(kept) < limit
           and time.perf_counter() - t0 < o.budget_s):
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


def failing_cases(loaded: LoadedModel, refs: Refs, sess) -> list[int]:
    """Indices of the cases whose task metric fails under ``sess``."""
    out = []
    for i in range(len(refs.cases)):
        if refs.outputs[i] is None or refs.cases[i].values == "edge":  # the task metric's realistic cases only
            continue
        if not all(m.passed for m in task_metrics(loaded, refs.pick(i), sess)):
            out.append(i)
    return out


def worst_rows(loaded: LoadedModel, refs: Refs, idx: Sequence[int], sess, limit: int = SEARCH_ROWS) -> Refs:
    """Each failing case cut down to its worst batch row under ``sess`` (rows are independent, and the
    search runs them many times: one row of the largest case costs a fraction of the whole case); the
    ``limit`` worst of those rows (a round's re-check brings back any other that still fails)."""
    picked = []
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
                one = Refs((case,), (cut(k),), ([o[k:k + 1] for o in ref],))
                worst, r = min((worst, r), (metric_margin(task_metrics(loaded, one, sess)), k))
            tensors, ref = cut(r), [o[r:r + 1] for o in ref]
        else:
            worst = metric_margin(task_metrics(loaded, Refs((case,), (tensors,), (ref,)), sess))
        picked.append((worst, len(picked), case, tensors, ref))
    picked = sorted(picked, key=lambda p: p[:2])[:limit]
    return Refs(tuple(p[2] for p in picked), tuple(p[3] for p in picked), tuple(p[4] for p in picked))


# --------------------------------------------------------------------------- the builder


@dataclass(frozen=True)
class _Rounds:
    kept: tuple[str, ...]
    search: Int8Search | None
    rounds: int
    evaluations: int


def _search_rounds(name: str, src: Path, dst: Path, ctx: BuildContext, refs: Refs, details: dict,
                   failing: list[int]) -> _Rounds:
    """Search, quantize with the kept nodes, re-check the real file; a case it still fails joins the next round.

    ``failing``: the cases plain int8 fails; ``details`` (the int8 builder's) gets the weight range and
    margins of the last quantization."""
    loaded = ctx.loaded
    kept: tuple[str, ...] = ()
    search = None
    rounds = evaluations = 0
    while failing and rounds < MAX_ROUNDS and not ctx.spent():  # --budget
        rounds += 1
        ctx.progress(f"variant {name}: searching which nodes to keep in fp32 (round {rounds}, "
                     f"{len(failing)} case(s))")
        # after round 1 the simulation said "passes" where the real kernels did not: one more node at least
        left = ctx.seconds_left(60.0)
        search = int8_search(loaded, src, worst_rows(loaded, refs, failing, session(dst)),
                             SearchOptions(start=kept, min_steps=int(rounds > 1),
                                           reduce_range=details["reduce_range"], budget_s=left))
        evaluations += search.evaluations
        if search.kept == kept:
            break
        kept = search.kept
        details["reduce_range"], details["metric_margin"] = quantize_best(loaded, src, dst, refs, kept,
                                                                          ranges=weight_ranges(ctx.thorough))
        details["weights"] = "int8 (7-bit range)" if details["reduce_range"] else "int8"
        failing = failing_cases(loaded, refs, session(dst))
    return _Rounds(kept, search, rounds, evaluations)


def build_int8_searched(name: str, src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``int8`` / ``fused+int8``: :func:`~onnxport.optimize.quantize.build_int8`; when dynamic int8 fails its
    metric, keep the fewest nodes in fp32 that make it pass.

    The nodes are chosen by :func:`int8_search` on the failing cases; the real quantized file is then
    checked on the whole matrix, and a case that still fails joins the search (at most four rounds). With the
    user's samples the search runs on them instead (the task metric is judged there). The outcome carries the
    proof of ``dst`` (the variant is not proven again).
    """
    plain = build_int8(src, dst, ctx)
    refs = ctx.refs
    if plain.details.get("format") == "QDQ" or refs is None:
        return plain
    t0 = time.perf_counter()
    proof = prove(ctx.loaded, name, dst, refs, ctx.tolerance, ctx.samples)
    spent = time.perf_counter() - t0
    if proof.passed:
        return BuildOutcome(plain.details, proof, spent)
    details = dict(plain.details)
    searched = ctx.judged  # the task metric is judged on the user's samples when given
    failing = failing_cases(ctx.loaded, searched, session(dst))
    t_search = time.perf_counter()
    found = _search_rounds(name, src, dst, ctx, searched, details, failing)
    t0 = time.perf_counter()
    proof_after = prove(ctx.loaded, name, dst, refs, ctx.tolerance, ctx.samples)
    spent = time.perf_counter() - t0
    sens = {"kept_fp32": list(found.kept), "of": found.search.candidates if found.search else 0,
            "plain_int8_metric": None if proof.metric is None else proof.metric.to_dict(), "method": METHOD,
            "rounds": found.rounds,
            "evaluations": found.evaluations, "search_seconds": round(time.perf_counter() - t_search - spent, 3)}
    if found.rounds == 0:
        sens["not_run"] = "the --budget was spent before the search could start"
    return BuildOutcome({**details, "quantized_ops": list(QUANT_OPS), "sensitivity": sens}, proof_after, spent)
