"""End to end through the command line: real exports, real ONNX Runtime sessions, real exit codes.

``--help`` starts ``python -m onnxport`` from scratch (run_cli); the other commands run as processes forked from one
that did the CLI's imports once (the ``cli`` fixture, tests/fixtures/forked_cli.py): their claims are the commands'
results and exit statuses, not the start-up (tests/e2e/test_faults.py starts and signals real processes)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.conftest import MODELS, ROOT, load_report, run_cli

EXAMPLE = ROOT / "examples" / "text_classifier.py"
# The tutorial's TextClassifier (embedding, Transformer encoder, linear head) at a small size: what is shown (batch and
# seq proven over 1..64 and 1..512, the file matching PyTorch at the listed shapes) does not depend on its width,
# vocabulary, depth or head count, while the proof's cases at batch 64 x seq 512 cost in proportion to them.
TC_ARGS = '{"vocab_size": 1000, "embed_dim": 32, "num_classes": 10, "num_layers": 2, "nhead": 2}'


def _assert_clean_error(proc, out: Path | None = None, code: int = 2) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and "Hint:" in lines[0], lines[0]
    if out is not None:
        assert not (out / "model.onnx").exists()


@pytest.fixture(scope="module")
def mlp_export(tmp_path_factory, cli) -> Path:
    """One proven TinyMLP export (TorchScript) that the commands reading an exported folder share; read only."""
    out = tmp_path_factory.mktemp("mlp") / "OUT"
    proc = cli("export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(out),
                   "--exporter", "torchscript")
    assert proc.returncode == 0, proc.stderr
    return out


# --------------------------------------------------------------------------- the must-show runs


@pytest.mark.slow
def test_text_classifier_export_matches_pytorch_at_listed_shapes(tmp_path, cli):
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        from text_classifier import TextClassifier
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    torch.manual_seed(123)
    model = TextClassifier(**json.loads(TC_ARGS)).eval()
    weights = tmp_path / "tc.pt"
    torch.save(model.state_dict(), weights)
    out = tmp_path / "OUT"
    proc = cli("export", f"{EXAMPLE}:TextClassifier", "--model-args", TC_ARGS, "--weights", str(weights),
                   "-i", "input_ids:int64[batch,seq]", "-d", "batch=1..64", "-d", "seq=1..512", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    assert rep["status"] == "ok"
    assert {d["symbol"]: d["proven"] for d in rep["check"]["dynamic_dims"]} == {"batch": True, "seq": True}
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for shape in [(1, 1), (3, 77), (64, 512)]:
        ids = torch.randint(0, 1000, shape)
        with torch.inference_mode():
            ref = model(ids).numpy()
        got = sess.run(None, {"input_ids": ids.numpy()})[0]
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_resnet18_without_inputs_has_batch_height_width_proven(tmp_path, cli):
    import torchvision

    out = tmp_path / "OUT"
    proc = cli("export", "torchvision:resnet18", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    dims = {d["symbol"]: d for d in rep["check"]["dynamic_dims"]}
    assert set(dims) == {"batch", "height", "width"}
    assert all(d["proven"] and len(d["sizes_passed"]) >= 3 for d in dims.values())
    assert rep["export"]["inputs"][0]["shape"] == ["batch", 3, "height", "width"]
    torch.manual_seed(0)  # onnxport seeds the RNG with 0 before building a random-weight model
    model = torchvision.models.get_model("resnet18", weights=None).eval()
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for shape in [(1, 3, 224, 224), (4, 3, 256, 256), (2, 3, 97, 131)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            ref = model(x).numpy()
        got = sess.run(None, {"image": x.numpy()})[0]
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-3)


def test_a_two_image_model_without_inputs_is_exported_with_both_and_proven(tmp_path, cli):
    """forward(image1, image2) (optical flow, stereo): one input per image, each guessed from the first
    convolution, proven at other sizes of both, and the file computes what the model does."""
    from tests.fixtures.models import TwoImages

    out = tmp_path / "OUT"
    proc = cli("export", f"{MODELS}:TwoImages", "-o", str(out), "-d", "batch=1..4", "-d", "height=8..64",
               "-d", "width=8..64")
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    assert [i["name"] for i in rep["export"]["inputs"]] == ["image1", "image2"]
    assert all(d["proven"] for d in rep["check"]["dynamic_dims"])
    assert "inputs-guessed" in proc.stderr
    torch.manual_seed(0)
    model = TwoImages().eval()
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    a, b = torch.randn(3, 3, 40, 24), torch.randn(3, 3, 40, 24)
    with torch.inference_mode():
        ref = model(a, b).numpy()
    np.testing.assert_allclose(sess.run(None, {"image1": a.numpy(), "image2": b.numpy()})[0], ref,
                               atol=1e-5, rtol=1e-4)
    assert not np.allclose(sess.run(None, {"image1": b.numpy(), "image2": a.numpy()})[0], ref, atol=1e-3)


def test_a_cache_the_check_runs_leave_is_computed_in_the_graph(tmp_path, cli):
    """A head that caches a grid from its input's shape (YOLO, RT-DETR): the runs before the export leave the
    cache of the export size, which a trace would freeze. The export sees the model as it was before any run,
    so the first exporter's file computes the grid from its input and is proven at every size."""
    from tests.fixtures.models import CachedGrid

    out = tmp_path / "OUT"
    proc = cli("export", f"{MODELS}:CachedGrid", "-o", str(out), "-d", "batch=1..4", "-d", "height=8..64",
               "-d", "width=8..64")
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    assert rep["export"]["exporter"] == "dynamo"
    assert not {"export-retried", "control-flow-frozen"} & {d["code"] for d in rep["diagnostics"]}
    torch.manual_seed(0)
    model = CachedGrid().eval()
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for shape in ((1, 3, 16, 24), (3, 3, 40, 8)):
        x = torch.randn(*shape)
        with torch.inference_mode():
            ref = model(x).numpy()
        np.testing.assert_allclose(sess.run(None, {"x": x.numpy()})[0], ref, atol=1e-5, rtol=1e-4)


