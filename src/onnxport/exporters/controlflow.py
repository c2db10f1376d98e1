"""Control flow that survives export.

Two rewrites of the user's model, each tried as an export strategy when the plain exporters fail or freeze a
branch: ``cond`` turns a Python ``if`` on a tensor or a dynamic size into ``torch.cond`` (the dynamo exporter
keeps it as an ONNX ``If``), and ``script`` compiles the modules that hold branches and loops with
``torch.jit.script`` (the TorchScript exporter keeps them as ``If``/``Loop``; the rest of the model is traced).
"""

from __future__ import annotations

import ast
import copy
import inspect
import re
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

Line = tuple[str, int]  # (file, line) in the user's code
MAX_SCRIPT_TRIES = 24


@dataclass(frozen=True)
class Rewrite:
    """One Python ``if`` rewritten as ``torch.cond``: where, and the code that replaces it."""

    module: str  # module path ('' = the model itself)
    file: str
    line: int
    code: str  # the replacement statements, as source


# --------------------------------------------------------------------------- reading forward()


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same source file (one may be relative to the other)."""
    a, b = a.replace("\\", "/"), b.replace("\\", "/")
    return a == b or a.endswith("/" + b.lstrip("./")) or b.endswith("/" + a.lstrip("./"))


def _forward_source(mod: nn.Module) -> tuple[str, int, ast.FunctionDef, object] | None:
    """(file, first line, parsed def, function) of the forward() defined by ``mod``'s class, if readable."""
    fn = getattr(type(mod), "forward", None)
    if fn is None or getattr(fn, "__module__", "").startswith("torch."):
        return None
    try:
        file = inspect.getsourcefile(fn)
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (TypeError, OSError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef) or not file:
        return None
    return file, start, node, fn


def holds_control_flow(mod: nn.Module) -> bool:
    """Whether ``mod``'s own forward() has an ``if``, ``for`` or ``while`` (user code only)."""
    src = _forward_source(mod)
    return src is not None and any(isinstance(n, (ast.If, ast.For, ast.While)) for n in ast.walk(src[2]))


def _lines_in(mod: nn.Module, lines: Iterable[Line]) -> set[int]:
    """The evidence lines that fall inside ``mod``'s forward(), relative to the parsed source (1-based)."""
    src = _forward_source(mod)
    if src is None:
        return set()
    file, start, node, _ = src
    end = start + (node.end_lineno or 1)
    return {ln - start + 1 for f, ln in lines if same_file(f, file) and start <= ln < end}


# --------------------------------------------------------------------------- torch.cond rewrite


def _returns(stmts: list[ast.stmt]) -> bool:
    return bool(stmts) and isinstance(stmts[-1], ast.Return) and stmts[-1].value is not None


def _assigned(stmts: list[ast.stmt]) -> set[str]:
    return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _branch(name: str, body: list[ast.stmt], outer: set[str]) -> ast.expr | ast.FunctionDef:
    """A zero-argument callable for one side: a lambda for a lone ``return``, else a nested def. Names the body
    both reads from the enclosing scope and reassigns become default arguments (no closure mutation)."""
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                          body=body[0].value)
    rebound = sorted(_assigned(body) & outer)
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in rebound], kwonlyargs=[], kw_defaults=[],
                         defaults=[ast.Name(id=n, ctx=ast.Load()) for n in rebound])
    return ast.FunctionDef(name=name, args=args, body=body, decorator_list=[], returns=None, type_params=[])


def _cond_call(test: ast.expr, true_fn: ast.expr, false_fn: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Attribute(value=ast.Name(id="torch", ctx=ast.Load()), attr="cond", ctx=ast.Load()),
                    args=[test, true_fn, false_fn, ast.Tuple(elts=[], ctx=ast.Load())], keywords=[])


def _rewrite_body(body: list[ast.stmt], targets: set[int], outer: set[str], done: list[tuple[int, list]]) -> list:
    """Rewrite the targeted top-level ``if`` statements of ``body``; returns the new body."""
    out: list[ast.stmt] = []
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.If) and targets & set(range(stmt.lineno, (stmt.test.end_lineno or 0) + 1))):
            out.append(stmt)
            outer |= _assigned([stmt])
            continue
        k = len(done)
        other = stmt.orelse or body[i + 1:]
        if _returns(stmt.body) and _returns(other):  # if ...: return A  [else:] return B
            new: list[ast.stmt] = []
            sides = []
            for side, stmts in (("true", stmt.body), ("false", other)):
                fn = _branch(f"_{side}_branch_{k}", stmts, outer)
                if isinstance(fn, ast.FunctionDef):
                    new.append(fn)
                    sides.append(ast.Name(id=fn.name, ctx=ast.Load()))
                else:
                    sides.append(fn)
            new.append(ast.Return(value=_cond_call(stmt.test, *sides)))
            done.append((stmt.lineno, new))
            return out + new
        one = [s for s in (stmt.body, stmt.orelse) if len(s) == 1 and isinstance(s[0], ast.Assign)]
        if len(one) == 2 and all(len(s[0].targets) == 1 and isinstance(s[0].targets[0], ast.Name) for s in one) \
                and one[0][0].targets[0].id == one[1][0].targets[0].id:  # if ...: v = A  else: v = B
            lam = [_branch("", [ast.Return(value=s[0].value)], outer) for s in one]
            new_stmt = ast.Assign(targets=[one[0][0].targets[0]], value=_cond_call(stmt.test, *lam), lineno=0)
            done.append((stmt.lineno, [new_stmt]))
            out.append(new_stmt)
            outer.add(one[0][0].targets[0].id)
            continue
        out.append(stmt)
    return out


