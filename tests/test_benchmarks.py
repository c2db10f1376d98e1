"""Every script in benchmarks/ runs in its quickest form (a tiny model, one repeat, outputs in a temporary
folder) and exits 0 with the figures it exists to print: a benchmark that crashes fails here, not on the day
someone needs its numbers.

A smoke runs its script as ``python benchmarks/SCRIPT ARGS`` would (``runpy`` as ``__main__``, the script's folder
first on the path, the repository as the working directory), in this process: what the script imports (torch,
transformers, the exporter) is already imported here, so a smoke costs the script's own work, not a fresh
interpreter's start-up. The processes the scripts start themselves (servers, ``onnxport`` runs) are real processes.
What a script changes in the process (arguments, path, working directory, environment, torch's threads and
random state) is put back afterwards. The claims about the process itself (no traceback without CUDA) run it
as a subprocess."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
import runpy
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import MODELS, ROOT

BENCHMARKS = ROOT / "benchmarks"
TIMEOUT_S = 300  # each script run as a subprocess
ENV = {"COLUMNS": "200", "ONNXPORT_DEBUG": ""}
# TRITON_CLIENTS: tritonclient.http's clients close their gevent pool when collected, which fails outside the
# thread that made them; a script's own process drops that at exit, here it is an unraisable-exception warning


@dataclass
class Ran:
    """What a script run left: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def bench(script: str, *args: str, ok: bool = True) -> Ran:
    """Run ``benchmarks/SCRIPT ARGS`` in this process as ``python benchmarks/SCRIPT ARGS`` would; with ``ok``,
    assert exit 0 (showing its output)."""
    path = BENCHMARKS / script
    saved = (sys.argv, sys.path[:], os.getcwd(), dict(os.environ), torch.get_num_threads(), torch.get_rng_state())
    out, err = io.StringIO(), io.StringIO()
    sys.argv, code = [str(path), *args], 0
    sys.path.insert(0, str(BENCHMARKS))
    os.chdir(ROOT)
    os.environ.update(ENV)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int | None):
            err.write(f"{e.code}\n")
    except Exception:  # noqa: BLE001 - as the interpreter would: a traceback and exit 1
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        os.environ.clear()
        os.environ.update(saved[3])
        torch.set_num_threads(saved[4])
        torch.set_rng_state(saved[5])
        gc.collect()  # what the script left is collected within its own test (see TRITON_CLIENTS)
    ran = Ran(code, out.getvalue(), err.getvalue())
    if ok:
        assert code == 0, f"{script} exited {code}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    return ran


