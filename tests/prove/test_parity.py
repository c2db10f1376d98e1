"""Unit tests for onnxport.parity.compare_arrays and the tolerance policy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxport.core.records import FP16, FP32, Tolerance
from onnxport.prove.compare import compare_arrays

TOL = Tolerance(atol=1e-3, rtol=1e-2)


def test_tolerance_presets():
    assert FP32.to_dict() == {"atol": 1e-4, "rtol": 1e-3}
    assert FP16.to_dict() == {"atol": 1e-2, "rtol": 1e-2}
    assert Tolerance() == FP32


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_exact_equality(dtype):
    a = np.array([[0.0, -1.5, 3.25], [1e4, -1e-6, 7.0]], dtype=dtype)
    assert compare_arrays(a, a.copy(), FP32) == (0.0, 0.0, True)


def test_within_atol_near_zero():
    ref = np.array([0.0, 0.0])
    got = np.array([5e-4, -9e-4])           # |diff| <= atol + rtol * 0
    abs_err, rel_err, ok = compare_arrays(ref, got, TOL)
    assert ok is True
    assert abs_err == pytest.approx(9e-4)
    assert rel_err == pytest.approx(9e-4 / 1e-3)   # relative to max(|ref|, atol)


def test_outside_atol_near_zero():
    abs_err, _, ok = compare_arrays(np.array([0.0]), np.array([1.1e-3]), TOL)
    assert ok is False
    assert abs_err == pytest.approx(1.1e-3)


def test_within_rtol_for_large_values():
    ref = np.array([1000.0, -1000.0])
    got = np.array([1010.0, -1010.0])        # diff 10 <= 1e-3 + 1e-2 * 1000 = 10.001
    abs_err, rel_err, ok = compare_arrays(ref, got, TOL)
    assert ok is True
    assert abs_err == pytest.approx(10.0)
    assert rel_err == pytest.approx(0.01)


def test_outside_rtol_for_large_values():
    abs_err, rel_err, ok = compare_arrays(np.array([1000.0]), np.array([1010.1]), TOL)
    assert ok is False
    assert abs_err == pytest.approx(10.1)
    assert rel_err == pytest.approx(0.0101)


def test_one_bad_element_fails_all():
    ref = np.zeros((4, 5), dtype=np.float32)
    got = ref.copy()
    got[2, 3] = 0.5
    abs_err, _, ok = compare_arrays(ref, got, FP32)
    assert ok is False
    assert abs_err == pytest.approx(0.5)


def test_rtol_uses_reference_not_output():
    # |got| is large but |ref| is 0: only atol applies
    _, _, ok = compare_arrays(np.array([0.0]), np.array([0.5]), Tolerance(atol=1e-3, rtol=10.0))
    assert ok is False


@pytest.mark.parametrize(("ref_shape", "got_shape"), [((2, 3), (3, 2)), ((2, 3), (2, 3, 1)), ((4,), (5,)),
                                                      ((), (1,))])
def test_shape_mismatch(ref_shape, got_shape):
    abs_err, rel_err, ok = compare_arrays(np.zeros(ref_shape), np.zeros(got_shape), FP32)
    assert ok is False
    assert math.isinf(abs_err) and abs_err > 0
    assert math.isinf(rel_err) and rel_err > 0


def test_shape_mismatch_for_integers():
    abs_err, _, ok = compare_arrays(np.zeros((2,), dtype=np.int64), np.zeros((3,), dtype=np.int64), FP32)
    assert (ok, math.isinf(abs_err)) == (False, True)


def test_nan_in_both_at_same_place_passes():
    ref = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    got = np.array([1.0, np.nan, 3.0 + 1e-6], dtype=np.float32)
    abs_err, rel_err, ok = compare_arrays(ref, got, FP32)
    assert ok is True
    assert math.isfinite(abs_err) and abs_err < 1e-5
    assert math.isfinite(rel_err)


def test_nan_at_different_places_fails():
    ref = np.array([np.nan, 1.0])
    got = np.array([1.0, np.nan])
    abs_err, _, ok = compare_arrays(ref, got, FP32)
    assert ok is False
    assert math.isinf(abs_err)


@pytest.mark.parametrize("where", ["ref", "got"])
def test_nan_in_one_fails(where):
    clean = np.array([1.0, 2.0, 3.0])
    dirty = clean.copy()
    dirty[1] = np.nan
    ref, got = (dirty, clean) if where == "ref" else (clean, dirty)
    abs_err, _, ok = compare_arrays(ref, got, FP32)
    assert ok is False
    assert math.isinf(abs_err)


# inf - inf in parity.compare_arrays emits a harmless RuntimeWarning (the result is masked afterwards)
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
def test_same_infinities_pass():
    ref = np.array([np.inf, -np.inf, 2.0])
    got = np.array([np.inf, -np.inf, 2.0])
    assert compare_arrays(ref, got, FP32) == (0.0, 0.0, True)


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
@pytest.mark.parametrize(("r", "g"), [(np.inf, -np.inf), (np.inf, 1e30), (-np.inf, 0.0), (5.0, np.inf)])
def test_different_infinities_fail(r, g):
    abs_err, _, ok = compare_arrays(np.array([r]), np.array([g]), FP32)
    assert ok is False
    assert math.isinf(abs_err)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8])
def test_integers_exact(dtype):
    ref = np.array([0, 1, 2, 100], dtype=dtype)
    assert compare_arrays(ref, ref.copy(), Tolerance(atol=10.0, rtol=10.0)) == (0.0, 0.0, True)
    got = ref.copy()
    got[2] = 3
    # even with a huge tolerance, integers must match exactly
    assert compare_arrays(ref, got, Tolerance(atol=10.0, rtol=10.0)) == (1.0, 1.0, False)


def test_integers_large_difference():
    ref = np.array([0, 0], dtype=np.int64)
    got = np.array([0, -7], dtype=np.int64)
    assert compare_arrays(ref, got, FP32) == (7.0, 7.0, False)


def test_bools_exact():
    ref = np.array([[True, False], [False, True]])
    assert compare_arrays(ref, ref.copy(), FP32) == (0.0, 0.0, True)
    got = ref.copy()
    got[0, 1] = True
    assert compare_arrays(ref, got, FP32) == (1.0, 1.0, False)


def test_empty_arrays_pass():
    assert compare_arrays(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), FP32) == (0.0, 0.0, True)
    assert compare_arrays(np.zeros((0,), np.int64), np.zeros((0,), np.int64), FP32) == (0.0, 0.0, True)


def test_mixed_precision_inputs():
    ref = np.array([1.0, 2.0], dtype=np.float32)
    got = np.array([1.0, 2.0005], dtype=np.float16)
    abs_err, _, ok = compare_arrays(ref, got, FP16)
    assert ok is True
    assert abs_err == pytest.approx(float(np.float16(2.0005)) - 2.0)
