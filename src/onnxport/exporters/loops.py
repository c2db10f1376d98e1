"""Loops over a dynamic size kept as a loop: ``for t in range(n)`` (and ``while t < n: … t += 1``) in forward()
rewritten as torch's ``scan`` higher-order operator, which the dynamo exporter writes as an ONNX ``Scan``.

The loop body becomes the scan's step function. Names the body rebinds that were bound before the loop are
the carry; ``x[:, t]`` on a tensor the loop leaves alone becomes a slice the scan hands to each step (``x``
moved so that the indexed dim is first); ``outs.append(v)`` on a list made empty just before the loop becomes
a stacked scan output, and ``torch.stack(outs, d)`` / ``torch.cat(outs, d)`` / ``outs[i]`` / ``len(outs)``
after the loop read it. Any other use of the index reads it as a 0-d tensor. A loop doing something a scan
cannot (``break``, writes into a tensor or an attribute, in-place methods) is left alone.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from onnxport.exporters import conds
from onnxport.exporters.conds import assigned, attr, call, fresh, name, walk

_MUTATORS = {"append", "extend", "insert", "pop", "update", "setdefault", "remove", "clear", "add"}


@dataclass
class _Plan:
    """A loop in ``for index in range(start, stop)`` form."""

    index: str
    start: ast.expr | None  # None: 0
    stop: ast.expr
    body: list[ast.stmt]


def _int(node: ast.expr | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and (v := _int(node.operand)) is not None:
        return -v
    return None


def _for_plan(stmt: ast.For) -> _Plan | None:
    """``for t in range(stop)`` / ``range(start, stop)`` whose stop is not a literal."""
    it = stmt.iter
    if stmt.orelse or not isinstance(stmt.target, ast.Name) or not isinstance(it, ast.Call) \
            or not (isinstance(it.func, ast.Name) and it.func.id == "range") or it.keywords \
            or not 1 <= len(it.args) <= 2 or _int(it.args[-1]) is not None:
        return None
    start = it.args[0] if len(it.args) == 2 else None
    return _Plan(stmt.target.id, None if _int(start) == 0 else start, it.args[-1], stmt.body)


def _is_step(stmt: ast.stmt, index: str) -> bool:
    """``index += 1`` or ``index = index + 1``."""
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == index and isinstance(stmt.op, ast.Add) \
            and _int(stmt.value) == 1
    return isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
        and stmt.targets[0].id == index and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add) \
        and isinstance(stmt.value.left, ast.Name) and stmt.value.left.id == index and _int(stmt.value.right) == 1


def _while_plan(stmt: ast.While, before: list[ast.stmt]) -> _Plan | None:
    """``while t < stop: … t += 1`` (the step last, ``t`` rebound nowhere else, ``stop`` unchanged by the body)."""
    test = stmt.test
    if stmt.orelse or not stmt.body or not isinstance(test, ast.Compare) or len(test.ops) != 1 \
            or not isinstance(test.ops[0], ast.Lt) or not isinstance(test.left, ast.Name):
        return None
    index, stop, body = test.left.id, test.comparators[0], stmt.body[:-1]
    if not _is_step(stmt.body[-1], index) or index in assigned(body) or conds.loaded([stop]) & assigned(stmt.body):
        return None
    start: ast.expr | None = name(index)
    for prior in reversed(before):
        if index in assigned([prior]):
            if isinstance(prior, ast.Assign) and len(prior.targets) == 1 and _int(prior.value) is not None:
                start = None if _int(prior.value) == 0 else prior.value
            break
    return _Plan(index, start, stop, body)


def _appended_lists(body: list[ast.stmt], before: list[ast.stmt]) -> dict[str, int] | None:
    """{list name: position of its ``append`` in ``body``} for lists made empty before the loop and only
    appended to, once per step; None when the body changes a container in another way."""
    found: dict[str, int] = {}
    for i, stmt in enumerate(body):
        target = _append_target(stmt)
        if target is None:
            continue
        prior = next((s for s in reversed(before) if target in assigned([s])), None)
        made_empty = isinstance(prior, ast.Assign) and isinstance(prior.value, ast.List) and not prior.value.elts
        if not made_empty or target in found:
            return None
        found[target] = i
    rest = [s for i, s in enumerate(body) if i not in found.values()]
    for n in walk(rest):
        if isinstance(n, ast.Name) and n.id in found:
            return None  # the list is read inside the loop
        if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            return None  # a write into a tensor or an attribute
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (
                n.func.attr in _MUTATORS or (n.func.attr.endswith("_") and not n.func.attr.endswith("__"))):
            return None  # an in-place method
    return found


def _append_target(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and stmt.value.func.attr == "append" and isinstance(stmt.value.func.value, ast.Name) \
            and len(stmt.value.args) == 1 and not stmt.value.keywords:
        return stmt.value.func.value.id
    return None


class _Slots(ast.NodeTransformer):
    """``x[:, t]`` (``x`` unchanged by the loop, full slices before ``t``) → a per-step slice of ``x``."""

    def __init__(self, index: str, frozen: set[str], k: int) -> None:
        self.index, self.frozen, self.k = index, frozen, k
        self.slots: dict[tuple[str, int], str] = {}

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:  # noqa: N802 - NodeTransformer naming
        self.generic_visit(node)
        if not isinstance(node.value, ast.Name) or not isinstance(node.ctx, ast.Load) or node.value.id in self.frozen:
            return node
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        p = next((j for j, e in enumerate(elts) if isinstance(e, ast.Name) and e.id == self.index), None)
        if p is None or not all(isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None
                                for e in elts[:p]):
            return node
        slot = self.slots.setdefault((node.value.id, p), f"_x{len(self.slots)}_{self.k}")
        rest = elts[:p] + elts[p + 1:]
        if all(isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None for e in rest):
            return name(slot)
        return ast.Subscript(value=name(slot), slice=rest[0] if len(rest) == 1 else ast.Tuple(elts=rest, ctx=ast.Load()),
                             ctx=ast.Load())


class _ListUses(ast.NodeTransformer):
    """What reads a scanned list after the loop, reading the stacked scan output instead."""

    def __init__(self, stacked: dict[str, str]) -> None:
        self.stacked = stacked
        self.replaced = 0

    def _list(self, node: ast.expr) -> str | None:
        return self.stacked.get(node.id) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) else None

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:  # noqa: N802 - NodeTransformer naming
        self.generic_visit(node)
        ys = self._list(node.value)
        if ys is None or isinstance(node.slice, ast.Slice) or not isinstance(node.ctx, ast.Load):
            return node
        self.replaced += 1
        return ast.Subscript(value=name(ys), slice=node.slice, ctx=ast.Load())

    def visit_Call(self, node: ast.Call) -> ast.expr:  # noqa: N802 - NodeTransformer naming
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1 \
                and (ys := self._list(node.args[0])):
            self.replaced += 1
            return ast.Subscript(value=attr(name(ys), "shape"), slice=ast.Constant(0), ctx=ast.Load())
        func = node.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch"
                and func.attr in ("stack", "cat") and node.args and (ys := self._list(node.args[0]))):
            return node
        dim = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "dim"), None)
        d = 0 if dim is None else _int(dim)
        if func.attr == "cat" and d is None:
            return node
        self.replaced += 1
        if func.attr == "stack":
            return name(ys) if d == 0 else call(attr(name(ys), "movedim"), ast.Constant(0), dim)
        lo = d if d >= 0 else d - 1
        moved = call(attr(name(ys), "movedim"), ast.Constant(0), ast.Constant(lo))
        return call(attr(moved, "flatten"), ast.Constant(lo), ast.Constant(lo + 1))


def _whole_dim(var: str, dim: int, plan: _Plan) -> bool:
    """Whether the loop runs over all of ``var``'s dim ``dim``: ``range(var.shape[dim])``, ``range(var.size(dim))``
    or ``range(len(var))``."""
    stop = plan.stop
    if plan.start is not None:
        return False
    if isinstance(stop, ast.Subscript):
        return ast.dump(stop.value) == ast.dump(attr(name(var), "shape")) and _int(stop.slice) == dim
    if not isinstance(stop, ast.Call) or len(stop.args) != 1 or stop.keywords:
        return False
    if ast.dump(stop.func) == ast.dump(attr(name(var), "size")):
        return _int(stop.args[0]) == dim
    return dim == 0 and isinstance(stop.func, ast.Name) and stop.func.id == "len" \
        and ast.dump(stop.args[0]) == ast.dump(name(var))


def _slice_source(var: str, dim: int, plan: _Plan) -> ast.expr:
    """``var`` with ``dim`` first, cut to the loop's range unless the range is that whole dim."""
    moved = call(attr(name(var), "movedim"), ast.Constant(dim), ast.Constant(0)) if dim else name(var)
    if _whole_dim(var, dim, plan):
        return moved
    return ast.Subscript(value=moved, slice=ast.Slice(lower=plan.start, upper=plan.stop), ctx=ast.Load())


