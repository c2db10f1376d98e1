"""--samples through the CLI: every format proven sample by sample, a failing sample fails the proof by its index,
variants judged on the samples, and every bad samples file answered in one line (exit 2) with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import onnxport
from tests.conftest import FIXTURES, MODELS, load_report
from tests.fixtures.samples import write_images

SAMPLES = FIXTURES / "samples.py"
MLP = (f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--exporter", "torchscript")
BAG = (f"{SAMPLES}:TokenBag", "-i", "input_ids:int64[batch,seq]", "-i", "attention_mask:int64[batch,seq]",
       "-d", "seq=1..32", "--exporter", "torchscript")
CNN = (f"{SAMPLES}:TinyCNN", "-i", "image:float32[batch,3,32,32]", "--exporter", "torchscript")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("samples")
    rng = np.random.default_rng(0)
    np.savez(d / "x.npz", x=rng.normal(size=(20, 8)).astype(np.float32))
    np.save(d / "x.npy", rng.normal(size=(9, 8)))
    (d / "t.txt").write_text("The cat sat on the mat.\nA longer line of text to pad against in the same batch.\n"
                             "\nShort.\n")
    (d / "p.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"text": "Where is the station?", "text_pair": "Two streets down, on the left."},
        {"text": "Is it raining?", "text_pair": "No."})) + "\n")
    write_images(d / "imgs", 10)
    np.savez(d / "big.npz", x=np.concatenate([rng.normal(size=(8, 4)), np.full((4, 4), 5000.0)]).astype(np.float32))
    np.savez(d / "loud.npz", x=np.concatenate([rng.normal(size=(6, 4)), np.full((2, 4), 5000.0)]).astype(np.float32))
    return d


def _ok(proc, out: Path, count: int, kind: str) -> dict:
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    s = rep["validation"]["samples"]
    assert (s["count"], s["kind"], s["passed"], s["failed"]) == (count, kind, True, 0)
    assert len(s["errors"]) == count and s["max_abs_err"] < 1e-4
    assert f"{count}/{count} of" in proc.stderr  # the terminal line
    assert "Your samples" in (out / "report.html").read_text() and 'id="chart-samples"' in (out / "report.html").read_text()
    assert "**Samples**" in (out / "report.md").read_text()
    return s


def test_npz_arrays(data, tmp_path, cli):
    out = tmp_path / "o"
    s = _ok(cli("export", *MLP, "--samples", str(data / "x.npz"), "-o", str(out)), out, 20, "arrays")
    assert s["batch_size"] == 8 and s["metrics"]["task"] == "classifier" and s["metrics"]["top1_agreement"] == 1.0
    assert "and on 20 samples" in load_report(out)["summary"]


def test_npy_for_a_single_input_through_compare(data, tmp_path, cli):
    first = tmp_path / "first"
    assert onnxport.export(MLP[0], first, inputs=[MLP[2]], exporter="torchscript")["status"] == "ok"
    out = tmp_path / "o"
    proc = cli("compare", *MLP[:3], str(first / "model.onnx"), "--samples", str(data / "x.npy"), "-o", str(out))
    _ok(proc, out, 9, "arrays")


def test_txt_tokenized_with_a_tokenizer_folder(data, tmp_path, minilm_dir, cli):
    out = tmp_path / "o"
    proc = cli("export", *BAG, "--samples", str(data / "t.txt"), "--tokenizer", str(minilm_dir), "-o", str(out))
    s = _ok(proc, out, 3, "text")
    assert s["tokenizer"] == str(minilm_dir) and s["max_length"] == 32 and s["pairs"] == 0


def test_jsonl_pairs(data, tmp_path, minilm_dir, cli):
    out = tmp_path / "o"
    proc = cli("export", *BAG, "--samples", str(data / "p.jsonl"), "--tokenizer", str(minilm_dir), "-o", str(out))
    assert _ok(proc, out, 2, "text")["pairs"] == 2


def test_image_folder_with_a_preprocess_function(data, tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", *CNN, "--samples", str(data / "imgs"), "--preprocess", f"{SAMPLES}:preprocess",
                   "-o", str(out))
    s = _ok(proc, out, 10, "images")
    assert s["transform"] == f"--preprocess {SAMPLES}:preprocess" and s["metrics"]["topk_agreement"] == 1.0


def test_a_sample_outside_the_tolerance_fails_the_proof_by_its_index(data, tmp_path, cli):
    """The traced export kept the ordinary path; no generated case reaches the other, the user's data does."""
    out = tmp_path / "o"
    proc = cli("export", f"{SAMPLES}:BigValues", "-i", "x:float32[batch,4]", "--exporter", "torchscript",
                   "--samples", str(data / "big.npz"), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    rep = load_report(out)
    assert rep["status"] == "validation_failed" and all(c["passed"] for c in rep["validation"]["cases"])
    s = rep["validation"]["samples"]
    assert s["failing"] == [8, 9, 10, 11] and s["failures"][0]["index"] == 8
    diag = next(d for d in rep["diagnostics"] if d["code"] == "samples-failed")
    assert "4 of 12 samples" in diag["message"] and "sample 8" in diag["message"]
    assert (out / "model.unverified.onnx").exists() and not (out / "model.onnx").exists()
    assert "samples-failed" in proc.stderr and "sample 8" in proc.stderr


def test_a_variant_that_passes_generated_inputs_and_fails_the_samples_is_rejected(data, tmp_path, cli):
    """fp16 of a model whose outputs pass 65504 only on the user's large inputs."""
    first = tmp_path / "first"
    loud = (f"{SAMPLES}:Loud", "-i", "x:float32[batch,4]")
    assert onnxport.export(loud[0], first, inputs=[loud[2]], exporter="torchscript")["status"] == "ok"
    out = tmp_path / "o"
    proc = cli("optimize", *loud, str(first / "model.onnx"), "--variants", "fp16", "--samples",
                   str(data / "loud.npz"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = load_report(out)
    fp16 = next(v for v in rep["variants"] if v["name"] == "fp16")
    assert not fp16["passed"] and fp16["reason"].startswith(f"on the samples of {data / 'loud.npz'}")
    assert "samples outside atol" in fp16["reason"] and fp16["samples"]["failed"] == 2
    assert fp16["samples"]["first_failure"].startswith("sample 6")
    export = rep["variants"][0]
    assert export["passed"] and export["samples"]["passed"] and rep["best"]["name"] == "export"
    assert "on your samples" in (out / "report.html").read_text()


# --------------------------------------------------------------------------- bad samples


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad_samples")
    (d / "garbage.npz").write_text("not a zip archive")
    np.savez(d / "names.npz", y=np.zeros((3, 8), np.float32))
    np.savez(d / "dtype.npz", x=np.zeros((3, 8), np.int64))
    np.savez(d / "size.npz", x=np.zeros((3, 9), np.float32))
    np.savez(d / "range.npz", x=np.zeros((3, 4), np.float32), ids=np.zeros((3, 40), np.int64))
    (d / "t.txt").write_text("no tokenizer for me\n")
    (d / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    write_images(d / "imgs", 2)
    (d / "imgs" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    prior = d / "prior"
    prior.mkdir()
    (prior / "report.json").write_text('{"marker": "earlier run"}')
    return d


TWO = (f"{SAMPLES}:TwoInputs", "-i", "x:float32[batch,4]", "-i", "ids:int64[batch,seq]", "-d", "seq=2..16")
BAD = [
    ("file missing", [*MLP, "--samples", "{d}/missing.npz"], "missing.npz: not found"),
    ("file unreadable", [*MLP, "--samples", "{d}/garbage.npz"], "garbage.npz: cannot be read as .npz"),
    ("image Pillow cannot decode", [*CNN, "--samples", "{d}/imgs", "--preprocess", f"{SAMPLES}:preprocess"],
     "broken.jpg: Pillow cannot decode it"),
    ("array names", [*MLP, "--samples", "{d}/names.npz"], "holds arrays y; the model's inputs are x (missing: x)"),
    ("array dtype", [*MLP, "--samples", "{d}/dtype.npz"], "array 'x' is int64, the input is float32"),
    ("fixed size", [*MLP, "--samples", "{d}/size.npz"], "sample 0: 'x' axis 1 is 9, the model takes 8"),
    ("outside the declared range", [*TWO, "--samples", "{d}/range.npz"],
     "sample 0: 'ids' axis 1 ('seq') is 40, outside the declared 2..16"),
    ("texts without a tokenizer", [*MLP, "--samples", "{d}/t.txt"], "holds texts, and"),
    ("jsonl line not JSON", [*BAG, "--samples", "{d}/bad.jsonl", "--tokenizer", "{minilm}"],
     "line 2 is not valid JSON"),
    ("tokenizer without samples", [*MLP, "--tokenizer", "{d}"], "--tokenizer and --preprocess read --samples"),
]


@pytest.fixture(scope="module")
def answers(bad, minilm_dir, cli) -> dict:
    """Every bad case run once, each a process of its own that fails early (forked from one that did the CLI's
    imports: tests/fixtures/forked_cli.py)."""
    fill = {"{d}": str(bad), "{minilm}": str(minilm_dir)}
    return {name: cli("export", *[_fill(a, fill) for a in args], "-o", str(bad / f"out-{i}"), timeout=120)
            for i, (name, args, _) in enumerate(BAD)}


@pytest.mark.parametrize("name,args,words", BAD, ids=[c[0] for c in BAD])
def test_bad_samples_are_answered_in_one_line_and_write_nothing(bad, minilm_dir, answers, name, args, words):
    fill = {"{d}": str(bad), "{minilm}": str(minilm_dir)}
    proc = answers[name]
    out = bad / f"out-{[c[0] for c in BAD].index(name)}"
    assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Hint:" in lines[0], proc.stderr
    assert _fill(words, fill) in lines[0], lines[0]
    assert not out.exists()


def test_bad_samples_leave_earlier_results_alone_even_with_force(bad, cli):
    proc = cli("export", *MLP, "--samples", str(bad / "dtype.npz"), "-o", str(bad / "prior"), "--force")
    assert proc.returncode == 2 and "dtype.npz" in proc.stderr
    assert json.loads((bad / "prior" / "report.json").read_text()) == {"marker": "earlier run"}


def _fill(text: str, fill: dict[str, str]) -> str:
    for k, v in fill.items():
        text = text.replace(k, v)
    return text
