"""Run, then judge: the one comparison and the one verdict every family's variants go through."""

from __future__ import annotations

import numpy as np
import pytest

from onnxport.core.records import FP16, FP32, CaseResult, Failure, ParityResult, Tolerance
from onnxport.prove.judging import (
    Accuracy,
    Policy,
    RunResults,
    compare_accuracy,
    cosine,
    run_cases,
    token_agreement,
    verdict,
)

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 5)).astype(np.float32)
B = RNG.standard_normal((2, 4)).astype(np.float32)


def _refs() -> RunResults:
    return RunResults.of(["one", "two"], [(A, B), (A * 2, B)])


def test_equal_runs_are_within_with_cosine_one_and_every_argmax_equal():
    got = run_cases(lambda feed: feed, [(A, B), (A * 2, B)], ["one", "two"])
    found = compare_accuracy(got, _refs(), FP32, top1=True)
    assert found.within and found.max_abs_err == 0.0 and found.cases == 2
    assert found.cosine == pytest.approx(1.0) and found.top1 == 1.0


def test_an_error_beyond_the_tolerance_names_the_case_and_the_error():
    got = RunResults.of(["one", "two"], [(A, B), (A * 2, B + 0.01)])
    found = compare_accuracy(got, _refs(), FP32)
    assert not found.within and found.outside == (("two", "max abs err 0.01"),)
    assert found.max_abs_err == pytest.approx(0.01, rel=1e-3)
    assert compare_accuracy(got, _refs(), FP16).within  # the same run within fp16's tolerance


def test_a_case_the_backend_fails_on_is_outside_failed_and_spoils_the_metrics():
    def run(feed):
        if feed is None:
            raise RuntimeError("no kernel for op Foo\nmore lines")
        return feed

    got = run_cases(run, [(A, B), None], ["one", "two"])
    assert got.outputs[1] is None and got.error(1) == "RuntimeError: no kernel for op Foo"
    found = compare_accuracy(got, _refs(), FP32, top1=True)
    assert found.failed == (("two", "RuntimeError: no kernel for op Foo"),)
    assert found.cosine is None and found.top1 is None and not found.within


def test_a_shape_change_is_outside_with_both_shapes():
    got = RunResults.of(["one", "two"], [(A, B), (A[:2], B)])
    found = compare_accuracy(got, _refs(), FP32)
    assert found.outside == (("two", "shape [2, 5] where PyTorch gives [3, 5]"),) and found.cosine is None


def test_row_cosine_and_top1_are_the_worst_row_and_the_share_of_equal_argmax():
    flipped = A.copy()
    flipped[0] = -flipped[0]  # one row of three pointing the other way
    got = RunResults.of(["one"], [(flipped,)])
    want = RunResults.of(["one"], [(A,)])
    found = compare_accuracy(got, want, None, rows=True, top1=True)
    assert found.cosine == pytest.approx(-1.0) and found.top1 == pytest.approx(2 / 3)
    assert found.within  # no tolerance asked: nothing is outside
    flat = compare_accuracy(got, want, None)
    assert flat.cosine == pytest.approx(cosine(flipped, A)) and -1 < flat.cosine < 1


def test_a_case_pytorch_failed_on_is_not_judged():
    want = RunResults.of(["one", "two"], [(A,), None])
    got = RunResults.of(["one", "two"], [(A,), None])
    assert compare_accuracy(got, want, FP32).outside == ()


def test_token_agreement_counts_steps_before_the_first_difference():
    want = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    got = want.copy()
    got[1, 2] = 0
    tokens = token_agreement(got, want)
    assert (tokens.steps, tokens.total, tokens.share, tokens.equal) == (2, 4, 7 / 8, False)
    assert token_agreement(want, want).equal
    short = token_agreement(want[:, :3], want)  # stopped short: the missing step differs
    assert short.steps == 3 and not short.equal


POLICY = Policy(FP32, elementwise=True, metric=False, cosine_min=0.99, top1_min=0.95)


