"""Every bad input is answered through the CLI: a documented exit code, one line on stderr saying what is wrong
and what to do, no traceback, and no output left looking valid."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from tests.conftest import MODELS, run_cli

MLP = f"{MODELS}:TinyMLP"
X = ("-i", "x:float32[batch,8]")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A folder of broken inputs (and one good tiny ONNX file), made once."""
    d = tmp_path_factory.mktemp("bad")
    (d / "garbage.onnx").write_text("this is not protobuf")
    (d / "empty.onnx").write_bytes(b"")
    (d / "exits.py").write_text("import sys\nsys.exit(3)\n")
    (d / "os_exits.py").write_text("import os\nos._exit(0)\n")  # no SystemExit: ends the process unless trapped
    (d / "syntax.py").write_text("class Net(\n")
    (d / "importerr.py").write_text("import onnxport_no_such_package\n")
    (d / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    (d / "bad.pt").write_text("not a torchscript archive")
    (d / "bad.pt2").write_text("not an exported program")
    (d / "garbage_weights.pt").write_text("not a state dict")
    torch.save({"unrelated.weight": torch.zeros(2)}, d / "mismatch.pt")
    (d / "afile.txt").write_text("a file, not a folder")
    (d / "empty_dir").mkdir()
    prior = d / "prior"
    prior.mkdir()
    (prior / "report.json").write_text(json.dumps({"status": "ok", "marker": "earlier run"}))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), d / "tiny.onnx")
    return d


def _busy_port() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


