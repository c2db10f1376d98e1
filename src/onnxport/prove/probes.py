"""The probe copy of an ONNX model: what each If, Loop and Scan did on a run, as extra outputs.

An If anywhere (in the main graph, inside If branches, inside Loop and Scan bodies) gives
``[false side taken, true side taken]`` (bool[2]; or-ed over the steps of the loops around it, both false when
the branch holding it did not run). A Loop or Scan of the main graph gives its trip count: a counter carried
through the Loop's body (so a loop whose count is a condition, not ``M``, is counted too), the length of the
Scan's first scanned input.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from onnxport.prove.localize import node_scope

_BRANCHES = ("then_branch", "else_branch")


@dataclass(frozen=True)
class Probe:
    """One If, Loop or Scan and the output of the probe model that tells what it did."""

    node: str
    op: str  # "If" | "Loop" | "Scan"
    module: str | None
    output: str  # "" until the model is instrumented


def find(model: onnx.ModelProto) -> list[Probe]:
    """The Ifs at any depth and the main graph's Loops and Scans, in a fixed order (``instrument``'s)."""
    return _Instrumenter(model, edit=False).run()


def instrument(model: onnx.ModelProto) -> list[Probe]:
    """Add the probe outputs to ``model`` (in place); the probes in ``find``'s order, with their outputs."""
    return _Instrumenter(model, edit=True).run()


def _flags(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.BOOL, [2])


