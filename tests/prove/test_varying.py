"""The task metrics on what varies between the inputs (prove/varying.py, issue 51): centred by PyTorch's mean."""

from __future__ import annotations

import numpy as np

from onnxport.core.records import FP32
from onnxport.prove.judging import WITHIN, Policy, RunResults, compare_accuracy, metrics_of, verdict
from onnxport.prove.varying import COSINE, RAW_TOP1, TOP1, centred

RNG = np.random.default_rng(0)
CONSTANT = np.linspace(-1.0, 1.0, 10) * 4  # one class wins for every input: the raw top-1 cannot tell
REF = CONSTANT + 0.05 * RNG.normal(size=(64, 10))
GATES = Policy(FP32, False, True, 0.99, 0.95, top1=True, fallback=True)


def _accuracy(ref: np.ndarray, got: np.ndarray):
    cases = [str(i) for i in range(0, len(ref), 8)]
    return compare_accuracy(RunResults.of(cases, [(got[i:i + 8],) for i in range(0, len(ref), 8)]),
                            RunResults.of(cases, [(ref[i:i + 8],) for i in range(0, len(ref), 8)]), None,
                            rows=True, top1=True)


def test_a_file_that_keeps_the_constant_and_loses_the_varying_part_is_rejected():
    wrong = CONSTANT + 0.05 * RNG.normal(size=REF.shape)  # right raw top-1, right raw cosine, wrong answers
    found = _accuracy(REF, wrong)
    assert found.top1 == 1.0 and found.cosine > 0.999  # what the raw gates saw
    v = found.varying
    assert v.cosine < 0.5 and v.top1 < 0.5 and RAW_TOP1 in v.cannot_tell and v.classes == 1
    judged = verdict(found, GATES)
    assert not judged.passed
    assert "cosine (centred)" in judged.reason and "top1_agreement (centred)" in judged.reason
    names = [m.name for m in judged.metrics]
    assert names[:2] == ["cosine", "top1_agreement"]  # the raw figures stay, beside the centred ones


def test_a_right_file_and_a_varying_reference_pass():
    right = REF + 1e-5 * RNG.normal(size=REF.shape)
    assert verdict(_accuracy(REF, right), GATES).passed
    trained = 3 * RNG.normal(size=(64, 10))
    found = _accuracy(trained, trained + 1e-3 * RNG.normal(size=trained.shape))
    assert found.varying.classes > 1 and not found.varying.cannot_tell
    assert verdict(found, GATES).passed


def test_a_reference_that_does_not_vary_cannot_tell_and_falls_back_to_elementwise():
    flat = np.tile(CONSTANT, (64, 1))
    v = centred([flat], [flat + 1e-2], FP32, top=True)
    assert v.cosine is None and v.top1 is None and {COSINE, TOP1} <= set(v.cannot_tell)
    judged = verdict(_accuracy(flat, flat + 1e-2), GATES)
    fallback = next(m for m in judged.metrics if m.name == WITHIN)
    assert not fallback.passed and not judged.passed and "cannot tell" in judged.reason
    assert verdict(_accuracy(flat, flat + 1e-7), GATES).passed  # the same values: what the fallback proves


def test_one_row_cannot_be_centred():
    v = centred([REF[:1]], [REF[:1]], FP32, top=True)
    assert v.cosine is None and "fewer than two" in v.cannot_tell[COSINE]


def test_metrics_without_fallback_leave_out_what_cannot_tell():
    flat = np.tile(CONSTANT, (16, 1))
    found = _accuracy(flat, flat)
    names = [m.name for m in metrics_of(found, Policy(FP32, False, True, 0.99, 0.95, top1=True))]
    assert names == ["cosine", "top1_agreement"]
