"""The command line starts without torch (seconds of start-up on every call): importing it, every --help and
the refusals of bad arguments that need no model load no heavy library. Each check runs in a fresh process,
where nothing else has imported torch yet."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import MODELS, ROOT

HEAVY = ("torch", "onnx", "onnxruntime", "transformers")
COMMANDS = ("convert", "export", "compare", "optimize", "bench", "check", "serve", "triton", "view", "report",
            "doctor")


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def _imported(importtime: str) -> set[str]:
    """The top-level packages ``python -X importtime`` reports."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s*([\w.]+)\s*$", importtime, re.M)}


def test_importing_the_command_line_imports_no_heavy_library():
    code = f"import sys, onnxport.cli; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_help_imports_no_heavy_library():
    proc = _python("-X", "importtime", "-m", "onnxport", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout
    imported = _imported(proc.stderr)
    assert "onnxport" in imported and "typer" in imported  # the check sees what was imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_every_commands_help_imports_no_heavy_library():
    code = ("import sys; from typer.testing import CliRunner; from onnxport.cli import app\n"
            f"for c in {COMMANDS!r}:\n"
            "    r = CliRunner().invoke(app, [c, '--help'])\n"
            "    assert r.exit_code == 0 and 'Usage' in r.output, (c, r.output)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.parametrize("args,word", [
    (["export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch", "-o", "never"], "--input"),
    (["export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-d", "batch=9..2", "-o", "never"], "--dim"),
    (["convert", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--model-args", "{bad", "-o", "never"],
     "--model-args"),
    (["export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--device", "tpu", "-o", "never"], "--device"),
    (["export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--exporter", "nope", "-o", "never"], "exporter"),
    (["export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", "{tmp}"], "--force"),
    (["compare", f"{MODELS}:TinyMLP", "{tmp}/missing.onnx", "-i", "x:float32[batch,8]", "-o", "never"], "not found"),
    (["check", "{tmp}/missing.onnx"], "not found"),
    (["convert", "{tmp}/missing.py:Net", "-i", "x:float32[batch,8]", "-o", "never"], "model file not found"),
], ids=["input spec", "dim range", "model args JSON", "device", "exporter", "earlier results", "compare a missing file",
        "check a missing file", "model file missing"])
def test_a_bad_argument_is_refused_before_torch_loads(tmp_path, args, word):
    (tmp_path / "report.json").write_text("{}")  # earlier results
    proc = _python("-X", "importtime", "-m", "onnxport", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("import time:")]
    assert len(lines) == 1 and lines[0].startswith("error:") and word in lines[0], lines
    imported = _imported(proc.stderr)
    assert "onnxport" in imported
    assert "torch" not in imported, "the refusal loaded torch"
    assert not (ROOT / "never").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_check_of_an_onnx_file_imports_no_torch(tmp_path):
    """``onnxport check`` needs no PyTorch model, and no torch."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    proc = _python("-X", "importtime", "-m", "onnxport", "check", str(tmp_path / "m.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"ok": true' in proc.stdout and "Relu" in proc.stderr
    imported = _imported(proc.stderr)
    assert "onnx" in imported
    assert "torch" not in imported, "check loaded torch"
