"""The house rules of docs/architecture.md, enforced: layers, no import circle, small modules and functions."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "onnxport"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# Functions allowed to be longer, each with its reason (docs/architecture.md, "Exceptions").
LONG_FUNCTIONS: dict[str, str] = {}
MAX_PARAMETERS = 10  # positional + keyword-only, self/cls not counted: more is a record's job
# Functions allowed more parameters, each with its reason (docs/architecture.md, "Exceptions"). The click
# commands of onnxport.cli are exempt by rule (PARAMETER_EXEMPT_PACKAGES): their parameters are the CLI's options.
PACKED_OP = "its parameters mirror the packed-RNN custom op's inputs and attributes"
MANY_PARAMETERS: dict[str, str] = {
    "onnxport.exporters.packed.rnn_layer": f"the torch.library custom op itself: {PACKED_OP}",
    "onnxport.exporters.packed._": f"rnn_layer's registered fake (register_fake): {PACKED_OP}",
    "onnxport.exporters.packed.rnn_layer_onnx": f"the op's onnxscript translation (dynamo): {PACKED_OP}",
    "onnxport.exporters.packed.torchscript_symbolic": f"the op's TorchScript symbolic (graph first): {PACKED_OP}",
}
PARAMETER_EXEMPT_PACKAGES = {"onnxport.cli": "click commands: one parameter per command-line option"}


def _lint_imports(pythonpath: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
                          capture_output=True, text=True, env=env, cwd=pythonpath, timeout=300)


def test_layer_contract_is_kept():
    proc = _lint_imports(ROOT / "src")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kept, 0 broken" in proc.stdout


def test_a_wrong_way_import_breaks_the_layer_contract(tmp_path):
    copy = tmp_path / "onnxport"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    errors = copy / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _late():\n    from onnxport import pipeline  # wrong way\n")
    proc = _lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "BROKEN" in proc.stdout and "onnxport.core.errors -> onnxport.pipeline" in proc.stdout


# The modules at the package root (docs/architecture.md): the public API and the stage runner; every other module
# lives in the package it serves.
ROOT_MODULES = {"__init__.py", "__main__.py", "api.py", "pipeline.py"}
# Modules that moved into a package and still import at the root, where README.md and docs/ told users to import
# them (onnxport/__init__.py: _MOVED).
MOVED = {"onnxport.custom_ops": "onnxport.exporters.custom_ops", "onnxport.deploy": "onnxport.serve.repository"}


def test_no_loose_modules_at_the_package_root():
    assert {p.name for p in SRC.glob("*.py")} == ROOT_MODULES


def test_moved_modules_still_import_where_documented():
    code = ("import importlib, onnxport; from onnxport.custom_ops import ort_python_op; "
            "from onnxport.deploy import triton_repository; "
            f"moved = {MOVED!r}; "
            "assert all(importlib.import_module(a) is importlib.import_module(b) for a, b in moved.items()); "
            "assert onnxport.deploy.triton_repository is triton_repository; "
            "assert ort_python_op is importlib.import_module('onnxport.runtime.ops').ort_python_op; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "ok", proc.stderr


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in adj:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return found


def test_no_import_circle_anywhere():
    graph = grimp.build_graph("onnxport", cache_dir=None)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        yield name, path


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda x: x if isinstance(x, str) else "")
def test_module_and_function_sizes(name, path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name} has {len(text.splitlines())} lines"
    long = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_FUNCTION_LINES and f"{name}.{node.name}" not in LONG_FUNCTIONS:
                long.append(f"{node.name} ({size} lines)")
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Positional (positional-only included) and keyword-only parameters, a leading self/cls not counted."""
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(a.kwonlyargs)


def _too_many_parameters(name: str, tree: ast.AST) -> list[str]:
    """The functions of module ``name`` over MAX_PARAMETERS parameters that no exemption covers."""
    if any(name == pkg or name.startswith(pkg + ".") for pkg in PARAMETER_EXEMPT_PACKAGES):
        return []
    return [f"{node.name} ({n} parameters)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := _parameters(node)) > MAX_PARAMETERS and f"{name}.{node.name}" not in MANY_PARAMETERS]


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda x: x if isinstance(x, str) else "")
def test_function_parameter_counts(name, path):
    many = _too_many_parameters(name, ast.parse(path.read_text()))
    assert not many, f"{name}: functions over {MAX_PARAMETERS} parameters (bundle them in a record): {', '.join(many)}"


def test_parameter_exemptions_are_still_needed():
    """Each MANY_PARAMETERS entry names a function that exists and still has over MAX_PARAMETERS parameters."""
    counts = {}
    for name, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                counts[f"{name}.{node.name}"] = max(counts.get(f"{name}.{node.name}", 0), _parameters(node))
    stale = [k for k in MANY_PARAMETERS if counts.get(k, 0) <= MAX_PARAMETERS]
    assert not stale, f"exemptions no longer needed: {stale}"


def test_the_parameter_check_finds_a_long_signature():
    snippet = ast.parse(
        "def wide(a, b, c, d, e, f, g, h, i, /, j, *, k=1):\n    pass\n"
        "def ten(self, a, b, c, d, e, f, g, h, i, *args, j=0, **kw):\n    pass\n"
        "class C:\n    def method(cls, a, b, c, d, e, f, g, h, i, j, k):\n        pass\n"
    )
    assert _too_many_parameters("onnxport.somewhere", snippet) == ["wide (11 parameters)", "method (11 parameters)"]
    assert _too_many_parameters("onnxport.cli.commands", snippet) == []