def test_sizes_no_exporter_keeps_a_branch_on_are_fixed_when_onnxport_made_them_up(tmp_path, cli):
    """A Swin-like window shift dropped on small feature maps: every exporter freezes it, so no file is proven
    over the image sizes onnxport guessed; the chain runs again with them fixed at the export sizes, and that
    file is proven, says so (``range-fixed``) and refuses other sizes. Declared ranges are never fixed."""
    from tests.fixtures.models import ShiftedWindows

    out = tmp_path / "OUT"
    proc = cli("export", f"{MODELS}:ShiftedWindows", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    assert rep["export"]["inputs"][0]["shape"] == ["batch", 3, 224, 240]
    fixed = next(d for d in rep["diagnostics"] if d["code"] == "range-fixed")
    assert fixed["severity"] == "warning" and "height 224 (not 32..512)" in fixed["message"]
    torch.manual_seed(0)
    model = ShiftedWindows().eval()
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 3, 224, 240)
    with torch.inference_mode():
        np.testing.assert_allclose(sess.run(None, {"x": x.numpy()})[0], model(x).numpy(), atol=1e-5, rtol=1e-4)
    with pytest.raises(Exception, match="dimension"):
        sess.run(None, {"x": np.zeros((1, 3, 32, 32), np.float32)})

    declared = tmp_path / "DECLARED"
    proc = cli("export", f"{MODELS}:ShiftedWindows", "-o", str(declared), "-i", "x:float32[batch,3,height,width]",
               "-d", "height=32..256", "-d", "width=32..256")
    assert proc.returncode == 1, proc.stderr
    rep = load_report(declared)
    assert "range-fixed" not in {d["code"] for d in rep["diagnostics"]}
    assert (declared / "model.unverified.onnx").exists() and not (declared / "model.onnx").exists()


@pytest.mark.slow
def test_minilm_directory_without_inputs(tmp_path, minilm_dir, cli):
    out = tmp_path / "OUT"
    proc = cli("export", f"hf:{minilm_dir}", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    assert json.loads(proc.stdout) == rep  # --json prints exactly the report
    names = [i["name"] for i in rep["export"]["inputs"]]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i["shape"] == ["batch", "seq"] for i in rep["export"]["inputs"])
    seq = [d for d in rep["check"]["dynamic_dims"] if d["symbol"] == "seq"]
    assert len(seq) == 3 and all(d["proven"] for d in seq)
    assert min(seq[0]["sizes_passed"]) == 1 and max(seq[0]["sizes_passed"]) == 512
    assert [o["name"] for o in rep["export"]["outputs"]] == ["last_hidden_state", "pooler_output"]


# --------------------------------------------------------------------------- failures with exit codes


