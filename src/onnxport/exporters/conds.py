"""Python branches rewritten as ``torch.cond``: ``if``/``elif``/``else`` statements whose sides assign names,
early returns (``if c: return a`` … ``return b``), and conditional expressions (``a if c else b``, nested or
inside a ``return``), wherever they sit in forward() (inside loops and ``with`` blocks too).

The rewriter works on a copy of forward()'s syntax tree and only touches the branches whose test is on one of
the target lines (the lines where an export froze or failed). Each side becomes a zero-argument callable; a
value a side would hand back unchanged is cloned, since higher-order operators refuse outputs that alias
their inputs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

Done = list[tuple[int, list[ast.stmt], str]]  # (line of the original statement, what replaces it, "if" | "loop")

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef)


def walk(nodes: Iterable[ast.AST]) -> Iterable[ast.AST]:
    """Every node under ``nodes``, not entering nested functions, lambdas or classes."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))


def assigned(stmts: Iterable[ast.AST]) -> set[str]:
    """The names bound by ``stmts`` (assignments, loop targets, ``with … as``), nested scopes and comprehension
    variables left out."""
    nodes = list(walk(stmts))
    own = {id(n) for c in nodes if isinstance(c, ast.comprehension) for n in ast.walk(c.target)}
    return {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and id(n) not in own}


def loaded(stmts: Iterable[ast.AST]) -> set[str]:
    return {n.id for n in walk(stmts) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def name(id_: str, store: bool = False) -> ast.Name:
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def pack(ids: list[str], store: bool = False) -> ast.expr:
    """One name, or a tuple of them."""
    return name(ids[0], store) if len(ids) == 1 else ast.Tuple(elts=[name(i, store) for i in ids],
                                                                ctx=ast.Store() if store else ast.Load())


def call(func: ast.expr, *args: ast.expr) -> ast.Call:
    return ast.Call(func=func, args=list(args), keywords=[])


def attr(value: ast.expr, *path: str) -> ast.expr:
    for part in path:
        value = ast.Attribute(value=value, attr=part, ctx=ast.Load())
    return value


def fresh(expr: ast.expr) -> ast.expr:
    """``expr``, cloned unless it plainly makes a new tensor (arithmetic, another torch.cond)."""
    if isinstance(expr, ast.Tuple):
        return ast.Tuple(elts=[fresh(e) for e in expr.elts], ctx=ast.Load())
    if isinstance(expr, (ast.BinOp, ast.Compare)) or (isinstance(expr, ast.UnaryOp)
                                                       and isinstance(expr.op, (ast.USub, ast.Not, ast.Invert))):
        return expr
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("cond", "clone"):
        return expr
    return call(attr(expr, "clone"))


def lambda_(body: ast.expr) -> ast.Lambda:
    return ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                      body=body)


def cond_call(test: ast.expr, true_fn: ast.expr, false_fn: ast.expr) -> ast.Call:
    return call(attr(name("torch"), "cond"), test, true_fn, false_fn, ast.Tuple(elts=[], ctx=ast.Load()))


