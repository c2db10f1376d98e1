"""Divergence localization: the first PyTorch module whose output the ONNX model does not reproduce.

PyTorch side: forward hooks record every module's output in completion order (children before parents).
ONNX side: every node output is exposed as an extra graph output and run once. A module is matched to an
ONNX value through the scope the exporter left on its nodes (the dynamo exporter's
``pkg.torch.onnx.name_scopes`` metadata, or the TorchScript exporter's ``/model/encoder/...`` node names),
and by searching the values of the same shape where no scope matches (files edited or produced by other
tools). The first module whose matched value is out of tolerance is where the two part.
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import torch

from onnxport.core.onnxfile import inline_limit
from onnxport.core.records import Divergence, Tolerance
from onnxport.core.samples import Case, make_inputs
from onnxport.prove.compare import compare_arrays
from onnxport.prove.parity import ORT_NODE_ERROR
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel

MAX_EXPOSED = 6000
MAX_HELD = 1 << 30  # bytes of module outputs a localization keeps (the ONNX side keeps every node's, more again)
WRAPPER = "model"  # the attribute under which FlatModel holds the user's model




# --------------------------------------------------------------------------- scopes


def node_scope(node: onnx.NodeProto) -> str | None:
    """The PyTorch module path a node was exported from ('' for the model itself), if the exporter said."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            if len(scopes) < 2 or scopes[0] != "":
                return None
            return _strip_wrapper(scopes[-2])
    if node.name.startswith("/"):
        parts = [p for p in node.name.split("/") if p]
        if len(parts) >= 2:
            return _strip_wrapper(".".join(parts[:-1]))
    return None


def _strip_wrapper(path: str) -> str | None:
    if path == WRAPPER:
        return ""
    if path.startswith(WRAPPER + "."):
        return path[len(WRAPPER) + 1:]
    return None if path == "" else path


# --------------------------------------------------------------------------- PyTorch side


class TooLarge(Exception):
    """A case's module outputs pass :data:`MAX_HELD`: localizing it would hold several times that in memory."""


