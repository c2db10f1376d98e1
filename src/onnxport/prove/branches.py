"""Branch coverage of the proof: every ONNX ``If`` (at any depth) seen taking both sides, every ``Loop`` and
``Scan`` run at several trip counts (what each did is read from a probe copy of the model, ``probes``). Cases
that reach a side the matrix missed are searched for (scaled and negated values, sizes at the thresholds the
exporters' shape guards or the graph's own size tests name) and added to the parity matrix, and so are the
sizes either side of a threshold where an If changes side."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxport.core.samples import Case, make_inputs
from onnxport.prove import probes
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

MAX_PROBES = 32  # extra ONNX Runtime runs spent looking for unreached sides
MAX_BOUNDARY = 4  # cases added at the sizes on both sides of a size threshold
_COMPARE = {"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"}
SCALES = (-1.0, 10.0, -10.0, 0.01, 100.0, -100.0, 0.1, -0.1)


@dataclass
class Site:
    """One If (at any depth), or one Loop or Scan of the main graph, and what the cases made it do."""

    node: str
    op: str  # "If" | "Loop" | "Scan"
    probe: str  # the output of the probe model telling what it did (``probes``)
    module: str | None
    seen: dict = field(default_factory=dict)  # If: {"true"/"false": case label}; Loop: {trip count: case label}

    @property
    def covered(self) -> bool:
        return len(self.seen) >= 2

    def to_dict(self) -> dict:
        out = {"node": self.node, "op": self.op, "module": self.module, "covered": self.covered}
        if self.op == "If":
            out["sides"] = {k: self.seen.get(k) for k in ("true", "false")}
        else:
            out["trip_counts"] = {str(k): v for k, v in sorted(self.seen.items())}
        return out


def sites(model: onnx.ModelProto) -> list[Site]:
    """The Ifs at any depth (inside If branches and Loop/Scan bodies too) and the main graph's Loops and Scans."""
    return [Site(p.node, p.op, p.output, p.module) for p in probes.find(model)]


class _Prober:
    """Runs a probe copy of the ONNX model, whose extra outputs say what every site did."""

    def __init__(self, path: Path, found: list[Site]) -> None:
        model = onnx.load(str(path), load_external_data=False)
        made = probes.instrument(model)
        if [(p.node, p.op) for p in made] != [(s.node, s.op) for s in found]:
            raise ValueError("the probe model does not hold the same sites")
        for site, probe in zip(found, made):
            site.probe = probe.output
        probe_path = path.parent / f".{path.stem}.probes.onnx"  # beside it: external data paths stay valid
        onnx.save_model(model, str(probe_path))
        self._path = probe_path
        self.sess = session(probe_path, opt_level="basic")
        self.names = [s.probe for s in found]
        self.feed: FeedMap | None = None  # built on the first run: a mismatch is parity's to report

    def run(self, loaded: LoadedModel, case: Case) -> dict[str, np.ndarray] | None:
        inputs = make_inputs(loaded.inputs, case.sizes, case.values, case.seed)
        if self.feed is None:
            self.feed = FeedMap.of(loaded.inputs, self.sess)
        feeds = self.feed(inputs)
        try:
            values = self.sess.run(self.names, feeds)
        except Exception:  # noqa: BLE001 - a case ONNX Runtime cannot run is parity's to report
            return None
        return dict(zip(self.names, values))

    def close(self) -> None:
        self.sess = None
        self._path.unlink(missing_ok=True)


def _taken(site: Site, values: dict[str, np.ndarray]) -> list[str | int]:
    """What one run made ``site`` do: the If sides taken (none when its branch did not run), the trip count."""
    v = np.asarray(values[site.probe]).reshape(-1)
    if site.op == "If":
        return [side for side, hit in zip(("false", "true"), v[:2]) if hit]
    return [int(v[0])] if v.size else []


def _record(found: list[Site], values: dict[str, np.ndarray], label: str) -> bool:
    """Note what each site did on one case; True when the case reached something new."""
    new = False
    for s in found:
        for key in _taken(s, values):
            if key not in s.seen:
                s.seen[key] = label
                new = True
    return new


def thresholds(guards: Sequence[tuple[str, str, int]]) -> list[int]:
    """Integer constants in the shape guards an exporter added (the sizes where a shape test flips)."""
    found: list[int] = []
    for expr, _, _ in guards:
        found += [int(m) for m in re.findall(r"(?<![\w.])(\d+)(?![\w.])", expr)]
    return sorted(set(found))