def test_the_verdict_names_the_tolerance_the_cases_and_the_first():
    found = Accuracy(4, (("b", "max abs err 0.5"), ("c", "max abs err 0.1")), max_abs_err=0.5, cosine=0.999)
    judged = verdict(found, POLICY)
    assert not judged.passed
    assert judged.reason == ("outside the fp32 tolerance (atol 0.0001 / rtol 0.001) on 2 of 4 cases; "
                             "first 'b': max abs err 0.5")
    given = Policy(Tolerance(0.5, 0.5), True, False, 0.99, 0.95)
    assert "the given tolerance" in verdict(found, given).reason


def test_a_metric_policy_judges_the_gates_and_a_run_failure_only():
    quantized = Policy(FP32, elementwise=False, metric=True, cosine_min=0.99, top1_min=0.95,
                       cosine_name="logit cosine", top1_name="teacher-forced top-1", top1=True)
    close = Accuracy(4, (("b", "max abs err 0.5"),), max_abs_err=0.5, cosine=0.995, top1=0.97)
    assert verdict(close, quantized).passed  # elementwise errors are int8's to have
    low = Accuracy(4, cosine=0.95, top1=0.5)
    judged = verdict(low, quantized)
    assert judged.reasons == ("logit cosine 0.9500 below 0.99", "teacher-forced top-1 0.5000 below 0.95")
    assert [m.to_dict()["passed"] for m in judged.metrics] == [False, False] and judged.headline.name == "logit cosine"
    broken = Accuracy(4, (("a", "RuntimeError: x"),), (("a", "RuntimeError: x"),))
    assert verdict(broken, quantized).reasons == ("logit cosine n/a below 0.99", "teacher-forced top-1 n/a below 0.95",
                                                  "RuntimeError: x")


def test_greedy_tokens_decide_where_the_policy_says_so():
    exact = Policy(FP32, True, False, 0.99, 0.95, tokens=True)
    within = Accuracy(2, cosine=1.0)
    varied = np.array([[1, 2, 3]])
    assert verdict(within, exact, token_agreement(varied, varied)).passed
    differs = verdict(within, exact, token_agreement(np.array([[1, 2, 0]]), np.array([[1, 2, 3]])))
    assert differs.reason == "greedy tokens differ from PyTorch's at step 2 of 3"


def _case(label: str, passed: bool, failure: Failure | None = None) -> CaseResult:
    return CaseResult(label, {}, "random", 0.0 if passed else 1.0, 0.0, passed,
                      None if passed else "onnxruntime fails: no kernel", failure=failure)


def test_the_plain_parity_result_is_the_same_finding():
    result = ParityResult(False, FP32, (_case("batch 1", True), _case("max", False, Failure.ORT_RUN)))
    found = Accuracy.of_parity(result)
    assert found.outside == found.failed == (("max", "onnxruntime fails: no kernel"),) and found.cases == 2


def test_a_parity_that_cannot_tell_never_passes_an_elementwise_policy():
    """Every case within, yet the outputs cannot tell a right file from a wrong one: not proven."""
    result = ParityResult(False, FP32, (_case("batch 1", True),), cannot_tell={"logits": "constant"})
    found = Accuracy.of_parity(result)
    judged = verdict(found, POLICY)
    assert not found.within and not judged.passed and "logits: constant" in judged.reason
    assert verdict(Accuracy.of_parity(ParityResult(True, FP32, (_case("batch 1", True),))), POLICY).passed


def test_non_finite_outputs_never_pass_a_cosine_gate():
    nan = A.copy()
    nan[0, 0] = np.nan
    assert cosine(nan, A) == -1.0 and cosine(A * np.inf, A) == -1.0
    first_bad = compare_accuracy(RunResults.of(["one", "two"], [(nan,), (A,)]), RunResults.of(["one", "two"], [(A,), (A,)]),
                                 FP32)
    last_bad = compare_accuracy(RunResults.of(["one", "two"], [(A,), (nan,)]), RunResults.of(["one", "two"], [(A,), (A,)]),
                                FP32)
    assert first_bad.cosine == last_bad.cosine == -1.0  # whichever case holds the NaN
    assert [label for label, _ in first_bad.outside] == ["one"] and [label for label, _ in last_bad.outside] == ["two"]
