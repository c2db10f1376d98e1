"""The one elementwise tolerance rule: |actual - expected| <= atol + rtol * |expected|."""

from __future__ import annotations

import numpy as np

from onnxport.core.records import Tolerance

TOL = Tolerance(atol=0.25, rtol=0.5)  # powers of two: the bounds below are exact in binary


def test_the_bound_itself_passes_and_just_above_fails():
    expected = np.array([0.0, 2.0, -2.0])
    bound = TOL.bound(expected)
    assert bound.tolist() == [0.25, 1.25, 1.25]  # rtol of |expected|: a negative reference is allowed as much
    at = expected + np.array([0.25, 1.25, -1.25])
    assert TOL.allows(at, expected).tolist() == [True, True, True]
    above = expected + np.nextafter(bound, np.inf) * np.array([1, -1, 1])
    assert TOL.allows(above, expected).tolist() == [False, False, False]


def test_rtol_is_relative_to_the_expected_value_not_the_actual_one():
    # |8 - 4| = 4: relative to the expected 4 the bound is 2.25 (fails); relative to the actual 8 it would be 4.25
    assert not TOL.allows(8.0, 4.0)
    assert TOL.allows(4.0, 8.0)  # the other way round: 4 <= 0.25 + 0.5 * 8
    assert TOL.within(4.0, 8.0) and not TOL.within(4.0, 4.0)


def test_nan_and_infinity_never_pass():
    nan, inf = float("nan"), float("inf")
    assert TOL.allows(np.array([nan, 1.0, nan, inf, inf]), np.array([1.0, nan, nan, inf, 1.0])).tolist() == [
        False, False, False, False, False]
    assert not TOL.within(nan, 1.0)
    assert not TOL.within(0.0, nan)  # a NaN reference allows nothing


def test_broadcasting_and_times():
    expected = np.array([[0.0], [4.0]])  # two rows against three columns
    actual = np.array([[0.5, 1.0, 5.0]])
    assert TOL.allows(actual, expected).tolist() == [[False, False, False], [False, False, True]]
    # ten times the bound: |1 - 0| <= 2.5, |5 - 0| > 2.5; against 4 every one is within 22.5
    assert TOL.allows(actual, expected, times=10).tolist() == [[True, True, False], [True, True, True]]


def test_a_float32_reference_gives_a_float32_bound():
    """The decoder and encoder-decoder step proofs compare a float64 error with the bound of their float32
    reference: the bound keeps the reference's dtype, as their inline rule did."""
    tol = Tolerance(atol=1e-4, rtol=1e-3)
    w = np.array([0.1, 3.0], np.float32)
    assert tol.bound(w).dtype == np.float32
    assert tol.bound(w.astype(np.float64)).dtype == np.float64
    error = np.abs(np.array([0.1, 3.0]) + 1e-4 - w)
    assert np.array_equal(tol.within(error, w), error <= tol.atol + tol.rtol * np.abs(w))