def bench_process(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``benchmarks/SCRIPT ARGS`` as its own process (for what a test says about the process itself)."""
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=ROOT, env=dict(os.environ, **ENV))


def test_every_script_has_a_smoke_test():
    tested = set(re.findall(r'bench\("(\w+\.py)"', Path(__file__).read_text()))
    assert {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")} == tested  # _*.py: helpers


def test_report_size(tmp_path):
    page = tmp_path / "report.html"
    proc = bench("report_size.py", "--nodes", "200", "--cases", "5", "--repeat", "1", "--out", str(page))
    assert re.search(r"size +[\d,]+ KB +\(of which plotly\.js [\d,]+ KB, report itself [\d,]+ KB\)", proc.stdout)
    assert "render        first" in proc.stdout and "<html" in page.read_text(encoding="utf-8")


def test_report_identity(tmp_path):
    work = tmp_path / "run"
    assert re.search(r"^tiny_mlp +exit 0 ", bench("report_identity.py", "run", str(work), "--only", "tiny_mlp").stdout,
                     re.M)
    proc = bench("report_identity.py", "diff", str(work), str(work), "--only", "tiny_mlp")
    assert re.fullmatch(r"tiny_mlp +identical \(status ok, best None\)\n", proc.stdout)


def test_export_time():
    proc = bench("export_time.py", "--runs", "1", "--source", f"{MODELS}:TinyMLP", "--", "-i", "x:float32[batch,8]")
    assert re.search(r"^run 1: [\d.]+ s wall +\(.*exporter \w+, \d+ cases\)$", proc.stdout, re.M)
    assert re.search(r"TinyMLP: median [\d.]+ s, min [\d.]+ s over 1 runs", proc.stdout)


def test_headline(tmp_path):
    out = tmp_path / "headline.json"
    proc = bench("headline.py", "--smoke", "--json", str(out))
    assert re.search(r"^text_classifier +batch 1 +[\d.]+x eager", proc.stdout, re.M)
    runs = {r["backend"]: r for r in json.loads(out.read_text())["text_classifier"]["runs"]}
    assert {"pytorch", "onnxruntime"} <= set(runs) and all(r["batch"] == 1 and r["p50_ms"] > 0 for r in runs.values())
    assert runs["onnxruntime"]["max_abs_diff"] < 1e-4 and runs["onnxruntime"]["speedup"] > 0


def test_optimize_speedup():
    proc = bench("optimize_speedup.py", "--smoke")
    assert re.search(r"^\[textclassifier\] +slim +passed=True .* cosine[^=]*=1\.0000", proc.stdout, re.M)
    rows = re.findall(r"^textclassifier seq 16 +(\S+) +[\d.]+ ms +[\d.]+x eager", proc.stdout, re.M)
    assert rows[:2] == ["pytorch-eager", "export"] and "<- best" in proc.stdout


def test_cpu_race(tmp_path):
    out = tmp_path / "race.json"
    proc = bench("cpu_race.py", "--smoke", "--json", str(out))
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| shape |"))
    assert "| pytorch-eager | ort-export |" in header and "openvino-default" in header
    assert re.search(r"^\| textclassifier 1x16 \|( [\d.]+ \|)+$", proc.stdout, re.M)
    data = json.loads(out.read_text())
    assert data["command"].endswith("--json " + str(out)) and data["machine"]["cores"] >= 1
    assert data["p50_ms"]["textclassifier 1x16"]["pytorch-eager"] > 0
    assert [v["name"] for v in data["models"]["textclassifier"]["variants"]] == ["export", "slim"]
    assert "[textclassifier] onnxport's choice (best): " in proc.stdout


@pytest.mark.slow
def test_gpu_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    bench("gpu.py", "--cpu-smoke", "--json", str(out))
    (row,) = json.loads(out.read_text())
    assert (row["model"], row["batch"]) == ("bert", 1) and row["best"]
    assert row["ms"]["onnxport fp32"] > 0 and row["ms"]["torch eager fp32"] > 0


@pytest.mark.slow
def test_gpu_check_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = bench("gpu_check.py", "--cpu-smoke", "--runs", "3", "--json", str(out), "--work", str(tmp_path / "w"))
    result = json.loads(out.read_text())
    (row,) = result["points"]
    assert (row["model"], row["batch"]) == ("cnn", 1) and row["ms"]["onnxport fp32"] > 0
    versus = {r["variant"]: r for r in result["cli_vs_harness"]}
    assert versus["export"]["cli_ms"] > 0 and versus["export"]["harness_ms"] > 0 and "ratio" in versus["export"]
    serve = result["serve"]
    assert serve["requests"] == 64 and serve["wrong"] == 0 and serve["requests_per_s"] > 0, serve
    assert result["families"] and "CLI table vs harness" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the real benchmark")
def test_gpu_check_without_cuda_says_so():
    proc = bench_process("gpu_check.py")
    assert "needs a CUDA GPU" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the real benchmark")
def test_gpu_without_cuda_says_so():
    proc = bench_process("gpu.py")
    assert "needs a CUDA GPU" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_large_model(tmp_path):
    out = tmp_path / "large"
    bench("large_model.py", "--layers", "1", "--width", "64", "--variants", "slim", "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["parameters"] == 64 * 64 + 64 + 64 * 10 + 10
    assert [(s["stage"], s["exit"]) for s in summary["stages"]] == [
        ("export", 0), ("opt:slim", 0), ("check", 0), ("triton", 0)]
    assert [v[:2] for v in summary["variants"]] == [["slim", True]]


@pytest.mark.slow
def test_decoder(tmp_path):
    out = tmp_path / "decoder.json"
    proc = bench("decoder.py", "--smoke", "--json", str(out))
    assert "exported and proven in" in proc.stdout and "passed=True" in proc.stdout
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert {"eager loop", "eager generate", "export"} <= set(rows) and rows["export"]["passed"]
    assert data["command"].endswith("--json " + str(out)) and data["machine"]["cores"] >= 1
    assert all(r["tok_s_b1"] > 0 and r["tok_s_b8"] > 0 for r in rows.values() if "tok_s_b1" in r)
    assert data["best"] and data["export_vs_eager"] > 0


@pytest.mark.slow
def test_decoder_gpu(tmp_path):
    out = tmp_path / "decoder_gpu.json"
    bench("decoder_gpu.py", "--smoke", "--json", str(out))
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["smoke"] and data["onnxport"]["proven"] is True
    assert data["onnxport"]["best"] and data["onnxport"]["tok_s_b8"] > 0 and data["hf_eager"]["tok_s_b1"] > 0
    made = {v["name"]: v for v in data["onnxport"]["variants"]["variants"]}
    assert made["gqa"]["passed"], made["gqa"]  # GroupQueryAttention built and proven on the CPU provider
    assert data["vs_hf_b1"] > 0 and "available" in data["genai"] and data["command"].endswith("--json " + str(out))


@pytest.mark.slow
def test_seq2seq(tmp_path):
    out = tmp_path / "s2s.json"
    proc = bench("seq2seq.py", "--smoke", "--json", str(out))
    rows = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    assert json.loads(out.read_text())["batch 1"] == rows["batch 1"]
    assert rows["proven"] is True and rows["tokens"] == 32
    for batch in ("batch 1", "batch 8"):
        assert rows[batch]["onnx loop"]["decode_tok_s"] > 0 and rows[batch]["pytorch generate()"]["decode_tok_s"] > 0
        assert rows[batch]["x generate"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see TRITON_CLIENTS
def test_serve_load(tmp_path):
    out = tmp_path / "serve_load.json"
    proc = bench("serve_load.py", "--smoke", "--json", str(out))
    assert "load proof PASSED" in proc.stdout
    data = json.loads(out.read_text())
    assert [r["mode"] for r in data["rows"]] == ["raw ORT (one at a time)", "onnxport serve, HTTP",
                                                 "onnxport serve, gRPC", "raw ORT (one at a time), again after"]
    assert all((r["requests"], r["errors"], r["wrong"]) == (48, 0, 0) for r in data["rows"])
    (drain,) = data["drains"]
    assert drain["exit_code"] == 0 and drain["answered_total"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see TRITON_CLIENTS
def test_serve_throughput():
    proc = bench("serve_throughput.py", "--smoke")
    assert re.search(r"c=2 +ratios: batched/unbatched throughput [\d.]+x, batched/raw-ORT [\d.]+x", proc.stdout)
    modes = re.findall(r"^\| text_classifier \(tiny\) \| 2 \| (\w+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", proc.stdout, re.M)
    assert modes[:3] == ["batched", "unbatched", "ort"]


@pytest.mark.slow
def test_yes_rate(tmp_path):
    out = tmp_path / "yes_rate.json"
    proc = bench("yes_rate.py", "--only", "pattern_scatter_add", "--out", str(out))
    assert f"wrote {out}" in proc.stdout
    data = json.loads(out.read_text())
    assert data["summary"] == {"models": 1, "onnxport_yes": 1, "any_plain_correct": 1, "silent_failures": 0,
                               "cannot_tell": 0}
    (row,) = data["models"]
    assert row["model"] == "pattern_scatter_add" and row["onnxport"]["status"] == "ok"
    assert row["onnxport"]["check"]["ok"] is True


def test_serve_json(tmp_path):
    out = tmp_path / "sj.json"
    proc = bench("serve_json.py", "--mb", "1", "--bodies", "2", "--json", str(out))
    data = json.loads(out.read_text())
    assert data["bodies"] == 2 and set(data["parsers"]) == {"orjson", "json"}
    assert all(p["answered_s"] > 0 for p in data["parsers"].values())
    assert re.search(r"^ orjson: worst health latency +[\d.]+ ms", proc.stdout, re.M)
    assert re.search(r"^ratio json / orjson: health [\d.]+x, answers [\d.]+x$", proc.stdout, re.M)


def test_first_hour(tmp_path):
    out = tmp_path / "fh.json"
    proc = bench("first_hour.py", "--smoke", "--out", str(out))
    assert re.search(r"^tiny_mlp +exit 0 +[\d.]+ s +best ", proc.stdout, re.M)
    got = json.loads(out.read_text())
    assert got["models"][0]["status"] == "ok" and "flags" in got["cpu"] and got["command"].endswith("--out " + str(out))


def test_diffusion_catalogue(tmp_path):
    out = tmp_path / "catalogue.json"
    proc = bench("diffusion_catalogue.py", "--only", "vae-tiny", "--out", str(out))
    rows = json.loads(out.read_text())["models"]
    assert [(r["name"], r["outcome"]) for r in rows] == [("vae-tiny", "proven")], proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"proven": 1}


def test_catalogue(tmp_path):
    """A model over --max-params is listed, not built; a name torchvision does not have is refused, one line."""
    out = tmp_path / "catalogue.json"
    proc = bench("catalogue.py", "--only", "vit_h_14", "--only", "no_such_model", "--out", str(out))
    rows = {r["name"]: r for r in json.loads(out.read_text())["models"]}
    assert rows["vit_h_14"]["outcome"] == "too large" and rows["vit_h_14"]["parameters"] > 150_000_000
    assert rows["no_such_model"]["outcome"] == "refused" and "no model" in rows["no_such_model"]["line"]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"too large": 1, "refused": 1}


def test_catalogue_of_hugging_face_types_saves_a_folder_and_exports_it(tmp_path):
    out = tmp_path / "catalogue.json"
    bench("catalogue.py", "--library", "hf", "--only", "camembert", "--out", str(out))
    (row,) = json.loads(out.read_text())["models"]
    assert (row["name"], row["outcome"], row["exit"]) == ("camembert", "proven", 0) and row["parameters"] > 0
    assert "timings" in row


def test_catalogue_summary_lists_what_is_not_proven(tmp_path):
    out = tmp_path / "catalogue_torchvision.json"
    bench("catalogue.py", "--only", "vit_h_14", "--out", str(out))
    proc = bench("catalogue.py", "--summary", str(out))
    assert "| torchvision | 1 of 121 |" in proc.stdout
    assert re.search(r"^\| torchvision \| vit_h_14 \| too large \| .*parameters", proc.stdout, re.M)


def test_catalogue_checks_a_refusal_with_the_plain_exporters(tmp_path):
    """--check-refusals runs refusal_check.py on a model not proven: a name torchvision does not have cannot even
    be loaded, so it is recorded as not checked, in one line."""
    out = tmp_path / "catalogue.json"
    bench("catalogue.py", "--only", "no_such_model", "--out", str(out), "--check-refusals")
    verdict = json.loads(out.read_text())["refusals_checked"]["no_such_model"]["verdict"]
    assert verdict.startswith("not checked: ") and "no model" in verdict


def test_refusal_check_tries_each_plain_exporter(tmp_path):
    """A value-dependent branch: dynamo refuses, TorchScript freezes the branch (wrong at other values), so the
    refusal is right; a plain model is converted by the plain exporters, so refusing it would be wrong."""
    out = tmp_path / "check.json"
    bench("refusal_check.py", f"{MODELS}:NeedsItem", "-i", "x:float32[batch,4]", "--json", str(out))
    got = json.loads(out.read_text())
    assert got["verdict"].startswith("refusal right")
    assert "GuardOnDataDependentSymNode" in got["attempts"]["dynamo, dynamic"]["error"]
    assert got["attempts"]["torchscript, dynamic"]["wrong"]
    bench("refusal_check.py", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--json", str(out))
    assert json.loads(out.read_text())["verdict"].startswith("refusal wrong: dynamo, dynamic, torchscript, dynamic")


def test_gates_check(tmp_path):
    out = tmp_path / "gates.json"
    proc = bench("gates_check.py", "--source", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--inputs", "8",
                 "--variants", "int8", "--root", str(tmp_path / "runs"), "--json", str(out))
    assert re.search(r"^TinyMLP +int8 .*centred top-1 \d\.\d{4} \(raw \d\.\d{4}, classes \d+\) +centred cosine min "
                     r"-?\d\.\d{4}", proc.stdout, re.M)
    row = json.loads(out.read_text())["models"]["TinyMLP"]
    assert row["exit"] == 0 and row["best"] in row["variants"] and row["variants"]["int8"]["rows"] >= 8
    assert json.loads(out.read_text())["command"].startswith("python benchmarks/gates_check.py --source")
