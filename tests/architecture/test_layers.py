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
