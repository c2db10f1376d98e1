"""--samples on real-size models: MiniLM judged on 200 English sentences, resnet18's static int8 calibrated on
images. The measured figures are printed (pytest -s shows them)."""

from __future__ import annotations

import pytest

import onnxport
from onnxport import report
from onnxport.optimize.gates import TOP1_MIN
from onnxport.optimize.quantize import CALIBRATION_METHODS
from tests.conftest import FIXTURES
from tests.fixtures.samples import write_images

SENTENCES = FIXTURES / "data" / "sentences.txt"


def _variant(rep: dict, name: str) -> dict:
    return next(v for v in rep["variants"] if v["name"] == name)


def _on_samples(v: dict, metric: str) -> float:
    return next(m["value"] for m in v["samples"]["metrics"] if m["name"] == metric)


@pytest.mark.slow
def test_minilm_int8_is_judged_on_real_sentences(minilm_dir, tmp_path):
    """The int8 variant's embedding cosine on 200 sentences is reported beside its figure on random tokens; the
    task metric is judged on the sentences, and the winner is the fastest variant that passes there."""
    rep = onnxport.convert(f"hf:{minilm_dir}", tmp_path / "out", dims=["batch=1..8", "seq=1..64"],
                           samples=SENTENCES, variants=["int8"], bench={}, budget=45)
    report.validate(rep)
    s = rep["validation"]["samples"]
    assert (s["count"], s["kind"], s["passed"], s["batch_size"]) == (200, "text", True, 8)
    assert s["tokenizer"] == str(minilm_dir) and s["metrics"]["task"] == "sentence-embedding"
    assert s["metrics"]["cosine_min"] > 0.9999 and rep["status"] == "ok"
    int8 = _variant(rep, "int8")
    name = "cosine (mean-pooled embedding)"
    random_tokens, sentences = int8["metric"]["value"], _on_samples(int8, name)
    # README: plain dynamic int8 reaches 0.926 on the sentences (0.978 on random tokens) on an AVX2 CPU, 0.946
    # (0.988) with VNNI; the search within the budget only raises them. Far below is a broken quantization.
    assert int8["metric"]["name"] == name and 0.965 <= random_tokens < 1 and 0.91 <= sentences < 1
    assert 0.985 <= int8["samples"]["agreement"]["cosine_mean"] < 1
    assert int8["samples"]["metric_decides"] and int8["samples"]["count"] == 200
    assert int8["passed"] == (sentences >= 0.99 and int8["samples"]["passed"])
    if not int8["passed"]:
        assert "on the samples of" in int8["reason"] and rep["best"]["name"] == "export"
    best = rep["best"]["name"] if rep.get("best") else None
    print(f"\nMiniLM int8 cosine: sentences {sentences:.4f} (mean "
          f"{int8['samples']['agreement']['cosine_mean']:.4f}), random tokens {random_tokens:.4f}; "
          f"kept fp32: {len(int8['details'].get('sensitivity', {}).get('kept_fp32', []))}; best: {best}")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**Samples** 200/200" in md and "| int8 |" in md


@pytest.mark.slow
def test_resnet18_static_int8_calibrated_on_images(tmp_path):
    write_images(tmp_path / "imgs", 24, size=96)
    rep = onnxport.convert("torchvision:resnet18", tmp_path / "out", inputs=["image:float32[batch,3,224,224]"],
                           dims=["batch=1..4"], exporter="torchscript", samples=tmp_path / "imgs",
                           variants=["int8"], bench={})
    report.validate(rep)
    s = rep["validation"]["samples"]
    assert (s["count"], s["kind"], s["passed"]) == (24, "images", True) and s["crop"] == [224]
    assert s["metrics"]["top1_agreement"] == 1.0 and s["metrics"]["k"] == 5
    int8 = _variant(rep, "int8")
    cal = int8["details"]["calibration"]
    assert (cal["calibrated_on"], cal["held_out"]) == (17, 7) and cal["method"] in CALIBRATION_METHODS
    assert all("margin" in cal["held_out_metrics"][m] for m in CALIBRATION_METHODS)
    assert cal["held_out_metrics"][cal["method"]]["margin"] == max(
        cal["held_out_metrics"][m]["margin"] for m in CALIBRATION_METHODS)
    # README: top-1 agreement 1.000 on the images; one of the 24 flipping still passes the gate
    top1, top5 = _on_samples(int8, "top1_agreement"), int8["samples"]["agreement"]["topk_agreement"]
    assert TOP1_MIN <= top1 <= 1 and 0.9 <= top5 <= 1
    metrics = {m["name"]: m for m in int8["metrics"]}
    assert 0.75 <= metrics["top1_agreement"]["value"] <= 1  # raw top-1 on the generated inputs
    # random weights: PyTorch predicts one class for every generated input, so raw top-1 cannot tell; what varies
    # between the inputs (the centred gates) rejects this int8, which is then never the best
    assert int8["varying"]["cannot_tell"].get("top-1 (raw)", "").startswith("PyTorch predicts one class")
    assert metrics["top1_agreement (centred)"]["passed"] is int8["passed"] is False and rep["best"]["name"] != "int8"
    print(f"\nresnet18 int8 ({cal['method']} calibration, held-out margins "
          f"{ {m: cal['held_out_metrics'][m]['margin'] for m in CALIBRATION_METHODS} }): top-1 agreement on the "
          f"images {top1:.3f}, top-5 {int8['samples']['agreement']['topk_agreement']:.3f}; on generated inputs "
          f"{int8['metrics'][-1]['value']:.3f}; passed {int8['passed']}; best {rep['best']['name']}")
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="chart-samples"' in html and "on your samples" in html