class LoopRewriter(conds.Rewriter):
    """The branch rewriter that also turns targeted loops over a dynamic size into ``scan``."""

    def __init__(self, targets: set[int], fn: ast.FunctionDef) -> None:
        super().__init__(targets)
        self.fn = fn

    def loop(self, stmt: ast.stmt, body: list[ast.stmt], i: int, outer: set[str]) -> list[ast.stmt] | None:
        if not isinstance(stmt, (ast.For, ast.While)) or not self.hit(stmt, whole=True):
            return None
        plan = _for_plan(stmt) if isinstance(stmt, ast.For) else _while_plan(stmt, body[:i])
        if plan is None or not plan.body or conds._jumps(plan.body):
            return None
        lists = _appended_lists(plan.body, body[:i])
        if lists is None:
            return None
        nested = len(self.done)  # what the step rewrites is part of this rewrite's code
        made = self._scan(stmt, plan, lists, body, i, outer)
        del self.done[nested:]
        if made is not None:
            self.done.append((stmt.lineno, made, "loop"))
        return made

    def _outside(self, stmt: ast.stmt) -> set[str]:
        """Names read anywhere in forward() outside ``stmt``."""
        inside = {id(n) for n in ast.walk(stmt)}
        return {n.id for n in ast.walk(self.fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                and id(n) not in inside}

    def _steps(self, plan: _Plan, lists: dict[str, int], k: int) -> tuple[list[ast.stmt], _Slots, dict[str, str]]:
        """The loop body as scan steps: slices read from the scan's inputs, appends made step outputs."""
        slots = _Slots(plan.index, assigned(plan.body) | {plan.index}, k)
        steps: list[ast.stmt] = []
        stacked: dict[str, str] = {}  # list name -> the stacked scan output
        for j, s in enumerate(copy.deepcopy(plan.body)):
            if j in lists.values():
                stacked[_append_target(s)] = f"_ys{len(stacked)}_{k}"
                s = ast.copy_location(ast.Assign(targets=[name(f"_y{len(stacked) - 1}_{k}", store=True)],
                                                 value=s.value.args[0]), s)
            steps.append(slots.visit(s))
        return steps, slots, stacked

    def _scan(self, stmt: ast.stmt, plan: _Plan, lists: dict[str, int], block: list[ast.stmt], i: int,
              outer: set[str]) -> list[ast.stmt] | None:
        k = self.next_id()
        steps, slots, stacked = self._steps(plan, lists, k)
        own = {plan.index, *slots.slots.values(), *(f"_y{j}_{k}" for j in range(len(stacked)))}
        carry = sorted((assigned(steps) & outer) - own)
        outside = self._outside(stmt)
        if (assigned(steps) - own - set(carry)) & outside or (isinstance(stmt, ast.While) and plan.index in outside):
            return None  # a name the loop makes (or its counter) is read outside it
        rest = self._rest_reading(stacked, block, i, outside)
        if rest is None:
            return None
        xs = [(slot, _slice_source(var, dim, plan)) for (var, dim), slot in slots.slots.items()]
        on = [ast.keyword(arg="device", value=attr(name(var), "device")) for var, _ in list(slots.slots)[:1]]
        if plan.index in conds.loaded(steps) or not xs:  # the index itself, as a 0-d tensor per step
            xs.append((plan.index, ast.Call(func=attr(name("torch"), "arange"),
                                            args=[plan.start or ast.Constant(0), plan.stop], keywords=on)))
        pre: list[ast.stmt] = []
        if not carry:  # scan carries at least one value: a placeholder
            carry = [f"_c{k}"]
            pre.append(ast.Assign(targets=[name(carry[0], store=True)], value=ast.Call(
                func=attr(name("torch"), "zeros"), args=[ast.Tuple(elts=[], ctx=ast.Load())], keywords=on)))
        step_fn = self._step_fn(k, carry, xs, stacked, steps, outer)
        for j, s in rest.items():
            block[j] = s
        ys_target = ast.Tuple(elts=[name(y, store=True) for y in stacked.values()], ctx=ast.Store()) if stacked \
            else name("_", store=True)
        carry_target = ast.Tuple(elts=[name(c, store=True) for c in carry], ctx=ast.Store())
        scan = call(attr(name("torch"), "_higher_order_ops", "scan"), name(step_fn.name),
                    ast.Tuple(elts=[name(c) for c in carry], ctx=ast.Load()),
                    ast.Tuple(elts=[src for _, src in xs], ctx=ast.Load()))
        outer |= set(carry) | set(stacked.values())
        made = [*pre, step_fn, ast.Assign(targets=[ast.Tuple(elts=[carry_target, ys_target], ctx=ast.Store())],
                                          value=scan)]
        return [ast.copy_location(n, stmt) for n in made]

    def _rest_reading(self, stacked: dict[str, str], block: list[ast.stmt], i: int, outside: set[str]
                      ) -> dict[int, ast.stmt] | None:
        """The statements after the loop, reading the stacked outputs instead of the lists; None when a list is
        read some other way (or anywhere else)."""
        if not stacked:
            return {}
        uses = _ListUses(stacked)
        rest: dict[int, ast.stmt] = {}
        reads = 0
        for j in range(i + 1, len(block)):
            reads += sum(isinstance(n, ast.Name) and n.id in stacked and isinstance(n.ctx, ast.Load)
                         for n in ast.walk(block[j]))
            if assigned([block[j]]) & set(stacked):
                return None
            rest[j] = uses.visit(copy.deepcopy(block[j]))
        everywhere = sum(isinstance(n, ast.Name) and n.id in stacked and isinstance(n.ctx, ast.Load)
                         for n in ast.walk(self.fn))
        if uses.replaced != reads or everywhere != reads + len(stacked):
            return None
        return rest

    def _step_fn(self, k: int, carry: list[str], xs: list[tuple[str, ast.expr]], stacked: dict[str, str],
                 steps: list[ast.stmt], outer: set[str]) -> ast.FunctionDef:
        """``def _scan_step_k(carry, xs)``: unpack, the loop body (its own branches rewritten), repack."""
        head: list[ast.stmt] = [ast.Assign(targets=[ast.Tuple(elts=[name(c, store=True) for c in carry],
                                                              ctx=ast.Store())], value=name(f"_carry_{k}"))]
        head.append(ast.Assign(targets=[ast.Tuple(elts=[name(s, store=True) for s, _ in xs], ctx=ast.Store())],
                               value=name(f"_xs_{k}")))
        inside = set(outer) | set(carry) | {s for s, _ in xs}
        body = self.block(steps, inside, in_loop=False)
        out = ast.Tuple(elts=[ast.Tuple(elts=[fresh(name(c)) for c in carry], ctx=ast.Load()),
                              ast.Tuple(elts=[fresh(name(f"_y{j}_{k}")) for j in range(len(stacked))],
                                        ctx=ast.Load())], ctx=ast.Load())
        args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=f"_carry_{k}"), ast.arg(arg=f"_xs_{k}")],
                             kwonlyargs=[], kw_defaults=[], defaults=[])
        return ast.FunctionDef(name=f"_scan_step_{k}", args=args, body=[*head, *body, ast.Return(value=out)],
                               decorator_list=[], returns=None, type_params=[])