def graph_thresholds(model: onnx.ModelProto) -> list[int]:
    """Integer constants an If condition of the main graph compares a size with (``Shape`` → … → ``Greater``)."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
    found: set[int] = set()
    for n in graph.node:
        if n.op_type != "If" or not n.input or not n.input[0]:
            continue
        cone, todo = [], [n.input[0]]
        while todo and len(cone) < 64:
            node = producer.get(todo.pop())
            if node is not None and node not in cone:
                cone.append(node)
                todo.extend(i for i in node.input if i)
        if not any(c.op_type in ("Shape", "Size") for c in cone):
            continue
        for c in cone:
            if c.op_type in _COMPARE:
                found |= {int(consts[i].reshape(-1)[0]) for i in c.input
                          if i in consts and consts[i].size == 1 and consts[i].dtype.kind in "iu"}
    return sorted(found)


def _candidates(loaded: LoadedModel, cases: list[Case], limits: list[int]) -> Iterator[Case]:
    """Cases to try for an unreached side: threshold sizes first, then scaled and negated values."""
    k = 0
    for sym, d in loaded.dims.items():
        for t in limits:
            for size in (t - 1, t, t + 1):
                if d.min <= size <= d.max:
                    k += 1
                    yield Case(f"branch: {sym}={size}", {**cases[0].sizes, sym: size}, "random", 100 + k)
    for base in cases[:3]:
        for scale in SCALES:
            k += 1
            yield Case(f"branch: values x{scale:g} at {base.label} sizes", base.sizes, f"scaled:{scale:g}", 100 + k)


def cover(loaded: LoadedModel, path: str | Path, cases: list[Case],
          guards: Sequence[tuple[str, str, int]] = ()) -> tuple[list[Case], list[Site]]:
    """Observe each If/Loop on ``cases``; search for cases reaching what they missed.

    Returns the extra cases (to add to the parity matrix) and the sites with what each case made them do.
    """
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    found = sites(model)
    if not found:
        return [], []
    limits = sorted(set(thresholds(guards)) | set(graph_thresholds(model)))
    extra: list[Case] = []
    try:
        prober = _Prober(path, found)
    except Exception:  # noqa: BLE001 - no coverage is better than a failed proof; parity still runs
        return [], found
    try:
        for case in cases:
            values = prober.run(loaded, case)
            if values is not None:
                _record(found, values, case.label)
        for probes, cand in enumerate(_candidates(loaded, cases, limits)):
            if all(s.covered for s in found) or probes >= MAX_PROBES:
                break
            values = prober.run(loaded, cand)
            if values is not None and _record(found, values, cand.label):
                extra.append(cand)
        extra += _boundaries(prober, loaded, [*cases, *extra], found, limits)
    finally:
        prober.close()
    return extra, found


def _boundaries(prober: _Prober, loaded: LoadedModel, cases: list[Case], found: list[Site], limits: list[int]
                ) -> list[Case]:
    """Cases at the two sizes either side of a threshold where an If changes side (at most ``MAX_BOUNDARY``):
    the proof then holds right at the size where the model switches path, not only far from it."""
    ifs = [s for s in found if s.op == "If"]
    if not ifs or not limits:
        return []
    have = {tuple(sorted(c.sizes.items())) for c in cases}
    out: list[Case] = []
    for sym, d in loaded.dims.items():
        for t in limits:
            sides: dict[int, tuple[Case, dict, tuple]] = {}
            for size in (t - 1, t, t + 1):
                case = Case(f"boundary: {sym}={size}", {**cases[0].sizes, sym: size}, "random", 200)
                values = prober.run(loaded, case) if d.min <= size <= d.max else None
                if values is not None:
                    taken = tuple(tuple(_taken(s, values)) for s in ifs)
                    sides[size] = (case, values, taken)
            for size in sorted(sides):
                if size + 1 not in sides or sides[size][2] == sides[size + 1][2]:
                    continue
                for case, values, _ in (sides[size], sides[size + 1]):
                    key = tuple(sorted(case.sizes.items()))
                    if key not in have and len(out) < MAX_BOUNDARY:
                        have.add(key)
                        out.append(case)
                        _record(found, values, case.label)
    return out