def record_modules(loaded: LoadedModel, inputs: tuple[torch.Tensor, ...],
                   calls: dict[str, int] | None = None, budget: int | None = None) -> list[tuple[str, str, np.ndarray]]:
    """(module path, class name, first floating output) of every module's first call, in completion order;
    ``calls``, when given, is filled with how many times each module ran (a shared activation runs many).
    Raises :class:`TooLarge` as soon as the outputs kept pass ``budget`` bytes."""
    records: list[tuple[str, str, np.ndarray]] = []
    seen: set[str] = set()
    handles = []
    held = 0

    def hook_for(path: str):
        def hook(module, args, output):
            if calls is not None:
                calls[path] = calls.get(path, 0) + 1
            if path in seen:
                return
            leaves = [t for t in torch.utils._pytree.tree_leaves(output)
                      if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if leaves:
                nonlocal held
                seen.add(path)
                records.append((path, type(module).__name__, leaves[0].detach().float().cpu().numpy().copy()))
                held += records[-1][2].nbytes
                if budget is not None and held > budget:
                    raise TooLarge(f"its module outputs pass {budget / 2**30:.1f} GiB")
        return hook

    for path, module in loaded.model.named_modules():
        handles.append(module.register_forward_hook(hook_for(path)))
    try:
        with torch.inference_mode():
            loaded.flat(*inputs)
    finally:
        for h in handles:
            h.remove()
    return records


# --------------------------------------------------------------------------- ONNX side


def _expose_all(onnx_path: Path, tmp: Path) -> tuple[Path, dict[str, onnx.NodeProto], dict[str, str | None]]:
    model = onnx.load(str(onnx_path))
    producer: dict[str, onnx.NodeProto] = {}
    scope_of: dict[str, str | None] = {}
    existing = {o.name for o in model.graph.output}
    for node in model.graph.node:
        scope = node_scope(node)
        for out in node.output:
            if out:
                producer[out] = node
                scope_of[out] = scope
    for name in list(producer)[:MAX_EXPOSED]:
        if name not in existing:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    path = tmp / "all_outputs.onnx"
    size = sum(t.ByteSize() for t in model.graph.initializer)
    onnx.save_model(model, str(path), save_as_external_data=size > inline_limit(), location="all_outputs.onnx.data")
    return path, producer, scope_of


def find(loaded: LoadedModel, onnx_path: str | Path, case: Case, tolerance: Tolerance,
         providers: list | None = None) -> Divergence | None:
    """Localize the first diverging module for ``case`` (onnxruntime on ``providers``, default the CPU); None
    when every recorded module matches. Raises :class:`TooLarge` for a case whose module outputs pass
    :data:`MAX_HELD` (every node's value is kept on the ONNX side: a ResNet's case at 4 x 512 x 512 held 12 GiB)."""
    inputs = make_inputs(loaded.inputs, case.sizes, case.values, case.seed)
    calls: dict[str, int] = {}
    records = record_modules(loaded, inputs, calls, budget=MAX_HELD)
    modules = dict(loaded.model.named_modules())
    with tempfile.TemporaryDirectory(prefix="onnxport-localize-") as tmp:
        path, producer, scope_of = _expose_all(Path(onnx_path), Path(tmp))
        sess = session(path, providers=providers)
        names = [o.name for o in sess.get_outputs()]
        feeds = FeedMap.of(loaded.inputs, sess)(inputs)
        try:
            values = dict(zip(names, sess.run(None, feeds)))
        except Exception as e:  # noqa: BLE001 - onnxruntime fails inside the graph: name that node
            return replace(_runtime_failure(str(e), producer, scope_of, modules, case), root=loaded.name)
    by_shape: dict[tuple, list[str]] = {}
    for name, v in values.items():
        if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
            by_shape.setdefault(v.shape, []).append(name)
    last_in_scope: dict[str, str] = {}
    in_scope: dict[str, list[str]] = {}
    for name, scope in scope_of.items():
        if scope is None or name not in values:
            continue
        parts = scope.split(".") if scope else []
        for i in range(len(parts) + 1):
            last_in_scope[".".join(parts[:i])] = name  # producer order is topological: the last one wins
            in_scope.setdefault(".".join(parts[:i]), []).append(name)
    trace: list[dict] = []
    matched: list[tuple[str, str, dict, float]] = []
    for path_, cls, ref in records:
        cand = last_in_scope.get(path_)
        method = "metadata"
        if calls.get(path_, 1) > 1 and path_:
            # a module run several times (one SiLU shared by a block): its scope holds every call's nodes, the
            # last of them the last call's — the first call is the value of its shape in that scope closest to it
            cand = _closest(values, [n for n in in_scope.get(path_, []) if np.shape(values[n]) == ref.shape], ref)
            method = "metadata+value"
        if cand is None or np.shape(values.get(cand)) != ref.shape:
            method = "value-search"
            pool = by_shape.get(ref.shape, [])
            if not pool:
                continue
            cand = _closest(values, pool, ref)
        got = values[cand]
        err, _, passed = compare_arrays(ref, np.asarray(got), tolerance)
        node = producer.get(cand)
        entry = {"module": path_ or f"{loaded.name} (the model's own forward)", "module_type": cls, "node": node.name if node else cand,
                 "op": node.op_type if node else None, "max_abs_err": err if np.isfinite(err) else None,
                 "passed": passed, "method": method}
        trace.append(entry)
        matched.append((cand, path_, entry, err))
    divergence = _first_divergence(matched, case, loaded.name)
    if divergence is None:
        return None
    return replace(divergence, trace=tuple(trace[:200]))


def _holds(parent: str, path: str) -> bool:
    """Whether module ``parent`` holds module ``path`` ('' is the model itself)."""
    return parent == "" or path == parent or path.startswith(parent + ".")


def _first_divergence(matched: list[tuple[str, str, dict, float]], case: Case, root: str) -> Divergence | None:
    """The first module out of tolerance whose ONNX value is not also a later module's: a value two modules share
    is a fusion (a batch norm folded into the convolution before it), which computes the later module's output,
    so the earlier one is not the divergence (its entry says ``fused_into``)."""
    for i, (cand, path, entry, err) in enumerate(matched):
        if entry["passed"]:
            continue
        later = next((e["module"] for c, p, e, _ in matched[i + 1:] if c == cand and not _holds(p, path)), None)
        if later is not None:  # a parent's output is its last child's by construction: no fusion
            entry["fused_into"] = later
            continue
        return Divergence(path, entry["module_type"], entry["node"], entry["op"], err, case.label,
                          entry["method"], root=root)
    return None


def _closest(values: dict[str, np.ndarray], pool: list[str], ref: np.ndarray) -> str | None:
    """The name in ``pool`` whose value is closest to ``ref`` (max abs difference); None for an empty pool."""
    if not pool:
        return None
    return min(pool, key=lambda n: float(np.nanmax(np.abs(values[n].astype(np.float64) - ref)))
               if values[n].size else 0.0)


def _runtime_failure(message: str, producer: dict[str, onnx.NodeProto], scope_of: dict[str, str | None],
                     modules: dict, case: Case) -> Divergence:
    m = ORT_NODE_ERROR.search(" ".join(message.split()))
    op, node_name = (m.group(1), m.group(2)) if m else (None, None)
    scope = None
    for out, node in producer.items():
        if node.name == node_name:
            scope = scope_of.get(out)
            break
    module = scope or ""
    cls = type(modules[module]).__name__ if module in modules else "?"
    first = " ".join(message.split())
    detail = first.split("Status Message:", 1)[-1].strip()[:300]
    return Divergence(module, cls, node_name, op, None, case.label,
                      "metadata" if scope is not None else "runtime-error", (), detail)
