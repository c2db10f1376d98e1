"""Branch coverage of the proof: every ONNX ``If`` seen taking both sides, every ``Loop`` run at several trip
counts. Cases that reach a side the matrix missed are searched for (scaled and negated values, sizes at the
thresholds the exporters' shape guards named) and added to the parity matrix."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxport.core.samples import Case, make_inputs
from onnxport.prove.localize import node_scope
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

MAX_PROBES = 32  # extra ONNX Runtime runs spent looking for unreached sides
SCALES = (-1.0, 10.0, -10.0, 0.01, 100.0, -100.0, 0.1, -0.1)


@dataclass
class Site:
    """One top-level If or Loop and what the cases made it do."""

    node: str
    op: str  # "If" | "Loop"
    probe: str  # the If condition / the Loop trip count
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
    """The If nodes and the Loop nodes with a trip count in the main graph."""
    out = []
    for i, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        if n.op_type == "If" and n.input and n.input[0]:
            out.append(Site(name, "If", n.input[0], node_scope(n)))
        elif n.op_type == "Loop" and n.input and n.input[0]:
            out.append(Site(name, "Loop", n.input[0], node_scope(n)))
    return out


class _Prober:
    """Runs the ONNX model with every probe exposed as an output."""

    def __init__(self, path: Path, found: list[Site]) -> None:
        model = onnx.load(str(path), load_external_data=False)
        outputs = {o.name for o in model.graph.output}
        for s in found:
            if s.probe not in outputs:
                model.graph.output.append(onnx.ValueInfoProto(name=s.probe))
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


def _record(found: list[Site], values: dict[str, np.ndarray], label: str) -> bool:
    """Note what each site did on one case; True when the case reached something new."""
    new = False
    for s in found:
        v = np.asarray(values[s.probe]).reshape(-1)
        if not v.size:
            continue
        key: str | int = ("true" if bool(v[0]) else "false") if s.op == "If" else int(v[0])
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


def _candidates(loaded: LoadedModel, cases: list[Case], guards) -> Iterator[Case]:
    """Cases to try for an unreached side: threshold sizes first, then scaled and negated values."""
    k = 0
    for sym, d in loaded.dims.items():
        for t in thresholds(guards):
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
    found = sites(onnx.load(str(path), load_external_data=False))
    if not found:
        return [], []
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
        for probes, cand in enumerate(_candidates(loaded, cases, guards)):
            if all(s.covered for s in found) or probes >= MAX_PROBES:
                break
            values = prober.run(loaded, cand)
            if values is not None and _record(found, values, cand.label):
                extra.append(cand)
    finally:
        prober.close()
    return extra, found