# (id, arguments with {d} for the folder of bad files, exit code, a word the error line must hold)
CASES = [
    ("model file missing", ["export", "{d}/missing.py:Net", *X, "-o", "{d}/o1"], 2, "not found"),
    ("class missing", ["export", f"{MODELS}:NoSuchNet", *X, "-o", "{d}/o2"], 2, "NoSuchNet"),
    ("model file exits at import", ["export", "{d}/exits.py:Net", *X, "-o", "{d}/o3"], 2, "exit"),
    ("model file os._exit(0) at import", ["export", "{d}/os_exits.py:Net", *X, "-o", "{d}/o3b"], 2,
     "calls os._exit(0) while it is imported"),
    ("model file syntax error", ["export", "{d}/syntax.py:Net", *X, "-o", "{d}/o4"], 2, "syntax"),
    ("model file import error", ["export", "{d}/importerr.py:Net", *X, "-o", "{d}/o5"], 2, "import"),
    ("model file raises at import", ["export", "{d}/raises.py:Net", *X, "-o", "{d}/o6"], 2, "RuntimeError"),
    ("input spec unclosed", ["export", MLP, "-i", "x:float32[batch", "-o", "{d}/o7"], 2, "input"),
    ("input dtype unknown", ["export", MLP, "-i", "x:complex64[batch,8]", "-o", "{d}/o8"], 2, "complex64"),
    ("input spec without dtype", ["export", MLP, "-i", "x float32", "-o", "{d}/o9"], 2, "input"),
    ("dim range reversed", ["export", MLP, *X, "-d", "batch=9..2", "-o", "{d}/o10"], 2, "batch"),
    ("dim range not numbers", ["export", MLP, *X, "-d", "batch=lots", "-o", "{d}/o11"], 2, "batch"),
    ("dim that cannot vary", ["export", MLP, "-i", "x:float32[batch,feat]", "-d", "feat=2..64", "-o", "{d}/o12"],
     2, "feat"),
    ("model args not JSON", ["export", MLP, *X, "--model-args", "{bad", "-o", "{d}/o13"], 2, "model-args"),
    ("model args not an object", ["export", MLP, *X, "--model-args", "[1]", "-o", "{d}/o14"], 2, "model-args"),
    ("model args unknown keyword", ["export", MLP, *X, "--model-args", '{"nope": 1}', "-o", "{d}/o15"], 2, "nope"),
    ("weights missing", ["export", MLP, *X, "--weights", "{d}/missing.pt", "-o", "{d}/o16"], 2, "missing.pt"),
    ("weights unreadable", ["export", MLP, *X, "--weights", "{d}/garbage_weights.pt", "-o", "{d}/o17"], 2,
     "garbage_weights.pt"),
    ("weights of another model", ["export", MLP, *X, "--weights", "{d}/mismatch.pt", "-o", "{d}/o18"], 2,
     "mismatch.pt"),
    ("opset too old", ["export", MLP, *X, "--opset", "3", "-o", "{d}/o19"], 2, "opset"),
    ("opset not a number", ["export", MLP, *X, "--opset", "abc", "-o", "{d}/o20"], 2, "--opset"),
    ("exporter unknown", ["export", MLP, *X, "--exporter", "nope", "-o", "{d}/o21"], 2, "exporter"),
    ("device unknown", ["export", MLP, *X, "--device", "tpu", "-o", "{d}/o22"], 2, "device"),
    ("out is a file", ["export", MLP, *X, "-o", "{d}/afile.txt"], 2, "afile.txt"),
    ("out cannot be created", ["export", MLP, *X, "-o", "/proc/onnxport-out"], 2, "/proc/onnxport-out"),
    ("out holds earlier results", ["export", MLP, *X, "-o", "{d}/prior"], 2, "--force"),
    ("compare a file that is no ONNX", ["compare", MLP, "{d}/garbage.onnx", *X, "-o", "{d}/o23"], 2, "ONNX"),
    ("compare an empty file", ["compare", MLP, "{d}/empty.onnx", *X, "-o", "{d}/o24"], 2, "empty.onnx"),
    ("compare a missing file", ["compare", MLP, "{d}/missing.onnx", *X, "-o", "{d}/o25"], 2, "missing.onnx"),
    ("check a file that is no ONNX", ["check", "{d}/garbage.onnx"], 2, "garbage.onnx"),
    ("check a missing file", ["check", "{d}/missing.onnx"], 2, "missing.onnx"),
    ("torchvision name unknown", ["export", "torchvision:no_such_net", "-o", "{d}/o26"], 2, "no_such_net"),
    ("timm name unknown", ["export", "timm:no_such_net", "-o", "{d}/o27"], 2, "no_such_net"),
    ("hf folder missing", ["export", "hf:{d}/no_such_dir", "-o", "{d}/o28"], 2, "no_such_dir"),
    ("exported program unreadable", ["export", "{d}/bad.pt2", "-o", "{d}/o29"], 2, "bad.pt2"),
    ("torchscript unreadable", ["export", "{d}/bad.pt", *X, "-o", "{d}/o30"], 2, "bad.pt"),
    ("variants unknown", ["convert", MLP, *X, "--variants", "nope", "-o", "{d}/o31"], 2, "nope"),
    ("seq out of range", ["convert", MLP, *X, "--seq", "0", "-o", "{d}/o32"], 2, "--seq"),
    ("budget not a number", ["convert", MLP, *X, "--budget", "soon", "-o", "{d}/o33"], 2, "--budget"),
    ("unknown option", ["export", MLP, "--bogus"], 2, "--bogus"),
    ("missing argument", ["export"], 2, "source"),
    ("unknown command", ["exprot", MLP], 2, "exprot"),
    ("report without report.json", ["report", "{d}/empty_dir"], 2, "report.json"),
    ("triton without a model", ["triton", "{d}/empty_dir", "--repo", "{d}/repo"], 2, "empty_dir"),
    ("serve a missing path", ["serve", "{d}/no_such_dir"], 2, "no_such_dir"),
    ("serve on an invalid port", ["serve", "{d}/tiny.onnx", "--port", "70000"], 2, "--port"),
    ("serve on a port in use", ["serve", "{d}/tiny.onnx", "--port", "{busy}"], 2, "{busy}"),
    ("serve a model under a bad name", ["serve", "{d}/tiny.onnx", "--name", "a/b"], 2, "--name"),
]


def test_the_table_has_at_least_thirty_bad_inputs():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,args,code,word", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_answered_in_one_line(files, name, args, code, word):
    with _busy_port() as busy:
        port = str(busy.getsockname()[1])
        fill = {"{d}": str(files), "{busy}": port}
        argv = [_fill(a, fill) for a in args]
        before = (files / "prior" / "report.json").read_text()
        proc = run_cli(*argv, timeout=120)
    assert proc.returncode == code, f"{name}: exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{name}: expected one line on stderr, got:\n{proc.stderr}"
    assert lines[0].startswith("error:") and "Hint:" in lines[0], lines[0]
    assert _fill(word, fill).lower() in lines[0].lower(), lines[0]
    assert (files / "prior" / "report.json").read_text() == before  # earlier results untouched
    for a in argv:
        out = Path(a)
        if out.parent == files and out.name.startswith("o") and out.name[1:].isdigit():
            assert not out.exists(), f"{name}: left {out} behind ({[p.name for p in out.iterdir()]})"


def _fill(text: str, fill: dict[str, str]) -> str:
    for k, v in fill.items():
        text = text.replace(k, v)
    return text
