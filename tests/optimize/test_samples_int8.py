"""Static int8 calibrated on the user's samples: each calibration method on 70% of them, the one with the best task
metric on the held-out 30% kept; the default plan builds it for CNNs once samples are given."""

from __future__ import annotations

import pytest

from onnxport import optimize
from onnxport.api import export, load_model
from onnxport.optimize import quantize
from onnxport.optimize.plan import default_plan
from onnxport.prove import samples as proving
from onnxport.sources.datasets import read_samples
from tests.conftest import FIXTURES
from tests.fixtures.samples import write_images

CNN = f"{FIXTURES / 'samples.py'}:TinyCNN"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    d = tmp_path_factory.mktemp("cnn")
    loaded = load_model(CNN, inputs=["image:float32[batch,3,32,32]"], dims=["batch=1..8"])
    assert export(CNN, d / "m", inputs=["image:float32[batch,3,32,32]"], dims=["batch=1..8"],
                  exporter="torchscript")["status"] == "ok"
    write_images(d / "imgs", 12)
    samples = read_samples(d / "imgs", loaded, preprocess=f"{FIXTURES / 'samples.py'}:preprocess")
    return loaded, d / "m" / "model.onnx", proving.references(loaded, samples)


def test_the_plan_builds_static_int8_for_a_cnn_given_samples(cnn):
    loaded = cnn[0]
    assert "int8" not in default_plan(loaded, "cpu", []).build
    assert "int8" in default_plan(loaded, "cpu", [], calibrated=True).build


def test_calibration_method_chosen_on_held_out_samples(cnn, tmp_path):
    loaded, model, refs = cnn
    cal = quantize.calibrated_on_samples(loaded, model, tmp_path / "q.onnx", refs)
    assert (cal["calibrated_on"], cal["held_out"]) == (8, 4) and cal["samples"] == refs.samples.file
    scores = cal["held_out_metrics"]
    assert set(scores) == set(quantize.CALIBRATION_METHODS) and all("margin" in s for s in scores.values())
    assert scores[cal["method"]]["margin"] == max(s["margin"] for s in scores.values())
    assert (tmp_path / "q.onnx").exists()


def test_variants_are_judged_on_the_samples(cnn, tmp_path):
    loaded, model, refs = cnn
    res = optimize.variants(loaded, model, tmp_path,
                            optimize.VariantOptions(names=["int8"], bench_batches=(1,), bench_seconds=0.2), samples=refs)
    base, int8 = res.variants
    assert base.samples.passed and base.samples.count == 12 and not base.samples.metric_decides
    assert int8.details["calibration"]["method"] in quantize.CALIBRATION_METHODS
    names = {m.name for m in int8.samples.metrics}
    assert int8.samples.metric_decides and {"cosine", "top1_agreement"} <= names  # the raw figures stay
    agreement = int8.samples.agreement
    assert "cannot_tell" in agreement and "cosine_min_centred" in agreement  # and the centred ones beside them
    assert ("cosine (centred)" in names) == (agreement["cosine_min_centred"] is not None)
    sample_ok = all(m.passed for m in int8.samples.metrics)
    assert int8.passed == sample_ok  # the generated inputs' metric is reported, the samples' decides
    assert int8.to_dict()["samples"] == int8.samples.to_dict()
