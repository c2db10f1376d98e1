"""Where a session's nodes went, read from ONNX Runtime's verbose log, and which CPU nodes matter.

Under a GPU provider some nodes stay on the CPU on purpose: ONNX Runtime keeps shape subgraphs (Shape, then
Gather/Slice/Concat/… on the small int64 shape tensors) on the CPU, where they are cheaper than a launch and
a copy, and logs each such node ("Force fallback to CPU execution for node: NAME"). Those are *shape* nodes.
A CPU node is a shape node when

* its op type only reads or builds shapes (``Shape``, ``Size``), or ONNX Runtime's log says it moved the node
  to the CPU on purpose; or
* its op type is one that shape subgraphs are made of (:data:`SHAPE_OPS`) and, when the ONNX graph is given,
  it works on a shape computation: at least one input comes from a shape node and the others are constants.
  Arithmetic on shapes (Add, Mul, Equal, Where… in :data:`SHAPE_ARITHMETIC`) counts only with the graph.

Every other CPU node is a *compute* node: real work that pays two host-device copies (the ``MemcpyToHost`` /
``MemcpyFromHost`` nodes counted in :attr:`Placement.memcpy_nodes`), typically an operator version the GPU
provider has no kernel for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CPU_PROVIDER = "CPUExecutionProvider"
SHAPE_SOURCES = frozenset({"Shape", "Size"})
SHAPE_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "Range", "Gather", "Slice", "Concat",
                       "Unsqueeze", "Squeeze", "Reshape", "Cast"})
SHAPE_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Equal", "Less",
                              "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where", "Identity",
                              "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "Expand", "Tile", "Flatten"})
MEMCPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})


@dataclass(frozen=True)
class Placement:
    """Which providers a session uses and where its nodes went."""

    device: str
    providers_requested: tuple[str, ...]
    providers_used: tuple[str, ...]  # session.get_providers(): the requested ones the session kept
    nodes_per_provider: dict[str, int] = field(default_factory=dict)
    cpu_fallback_nodes: tuple[str, ...] = ()  # "OpType (name)" of nodes on the CPU although a GPU was asked for
    cpu_compute_nodes: tuple[str, ...] = ()  # those of them doing real work (see the module's docstring)
    cpu_shape_nodes: tuple[str, ...] = ()  # those of them computing shapes, kept on the CPU on purpose
    memcpy_nodes: int = 0  # MemcpyToHost / MemcpyFromHost nodes: host-device copies between providers
    providers_unloadable: tuple[str, ...] = ()  # one line per provider listed but dropped (its library is missing)

    def to_dict(self) -> dict:
        return {"device": self.device, "providers_requested": list(self.providers_requested),
                "providers_used": list(self.providers_used), "nodes_per_provider": dict(self.nodes_per_provider),
                "cpu_fallback_nodes": list(self.cpu_fallback_nodes),
                "cpu_compute_nodes": list(self.cpu_compute_nodes), "cpu_shape_nodes": list(self.cpu_shape_nodes),
                "memcpy_nodes": self.memcpy_nodes, "providers_unloadable": list(self.providers_unloadable)}

    @property
    def compute_op_types(self) -> tuple[str, ...]:
        """The op types of :attr:`cpu_compute_nodes`, each once, in order."""
        return tuple(dict.fromkeys(op_type(n) for n in self.cpu_compute_nodes if not n.startswith("all ")))


_ALL_ON = re.compile(r"All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)")
_SOME_ON = re.compile(r"Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_NODE = re.compile(r"\]\s{2,}(\S.*?)\s*$")
_FORCED = re.compile(r"Force fallback to CPU execution for node: (.+?)(?: because |\s*$)")
_ENTRY = re.compile(r"^(\S+) \((.*)\)$")


def parse_placement(log: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """ONNX Runtime's verbose "Node placements" lines -> ({provider: node count}, {provider: ["Op (name)"]}).

    ONNX Runtime writes ``All nodes placed on [EP]. Number of nodes: N`` when one provider takes everything,
    else one ``Node(s) placed on [EP]. Number of nodes: N`` line per provider followed by one line per node."""
    counts: dict[str, int] = {}
    nodes: dict[str, list[str]] = {}
    current: str | None = None
    for line in log.splitlines():
        if "VerifyEachNodeIsAssignedToAnEp" not in line and current is None:
            continue
        m = _ALL_ON.search(line)
        if m:
            counts[m.group(1)] = int(m.group(2))
            current = None
            continue
        m = _SOME_ON.search(line)
        if m:
            current = m.group(1)
            counts[current] = int(m.group(2))
            nodes[current] = []
            continue
        if current is not None and "VerifyEachNodeIsAssignedToAnEp" in line:
            n = _NODE.search(line)
            if n and "Node placements" not in line:
                nodes[current].append(n.group(1))
            continue
        current = None
    return counts, nodes


def forced_to_cpu(log: str) -> set[str]:
    """Names of the nodes ONNX Runtime's log says it put on the CPU on purpose (its CPU-preferred shape
    subgraphs)."""
    return {m.group(1).strip() for m in _FORCED.finditer(log)}


def op_type(entry: str) -> str:
    """"MaxPool (/pool/MaxPool)" -> "MaxPool"."""
    m = _ENTRY.match(entry.strip())
    return m.group(1) if m else entry.split(" ", 1)[0]


def node_name(entry: str) -> str:
    """"MaxPool (/pool/MaxPool)" -> "/pool/MaxPool"."""
    m = _ENTRY.match(entry.strip())
    return m.group(2) if m else entry


def shape_node_names(graph) -> set[str]:
    """Names of the nodes of an ONNX ``graph`` that compute shapes: Shape/Size, and shape ops or arithmetic
    whose inputs are shape computations or constants (one at least a shape computation)."""
    constant = {i.name for i in graph.initializer} | {""}
    shape_values: set[str] = set()
    names: set[str] = set()
    for node in graph.node:  # ONNX graphs are topologically sorted
        if node.op_type == "Constant":
            constant.update(node.output)
            continue
        ins = list(node.input)
        is_shape = node.op_type in SHAPE_SOURCES or (
            node.op_type in SHAPE_OPS | SHAPE_ARITHMETIC and any(i in shape_values for i in ins)
            and all(i in shape_values or i in constant for i in ins))
        if is_shape:
            shape_values.update(node.output)
            names.add(node.name)
    return names


def classify(cpu_nodes: list[str] | tuple[str, ...], log: str = "", graph=None
             ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split the CPU nodes of a GPU session into (compute nodes, shape nodes); Memcpy nodes are in neither.

    ``log``: the session's verbose log (its CPU-preferred lines); ``graph``: the ONNX graph, when known, to
    tell shape ops on shapes from the same ops on data (a node the optimizer renamed is judged by type)."""
    forced = forced_to_cpu(log)
    traced = shape_node_names(graph) if graph is not None else set()
    known = {n.name for n in graph.node} if graph is not None else set()
    compute: list[str] = []
    shape: list[str] = []
    for entry in cpu_nodes:
        op, name = op_type(entry), node_name(entry)
        if op in MEMCPY_OPS:
            continue
        if (op in SHAPE_SOURCES or name in forced or name in traced
                or (op in SHAPE_OPS and name not in known)):
            shape.append(entry)
        else:
            compute.append(entry)
    return tuple(compute), tuple(shape)


def count_memcpy(nodes: dict[str, list[str]]) -> int:
    """Memcpy nodes on any provider (ONNX Runtime places them on the GPU provider whose copies they make)."""
    return sum(op_type(e) in MEMCPY_OPS for entries in nodes.values() for e in entries)