def test_frozen_branch_is_not_proven_and_not_named_model_onnx(tmp_path, cli):
    out = tmp_path / "OUT"
    proc = cli("export", f"{MODELS}:NeedsItem", "-i", "x:float32[batch,4]", "--exporter", "torchscript",
                   "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    rep = load_report(out)
    assert rep["status"] == "validation_failed"
    assert not (out / "model.onnx").exists()
    assert (out / "model.unverified.onnx").exists()
    assert rep["export"]["path"] == "model.unverified.onnx"
    cases = rep["validation"]["cases"]
    assert any(c["passed"] for c in cases) and not all(c["passed"] for c in cases)
    codes = {d["code"] for d in rep["diagnostics"]}
    assert {"parity-failed", "tracer-warning"} <= codes


def test_export_impossible_exits_3_with_every_attempt(tmp_path, cli):
    src = tmp_path / "eig.py"
    src.write_text("import torch\nclass Eig(torch.nn.Module):\n"
                   "    def forward(self, x):\n        return torch.linalg.eigvals(x).real\n")
    out = tmp_path / "OUT"
    proc = cli("export", f"{src}:Eig", "-i", "x:float32[batch,4,4]", "-o", str(out), "--json")
    assert proc.returncode == 3, proc.stderr
    rep = json.loads(proc.stdout)  # stdout holds only the JSON, no exporter chatter
    assert rep["status"] == "export_failed"
    tried = [a for a in rep["export"]["attempts"] if not a["error"].startswith("not applicable")]
    assert [a["exporter"] for a in tried] == ["dynamo", "torchscript"]
    assert all(not a["ok"] and "eig" in a["error"] for a in tried)
    assert not (out / "model.onnx").exists()
    load_report(out)


def test_bad_inputs_get_one_line_errors(tmp_path, cli):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Net(torch.nn.Module):\n    def forward(self, x)\n        return x\n")
    out = tmp_path / "OUT"
    cases = [
        ("export", str(tmp_path / "nope.py") + ":Net", "-i", "x:float32[b,4]"),
        ("export", f"{bad}:Net", "-i", "x:float32[b,4]"),
        ("export", f"{MODELS}:NoSuchNet", "-i", "x:float32[b,4]"),
        ("export", f"{MODELS}:TinyMLP", "-i", "x:float32[b,4"),
        ("export", f"{MODELS}:TinyMLP", "-i", "x:float32[b,8]", "-d", "b=1-8"),
        ("export", f"{MODELS}:TinyMLP", "-i", "x:float32[b,8]", "--model-args", '{"nope": 1}'),
        ("export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,feat]", "-d", "feat=2..64"),
        ("export", f"{MODELS}:TinyMLP"),
    ]
    said = {}
    for args in cases:
        proc = cli(*args, "-o", str(out))
        _assert_clean_error(proc, out)
        said[args] = proc.stderr
    assert "feat" in said[cases[6]]  # the dim that is not in any input is named
    assert "line 3" in said[cases[1]]  # the syntax error's line


def test_results_are_never_overwritten_without_force(tmp_path, mlp_export, cli):
    out = tmp_path / "OUT"
    shutil.copytree(mlp_export, out)  # a finished run's folder
    before = (out / "model.onnx").read_bytes()
    again = cli("export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(out))
    _assert_clean_error(again)
    assert "--force" in again.stderr
    assert (out / "model.onnx").read_bytes() == before
    forced = cli("export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(out), "--force",
                     "--exporter", "torchscript", "--opset", "18")
    assert forced.returncode == 0, forced.stderr
    assert load_report(out)["export"]["opset"] == 18
    assert not list(out.glob(".onnxport-*")), "no work files left behind"


def test_check_and_doctor(tmp_path, mlp_export, cli):
    out = mlp_export
    proc = cli("check", str(out / "model.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["ok"] and info["op_histogram"]["Gemm"] == 2
    assert info["inputs"][0]["shape"] == ["batch", 8]
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    _assert_clean_error(cli("check", str(garbage)))
    doc = cli("doctor", "--json")
    assert doc.returncode == 0, doc.stderr
    d = json.loads(doc.stdout)
    assert "CPUExecutionProvider" in d["providers"]
    assert d["max_opset"]["onnxruntime"] >= 17 and d["packages"]["torch"]


def test_python_module_entry_and_help():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for cmd in ("convert", "export", "check", "doctor"):
        assert cmd in proc.stdout


def test_bench_report_and_convert_commands(tmp_path, cli):
    out = tmp_path / "OUT"
    proc = cli("bench", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--batch", "1", "--batch", "4",
                   "--seconds", "0.3", "-o", str(out), "--exporter", "torchscript")
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    runs = rep["benchmark"]["runs"]
    assert {(r["backend"], r["batch"]) for r in runs} >= {("pytorch", 1), ("onnxruntime", 1), ("pytorch", 4),
                                                          ("onnxruntime", 4)}
    assert all(r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] and r["throughput"] > 0 for r in runs)
    (out / "report.html").unlink()
    again = cli("report", str(out))
    assert again.returncode == 0, again.stderr
    assert "<html" in (out / "report.html").read_text()[:500].lower()
    _assert_clean_error(cli("report", str(tmp_path / "nowhere")))
    conv = tmp_path / "CONV"
    proc = cli("convert", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(conv), "--no-bench",
                   "--exporter", "torchscript")
    assert proc.returncode == 0, proc.stderr
    rep = load_report(conv)
    assert rep["benchmark"] is None
    names = [v["name"] for v in rep["variants"]]  # convert builds what can win here, lists the rest with why
    onnxruntime = {"slim", "ort", "fused", "fp16", "int8", "fused+int8"}
    assert names[0] == "export" and onnxruntime <= set(names[1:])
    assert set(names[1:]) - onnxruntime <= {"openvino", "openvino-bf16", "openvino-int8"}  # where OpenVINO is installed
    not_built = {v["name"]: v["skipped"] for v in rep["variants"] if (v.get("skipped") or "").startswith("not built")}
    assert {"slim", "ort", "fused", "fused+int8"} <= set(not_built) and "int8" not in not_built
    assert all("--variants all" in why for name, why in not_built.items() if name in onnxruntime)
    assert rep["best"]["name"] in names and (conv / "best.onnx").is_file() and "optimize" in rep["timings"]
    assert "variants" in proc.stderr and "not built" in proc.stderr
    assert "p50 ms b8" in proc.stderr and "geometric mean" in proc.stderr  # what the best is chosen by, shown
    assert rep["log"] == "onnxport.log" and (conv / "onnxport.log").is_file()
    plain = tmp_path / "PLAIN"
    proc = cli("convert", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(plain), "--no-bench",
                   "--exporter", "torchscript", "--no-optimize")
    assert proc.returncode == 0, proc.stderr
    assert load_report(plain)["variants"] == [] and not (plain / "best.onnx").exists()
    assert not (plain / "variants").exists()
    _assert_clean_error(cli("convert", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(plain),
                                "--force", "--no-optimize", "--variants", "slim"))
    # --seq (the length variants are timed and chosen at) needs a token input, inside its range; checked first
    seqless = tmp_path / "SEQLESS"
    proc = cli("convert", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "-o", str(seqless), "--seq", "64")
    _assert_clean_error(proc, seqless)
    assert "--seq needs an integer (token) input" in proc.stderr
    proc = cli("optimize", f"{MODELS}:TinyText", str(conv / "model.onnx"), "-i", "input_ids:int64[batch,seq]",
                   "-d", "seq=1..32", "-o", str(seqless), "--seq", "64")
    _assert_clean_error(proc, seqless)
    assert "outside the declared range of 'seq' (1..32)" in proc.stderr


def test_triton_and_serve_commands(tmp_path, mlp_export, cli):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    out = mlp_export
    repo = tmp_path / "repo"
    proc = cli("triton", str(out), "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    cfg = text_format.Parse(Path(info["config"]).read_text(), model_config_pb2.ModelConfig())
    assert cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 32
    assert list(cfg.input[0].dims) == [8]
    again = cli("triton", str(out), "--repo", str(repo))
    _assert_clean_error(again)
    _assert_clean_error(cli("serve", str(tmp_path / "missing")))
    _assert_clean_error(cli("view", str(tmp_path / "missing.onnx")))


def test_optimize_command_reproves_each_variant(tmp_path, mlp_export, cli):
    src = mlp_export
    out = tmp_path / "OPT"
    proc = cli("optimize", f"{MODELS}:TinyMLP", str(src / "model.onnx"), "-i", "x:float32[batch,8]",
                   "--variants", "slim,ort,fp16", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    by_name = {v["name"]: v for v in rep["variants"]}
    assert {"export", "slim", "ort", "fp16"} <= set(by_name)
    assert all((out / v["path"]).exists() for v in rep["variants"] if v["passed"] and v["name"] != "export")
    assert (out / "best.onnx").exists() and by_name[rep["best"]["name"]]["passed"]
    bad = cli("optimize", f"{MODELS}:TinyMLP", str(src / "model.onnx"), "-i", "x:float32[batch,8]",
                  "--variants", "turbo", "-o", str(tmp_path / "BAD"))
    _assert_clean_error(bad)