def cond_forward(mod: nn.Module, lines: Iterable[Line]) -> tuple[types.FunctionType, list[tuple[int, str]]] | None:
    """``mod``'s forward() with the ``if`` statements on ``lines`` rewritten to ``torch.cond``.

    Returns the new function and (line, replacement source) per rewrite, or None when no ``if`` there has the
    shape torch.cond needs (both sides return, or both assign the same name).
    """
    src = _forward_source(mod)
    targets = _lines_in(mod, lines)
    if src is None or not targets:
        return None
    file, start, node, fn = src
    if fn.__code__.co_freevars:  # uses super() or a closure: recompiling would lose the cells
        return None
    node = copy.deepcopy(node)
    node.decorator_list = []
    outer = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
    done: list[tuple[int, list]] = []
    node.body = _rewrite_body(node.body, targets, outer, done)
    if not done:
        return None
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    scope = dict(fn.__globals__)
    scope.setdefault("torch", torch)
    exec(compile(module, file, "exec"), scope)  # noqa: S102 - recompiling the user's own forward()
    rewrites = [(start + ln - 1, "\n".join(ast.unparse(s) for s in stmts)) for ln, stmts in done]
    return scope[node.name], rewrites


def with_cond(flat: nn.Module, lines: Iterable[Line]) -> tuple[nn.Module, list[Rewrite]]:
    """A copy of the flat wrapper whose modules' ``if`` statements on ``lines`` are ``torch.cond`` calls."""
    lines = list(lines)
    flat = copy.deepcopy(flat)
    rewrites: list[Rewrite] = []
    for path, mod in flat.model.named_modules():
        made = cond_forward(mod, lines)
        if made is None:
            continue
        fn, where = made
        mod.forward = types.MethodType(fn, mod)
        file = _forward_source(mod)[0]  # type: ignore[index]
        rewrites += [Rewrite(path, file, ln, code) for ln, code in where]
    return flat, rewrites


# --------------------------------------------------------------------------- torch.jit.script


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _script_error_line(exc: BaseException) -> Line | None:
    """The user line torch.jit.script pointed at in its error message."""
    for m in re.finditer(r'File "([^"]+)", line (\d+)', str(exc)):
        if "/torch/" not in m.group(1) and "site-packages" not in m.group(1):
            return m.group(1), int(m.group(2))
    return None


@dataclass(frozen=True)
class ScriptTry:
    """One module ``torch.jit.script`` was tried on."""

    module: str
    ok: bool
    error: str | None = None
    line: Line | None = None


def with_script(flat: nn.Module, lines: Iterable[Line] = ()) -> tuple[nn.Module, list[ScriptTry]]:
    """A copy of the flat wrapper with the user's model scripted, or else the submodules that hold control flow
    (outermost first; a module is not tried when an ancestor was scripted). Raises when nothing could be."""
    flat = copy.deepcopy(flat)
    tries: list[ScriptTry] = []

    def attempt(path: str, mod: nn.Module) -> nn.Module | None:
        try:
            scripted = torch.jit.script(mod)
        except Exception as e:  # noqa: BLE001 - any refusal is recorded
            tries.append(ScriptTry(path, False, _short(e), _script_error_line(e)))
            return None
        tries.append(ScriptTry(path, True))
        return scripted

    root = flat.model
    if isinstance(root, torch.jit.ScriptModule):
        raise ValueError("the model is TorchScript already; the torchscript exporter keeps its control flow")
    holders = [(p, m) for p, m in root.named_modules() if holds_control_flow(m)]
    if not holders:
        raise ValueError("no forward() in the model has an if/for/while to keep")
    whole = attempt("", root)
    if whole is not None:
        flat.model = whole
        return flat, tries
    evidence = list(lines)
    candidates = [(p, m) for p, m in holders if p]
    candidates.sort(key=lambda pm: (not _lines_in(pm[1], evidence), pm[0].count(".")))
    done: list[str] = []
    for path, mod in candidates:
        if any(path.startswith(d + ".") for d in done):
            continue
        if len(tries) > MAX_SCRIPT_TRIES:
            break
        scripted = attempt(path, mod)
        if scripted is not None:
            parent, _, leaf = path.rpartition(".")
            setattr(root.get_submodule(parent) if parent else root, leaf, scripted)
            done.append(path)
    if not done:
        first = next((t for t in tries if not t.ok), None)
        where = f" ({Path(first.line[0]).name}:{first.line[1]})" if first and first.line else ""
        raise ValueError("torch.jit.script could not compile any module holding control flow"
                         + (f": {first.module or 'the model'}: {first.error}{where}" if first else ""))
    return flat, tries


def if_lines(model: nn.Module) -> list[Line]:
    """The line of every top-level ``if`` in the forward() of the model's own (non-torch) modules."""
    out: list[Line] = []
    for _, mod in model.named_modules():
        src = _forward_source(mod)
        if src is None:
            continue
        file, start, node, _ = src
        out += [(file, start + s.lineno - 1) for s in node.body if isinstance(s, ast.If)]
    return list(dict.fromkeys(out))
