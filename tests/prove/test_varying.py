"""The task metrics on what varies between the inputs (prove/varying.py, issue 51): centred by PyTorch's mean."""

from __future__ import annotations

import numpy as np

from onnxport.core.records import FP32, Tolerance
from onnxport.prove.judging import (
    WITHIN,
    Accuracy,
    Policy,
    RunResults,
    compare_accuracy,
    metrics_of,
    token_agreement,
    varying_record,
    verdict,
)
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


TOKENS_EXACT = Policy(FP32, True, False, 0.99, 0.95, tokens=True, top1_name="greedy tokens equal", top1=True)
TOKENS_INT8 = Policy(FP32, False, True, 0.99, 0.95, top1_name="teacher-forced top-1", top1=True, fallback=True)


def test_one_token_for_every_prompt_cannot_tell_and_falls_back_to_the_logits():
    one = np.full((3, 8), 7)
    assert "token 7 at every step" in token_agreement(one, one).untold
    same_rows = np.tile(np.arange(8), (3, 1))
    assert "same 8 tokens for every one of the 3 prompts" in token_agreement(same_rows, same_rows).untold
    assert token_agreement(np.arange(24).reshape(3, 8), np.arange(24).reshape(3, 8)).untold is None
    logits = RNG.normal(size=(3, 5, 32))
    # the tokens agree (one token everywhere), the logits are off at their own scale: rejected, and it says why
    found = compare_accuracy(RunResults.of(["s"], [(logits + 5e-3,)]), RunResults.of(["s"], [(logits,)]),
                             Tolerance(1e-2, 1e-2))
    judged = verdict(found, TOKENS_EXACT, token_agreement(one, one))
    assert judged.passed  # within the given tolerance at the logits' scale: the fallback can tell, and holds
    found = compare_accuracy(RunResults.of(["s"], [(logits * 1e-3 + 1e-5,)]), RunResults.of(["s"], [(logits * 1e-3,)]),
                             FP32)
    assert found.within  # the raw tolerance lets an error of 1e-5 through on logits of 1e-3...
    judged = verdict(found, TOKENS_EXACT, token_agreement(one, one))
    assert not judged.passed and "greedy tokens cannot tell" in judged.reason  # ...their own scale does not
    assert any(m.name == WITHIN for m in judged.metrics)
    assert "greedy tokens" in varying_record(found.varying, token_agreement(one, one))["cannot_tell"]


def test_a_variant_judged_by_nothing_that_can_tell_is_not_passed():
    one = np.full((2, 4), 3)
    judged = verdict(Accuracy(2, cosine=1.0, top1=1.0), TOKENS_INT8, token_agreement(one, one))
    assert not judged.passed and "judged by nothing that can tell: greedy tokens" in judged.reason
    varied = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    assert verdict(Accuracy(2, cosine=1.0, top1=1.0), TOKENS_INT8, token_agreement(varied, varied)).passed