class _Instrumenter:
    def __init__(self, model: onnx.ModelProto, edit: bool) -> None:
        self.model, self.edit = model, edit
        self.found: list[Probe] = []
        self.outputs: dict[int, str] = {}
        self._k = 0

    def fresh(self, base: str) -> str:
        self._k += 1
        return f"onnxport_{base}_{self._k}"

    def run(self) -> list[Probe]:
        graph = self.model.graph
        if self.edit:
            graph.initializer.extend([
                helper.make_tensor("onnxport_zero", TensorProto.INT64, [], [0]),
                helper.make_tensor("onnxport_one", TensorProto.INT64, [], [1]),
                helper.make_tensor("onnxport_shape1", TensorProto.INT64, [1], [1]),
                helper.make_tensor("onnxport_no", TensorProto.BOOL, [2], [False, False]),
            ])
        for index, name in self.graph(graph, top=True, scope=None):
            self.outputs[index] = name
        if self.edit:
            graph.output.extend(onnx.ValueInfoProto(name=n) for n in self.outputs.values())
        return [Probe(p.node, p.op, p.module, self.outputs.get(i, "")) for i, p in enumerate(self.found)]

    def graph(self, graph: onnx.GraphProto, top: bool, scope: str | None) -> list[tuple[int, str]]:
        """(probe index, value name in ``graph``) for every probe ``graph`` holds, nested ones included.
        ``scope``: the module of the node holding ``graph`` (for nodes that do not name their own)."""
        out: list[tuple[int, str]] = []
        for i, node in enumerate(list(graph.node)):
            name = node.name or f"{node.op_type}_{i}"
            module = node_scope(node)
            module = scope if module is None else module
            if node.op_type == "If" and node.input and node.input[0]:
                self.found.append(Probe(name, "If", module, ""))
                out.append((len(self.found) - 1, self._side_flags(graph, node)))
                out += self._through_if(node, module)
            elif node.op_type in ("Loop", "Scan") and any(a.name == "body" for a in node.attribute):
                if top:
                    self.found.append(Probe(name, node.op_type, module, ""))
                    out.append((len(self.found) - 1, self._trips(graph, node)))
                out += self._through_loop(node, module)
        return out

    def _side_flags(self, graph: onnx.GraphProto, node: onnx.NodeProto) -> str:
        """``[not cond, cond]`` beside the If ``node``."""
        if not self.edit:
            return ""
        p = self.fresh("if")
        graph.node.extend([
            helper.make_node("Cast", [node.input[0]], [f"{p}_b"], to=TensorProto.BOOL),
            helper.make_node("Reshape", [f"{p}_b", "onnxport_shape1"], [f"{p}_r"]),
            helper.make_node("Not", [f"{p}_r"], [f"{p}_n"]),
            helper.make_node("Concat", [f"{p}_n", f"{p}_r"], [p], axis=0),
        ])
        return p

    def _through_if(self, node: onnx.NodeProto, module: str | None) -> list[tuple[int, str]]:
        """The probes inside the If's branches, handed out as extra If outputs (the other branch: none taken)."""
        branches = {a.name: a.g for a in node.attribute if a.name in _BRANCHES}
        out = []
        for side in _BRANCHES:
            for index, local in self.graph(branches[side], False, module) if side in branches else []:
                if not self.edit:
                    out.append((index, ""))
                    continue
                for other, g in branches.items():
                    if other == side:
                        g.output.append(_flags(local))
                    else:
                        absent = self.fresh("absent")
                        g.node.append(helper.make_node("Identity", ["onnxport_no"], [absent]))
                        g.output.append(_flags(absent))
                up = self.fresh("up")
                node.output.append(up)
                out.append((index, up))
        return out

    def _through_loop(self, node: onnx.NodeProto, module: str | None) -> list[tuple[int, str]]:
        """The probes inside a Loop or Scan body, or-ed over its steps in an extra carried value."""
        body = next(a.g for a in node.attribute if a.name == "body")
        out = []
        for index, local in self.graph(body, False, module):
            if not self.edit:
                out.append((index, ""))
                continue
            acc = self.fresh("acc")
            body.node.append(helper.make_node("Or", [f"{acc}_in", local], [f"{acc}_out"]))
            out.append((index, self._carry(node, body, f"{acc}_in", f"{acc}_out", _flags, "onnxport_no")))
        return out

    def _carry(self, node: onnx.NodeProto, body: onnx.GraphProto, inside: str, updated: str, info, init: str) -> str:
        """One more value carried through a Loop or Scan (after its own carried values); its final value's name."""
        final = self.fresh("final")
        if node.op_type == "Loop":  # inputs: M, cond, carried…; body: iter, cond, carried… -> cond, carried, scans
            carried = len(node.input) - 2
            body.input.insert(2 + carried, info(inside))
            body.output.insert(1 + carried, info(updated))
            node.input.append(init)
        else:  # Scan: inputs: states…, scanned…; body: states…, slices… -> states…, scan outputs…
            carried = len(node.input) - next(a.i for a in node.attribute if a.name == "num_scan_inputs")
            body.input.insert(carried, info(inside))
            body.output.insert(carried, info(updated))
            node.input.insert(carried, init)
        node.output.insert(carried, final)
        return final

    def _trips(self, graph: onnx.GraphProto, node: onnx.NodeProto) -> str:
        """The trip count of a main-graph Loop (counted) or Scan (the length of its first scanned input)."""
        if not self.edit:
            return ""
        if node.op_type == "Loop":
            count = self.fresh("trips")
            body = next(a.g for a in node.attribute if a.name == "body")
            body.node.append(helper.make_node("Add", [f"{count}_in", "onnxport_one"], [f"{count}_next"]))
            scalar = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, [])  # noqa: E731
            return self._carry(node, body, f"{count}_in", f"{count}_next", scalar, "onnxport_zero")
        scanned = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
        axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [])
        first = node.input[len(node.input) - scanned]
        length = self.fresh("trips")
        graph.initializer.append(helper.make_tensor(f"{length}_axis", TensorProto.INT64, [], [axes[0] if axes else 0]))
        graph.node.extend([helper.make_node("Shape", [first], [f"{length}_shape"]),
                           helper.make_node("Gather", [f"{length}_shape", f"{length}_axis"], [length], axis=0)])
        return length