def always_returns(stmts: list[ast.stmt]) -> bool:
    """Whether every path through ``stmts`` ends in a ``return`` with a value."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return last.value is not None
    if isinstance(last, ast.If):
        return always_returns(last.body) and always_returns(last.orelse)
    return False


def _jumps(stmts: list[ast.stmt]) -> bool:
    """A ``return``, ``break``, ``continue`` or ``yield`` anywhere in ``stmts`` (nested scopes left out)."""
    return any(isinstance(n, (ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom)) for n in walk(stmts))


class _Returns(ast.NodeTransformer):
    """Clones what the ``return`` statements of one side hand back (nested scopes left alone)."""

    def visit_Return(self, node: ast.Return) -> ast.Return:
        if node.value is not None:
            node.value = fresh(node.value)
        return node

    def visit_FunctionDef(self, node):  # noqa: N802 - NodeTransformer naming
        return node

    visit_Lambda = visit_ClassDef = visit_FunctionDef  # noqa: N815


class Rewriter:
    """Rewrites the targeted branches of one forward(); ``done`` collects what was replaced."""

    def __init__(self, targets: set[int]) -> None:
        self.targets = targets
        self.done: Done = []
        self.forced: set[int] = set()  # ids of `elif` branches rewritten with their chain
        self._k = 0

    # ----------------------------------------------------------------------- which branches

    def hit(self, node: ast.AST, whole: bool = False) -> bool:
        """Whether a target line falls on ``node`` (its first line only, unless ``whole``)."""
        last = (node.end_lineno if whole else None) or node.lineno
        return bool(self.targets & set(range(node.lineno, last + 1)))

    def hit_if(self, stmt: ast.If) -> bool:
        """Whether the test of ``stmt`` or of an ``elif`` chained to it is targeted."""
        node: ast.stmt | None = stmt
        while isinstance(node, ast.If):
            if id(node) in self.forced or self.hit(node.test, whole=True):
                return True
            node = node.orelse[0] if len(node.orelse) == 1 else None
        return False

    def next_id(self) -> int:
        self._k += 1
        return self._k - 1

    # ----------------------------------------------------------------------- blocks

    def block(self, body: list[ast.stmt], outer: set[str], in_loop: bool = False) -> list[ast.stmt]:
        """``body`` with its targeted branches rewritten. ``outer``: names bound before it (updated)."""
        out: list[ast.stmt] = []
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.If) and self.hit_if(stmt):
                made = self.if_stmt(stmt, body[i + 1:], outer, in_loop)
                if made is not None:
                    new, rest_consumed = made
                    out += new
                    if rest_consumed:
                        return out
                    outer |= assigned([stmt])
                    continue
            replaced = self.loop(stmt, body, i, outer)
            if replaced is not None:
                out += replaced
                outer |= assigned(replaced)
                continue
            out.append(self.inner(stmt, outer, in_loop))
            outer |= assigned([stmt])
        return out

    def loop(self, stmt: ast.stmt, body: list[ast.stmt], i: int, outer: set[str]) -> list[ast.stmt] | None:
        """A loop kept as a loop operator (see ``loops.LoopRewriter``); None here."""
        return None

    def inner(self, stmt: ast.stmt, outer: set[str], in_loop: bool) -> ast.stmt:
        """``stmt`` with the branches nested in it (or its conditional expressions) rewritten."""
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            inside = outer | assigned([stmt])
            stmt.body = self.block(stmt.body, inside, in_loop=True)
            stmt.orelse = self.block(stmt.orelse, set(inside), in_loop)
        elif isinstance(stmt, ast.If):
            stmt.body = self.block(stmt.body, set(outer), in_loop)
            stmt.orelse = self.block(stmt.orelse, set(outer), in_loop)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            stmt.body = self.block(stmt.body, set(outer) | assigned(stmt.items), in_loop)
        elif not isinstance(stmt, _COMPOUND):
            return self.expressions(stmt)
        return stmt

    def expressions(self, stmt: ast.stmt) -> ast.stmt:
        """The targeted conditional expressions of a simple statement as torch.cond calls."""
        before = len(self.done)
        rewriter = _IfExps(self)
        stmt = rewriter.visit(stmt)
        if rewriter.changed and len(self.done) == before:
            self.done.append((stmt.lineno, [stmt], "if"))
        return stmt

    # ----------------------------------------------------------------------- if statements

    def if_stmt(self, stmt: ast.If, rest: list[ast.stmt], outer: set[str], in_loop: bool
                ) -> tuple[list[ast.stmt], bool] | None:
        """The statements replacing ``stmt`` and whether they replace ``rest`` too; None when its form has no
        torch.cond equivalent."""
        other = stmt.orelse if always_returns(stmt.orelse) else stmt.orelse + rest
        nested = len(self.done)  # what the sides rewrite is part of this rewrite's code
        if not in_loop and always_returns(stmt.body) and always_returns(other):  # if c: return a … return b
            k = self.next_id()
            defs, refs = [], []
            self._force_elif(stmt)
            for side, stmts in (("true", stmt.body), ("false", other)):
                made = self._side(f"_{side}_branch_{k}", stmts, set(outer))
                defs += [made] if isinstance(made, ast.FunctionDef) else []
                refs.append(name(made.name) if isinstance(made, ast.FunctionDef) else made)
            new = [ast.copy_location(n, stmt) for n in (*defs, ast.Return(value=cond_call(stmt.test, *refs)))]
            del self.done[nested:]
            self.done.append((stmt.lineno, new, "if"))
            return new, True
        if _jumps([stmt]):
            return None
        names = self._chain_names(stmt, outer)
        if not names:
            return None
        k = self.next_id()
        self._force_elif(stmt)
        defs, refs = [], []
        for side, stmts in (("true", stmt.body), ("false", stmt.orelse)):
            made = self._assigning_side(f"_{side}_branch_{k}", stmts, names, set(outer))
            defs += [made] if isinstance(made, ast.FunctionDef) else []
            refs.append(name(made.name) if isinstance(made, ast.FunctionDef) else made)
        new = [ast.copy_location(n, stmt) for n in (*defs, ast.Assign(targets=[pack(names, store=True)],
                                                                      value=cond_call(stmt.test, *refs)))]
        del self.done[nested:]
        self.done.append((stmt.lineno, new, "if"))
        return new, False

    def _force_elif(self, stmt: ast.If) -> None:
        """The ``elif`` chained to ``stmt`` is rewritten with it."""
        if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
            self.forced.add(id(stmt.orelse[0]))

    @staticmethod
    def _chain_names(stmt: ast.If, outer: set[str]) -> list[str]:
        """What an if/elif/else statement hands on: names both sides bind, and names bound before it that one
        side rebinds (a name only one side creates is that side's own)."""
        t, f = assigned(stmt.body), assigned(stmt.orelse)
        return sorted((t & f) | ((t | f) & outer))

    def _assigning_side(self, fn_name: str, stmts: list[ast.stmt], names: list[str], outer: set[str]
                        ) -> ast.expr | ast.FunctionDef:
        """One side of an assigning ``if``: a lambda when it is ``name = value`` (or absent), else a def."""
        if not stmts:
            return lambda_(fresh(pack(names)))
        lone = stmts[0] if len(stmts) == 1 else None
        if len(names) == 1 and isinstance(lone, ast.Assign) and len(lone.targets) == 1 \
                and isinstance(lone.targets[0], ast.Name) and lone.targets[0].id == names[0]:
            return lambda_(fresh(_IfExps(self).visit(lone.value)))
        return self._side(fn_name, [*stmts, ast.Return(value=pack(names))], outer)

    def _side(self, fn_name: str, body: list[ast.stmt], outer: set[str]) -> ast.expr | ast.FunctionDef:
        """A zero-argument callable for one side: a lambda for a lone ``return``, else a nested def. Names the
        body both reads from the enclosing scope and rebinds become default arguments (no closure mutation)."""
        if len(body) == 1 and isinstance(body[0], ast.Return):
            return lambda_(fresh(_IfExps(self).visit(body[0].value)))
        rebound = sorted(assigned(body) & outer)
        args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in rebound], kwonlyargs=[], kw_defaults=[],
                             defaults=[name(n) for n in rebound])
        inner = [_Returns().visit(s) for s in self.block(body, set(outer), in_loop=False)]
        return ast.FunctionDef(name=fn_name, args=args, body=inner, decorator_list=[], returns=None, type_params=[])


class _IfExps(ast.NodeTransformer):
    """``a if c else b`` → ``torch.cond(c, lambda: a, lambda: b, ())`` for the targeted tests, innermost first."""

    def __init__(self, owner: Rewriter) -> None:
        self.owner = owner
        self.changed = False

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:  # noqa: N802 - NodeTransformer naming
        self.generic_visit(node)
        if not self.owner.hit(node.test, whole=True):
            return node
        self.changed = True
        return cond_call(node.test, lambda_(fresh(node.body)), lambda_(fresh(node.orelse)))

    def visit_FunctionDef(self, node):  # noqa: N802 - NodeTransformer naming
        return node
