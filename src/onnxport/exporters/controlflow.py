"""Control flow that survives export.

Three rewrites of the user's model, each tried as an export strategy when the plain exporters fail or freeze a
branch or loop: ``cond`` turns Python branches on a tensor or a dynamic size (``if``/``elif``, early returns,
conditional expressions; ``conds``) into ``torch.cond`` (the dynamo exporter keeps it as an ONNX ``If``),
``scan`` also turns loops over a dynamic size into torch's ``scan`` (an ONNX ``Scan``; ``loops``), and
``script`` compiles the modules that hold branches and loops with ``torch.jit.script`` (the TorchScript
exporter keeps them as ``If``/``Loop``; the rest of the model is traced).
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

from onnxport.exporters.conds import Rewriter
from onnxport.exporters.loops import LoopRewriter

Line = tuple[str, int]  # (file, line) in the user's code
MAX_SCRIPT_TRIES = 24


@dataclass(frozen=True)
class Rewrite:
    """One Python branch rewritten as ``torch.cond`` (or loop as ``scan``): where, and the code that replaces it."""

    module: str  # module path ('' = the model itself)
    file: str
    line: int
    code: str  # the replacement statements, as source
    kind: str = "if"  # "if" (torch.cond) | "loop" (scan)


# --------------------------------------------------------------------------- reading forward()


def copied(module: nn.Module) -> nn.Module:
    """A deep copy of ``module``. A tensor a module kept from an earlier forward (RAFT's correlation pyramid,
    cached while the TorchScript exporter traced it with autograd on) carries a grad_fn, which deepcopy refuses:
    such attributes are detached first (their values unchanged)."""
    def detached(v):
        return v.detach() if isinstance(v, torch.Tensor) and v.grad_fn is not None else v

    for mod in module.modules():
        for name, value in list(vars(mod).items()):
            if isinstance(value, (torch.Tensor, list, tuple, dict)) and not name.startswith("_") and any(
                    isinstance(v, torch.Tensor) and v.grad_fn is not None
                    for v in torch.utils._pytree.tree_leaves(value)):
                setattr(mod, name, torch.utils._pytree.tree_map(detached, value))
    return copy.deepcopy(module)


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same source file (one may be relative to the other, or cut mid-name: torch's
    logs drop the characters a file's path shares with torch's own location, e.g. ``mp/proj/model.py`` for
    ``/tmp/proj/model.py`` when torch lives under ``/t…``)."""
    a, b = a.replace("\\", "/"), b.replace("\\", "/")
    if a == b or a.endswith("/" + b.lstrip("./")) or b.endswith("/" + a.lstrip("./")):
        return True
    short, long = sorted((a, b), key=len)
    return "/" in short and short.rsplit("/", 1)[1] == long.rsplit("/", 1)[1] and long.endswith(short)


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
    """Whether ``mod``'s own forward() has an ``if``, a conditional expression, a ``for`` or a ``while`` (user
    code only)."""
    src = _forward_source(mod)
    return src is not None and any(isinstance(n, (ast.If, ast.IfExp, ast.For, ast.While)) for n in ast.walk(src[2]))


def _lines_in(mod: nn.Module, lines: Iterable[Line]) -> set[int]:
    """The evidence lines that fall inside ``mod``'s forward(), relative to the parsed source (1-based)."""
    src = _forward_source(mod)
    if src is None:
        return set()
    file, start, node, _ = src
    end = start + (node.end_lineno or 1)
    return {ln - start + 1 for f, ln in lines if same_file(f, file) and start <= ln < end}


# --------------------------------------------------------------------------- torch.cond / scan rewrite


def cond_forward(mod: nn.Module, lines: Iterable[Line], loops: bool = False
                 ) -> tuple[types.FunctionType, list[tuple[int, str, str]]] | None:
    """``mod``'s forward() with the branches on ``lines`` rewritten to ``torch.cond`` (and with ``loops``, the
    loops over a dynamic size there to torch's ``scan``).

    Returns the new function and (line, replacement source, "if" | "loop") per rewrite, or None when nothing on
    those lines has a form the operators take.
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
    outer |= {a.arg for a in (node.args.vararg, node.args.kwarg) if a is not None}
    rewriter = LoopRewriter(targets, node) if loops else Rewriter(targets)
    node.body = rewriter.block(node.body, outer)
    if not rewriter.done:
        return None
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    ast.increment_lineno(module, start - 1)  # the file's own line numbers, for what torch reports from the code
    scope = dict(fn.__globals__)
    scope.setdefault("torch", torch)
    exec(compile(module, file, "exec"), scope)  # noqa: S102 - recompiling the user's own forward()
    rewrites = [(start + ln - 1, "\n".join(ast.unparse(s) for s in stmts), kind) for ln, stmts, kind in rewriter.done]
    return scope[node.name], rewrites


def with_cond(flat: nn.Module, lines: Iterable[Line], loops: bool = False) -> tuple[nn.Module, list[Rewrite]]:
    """A copy of the flat wrapper whose modules' branches on ``lines`` are ``torch.cond`` calls (and with
    ``loops``, whose loops over a dynamic size there are ``scan`` calls)."""
    lines = list(lines)
    flat = copied(flat)
    rewrites: list[Rewrite] = []
    for path, mod in flat.model.named_modules():
        made = cond_forward(mod, lines, loops)
        if made is None:
            continue
        fn, where = made
        mod.forward = types.MethodType(fn, mod)
        file = _forward_source(mod)[0]  # type: ignore[index]
        rewrites += [Rewrite(path, file, ln, code, kind) for ln, code, kind in where]
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
    flat = copied(flat)
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
        raise ValueError("no forward() in the model has an if/for/while or a conditional expression to keep")
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
    """The line of every branch test (``if``, ``elif``, conditional expression) and of every loop whose range is
    not a literal, in the forward() of the model's own (non-torch) modules."""
    out: list[Line] = []
    for _, mod in model.named_modules():
        src = _forward_source(mod)
        if src is None:
            continue
        file, start, node, _ = src
        for n in ast.walk(node):
            if isinstance(n, (ast.If, ast.IfExp)):
                out.append((file, start + n.test.lineno - 1))
            elif isinstance(n, ast.While) or (isinstance(n, ast.For) and not _literal_range(n.iter)):
                out.append((file, start + n.lineno - 1))
    return list(dict.fromkeys(out))


def holds_loop(model: nn.Module) -> bool:
    """Whether the forward() of one of the model's own modules has a ``while`` or a ``for`` whose range is not a
    literal (something ``scan`` could keep)."""
    for _, mod in model.named_modules():
        src = _forward_source(mod)
        if src is not None and any(isinstance(n, ast.While) or (isinstance(n, ast.For) and not _literal_range(n.iter))
                                   for n in ast.walk(src[2])):
            return True
    return False


def _literal_range(it: ast.expr) -> bool:
    """``range(3)``, ``range(1, 4)``: a loop that unrolls the same way at every input size."""
    return isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" \
        and all(isinstance(a, ast.Constant) for a in it.args)
