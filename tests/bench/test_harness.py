"""The timing harness: statistics and the interleaved order (synthetic timings, nothing asserted on wall time)."""

from __future__ import annotations

import math

import pytest

from onnxport.bench import interleave, stats
from onnxport.core.errors import UsageError


def test_stats_exact_on_synthetic_timings():
    times = [i / 1000 for i in range(10, 0, -1)]  # 10 ms .. 1 ms, unordered on purpose
    s = stats(times, batch=4)
    assert s["p50_ms"] == pytest.approx(5.5)
    assert s["p90_ms"] == pytest.approx(9.1)  # linear: rank 0.9 * 9 = 8.1 between 9 and 10 ms
    assert s["p99_ms"] == pytest.approx(9.91)
    assert s["mean_ms"] == pytest.approx(5.5)
    assert s["std_ms"] == pytest.approx(math.sqrt(8.25))  # population std of 1..10
    assert s["min_ms"] == pytest.approx(1.0) and s["max_ms"] == pytest.approx(10.0)
    assert s["runs"] == 10
    assert s["throughput"] == pytest.approx(4 / 0.0055)


def test_stats_single_and_empty():
    s = stats([0.002], batch=1)
    assert s["p50_ms"] == s["p99_ms"] == pytest.approx(2.0) and s["std_ms"] == 0.0
    assert s["throughput"] == pytest.approx(500.0)
    with pytest.raises(UsageError):
        stats([], batch=1)


def test_interleave_rotates_every_round():
    names = ["pytorch", "onnxruntime", "openvino"]
    rounds = [interleave(names, r) for r in range(4)]
    assert rounds == [["pytorch", "onnxruntime", "openvino"], ["onnxruntime", "openvino", "pytorch"],
                      ["openvino", "pytorch", "onnxruntime"], ["pytorch", "onnxruntime", "openvino"]]
    for i in range(len(names)):  # over a full cycle every backend takes every position once
        assert sorted(r[i] for r in rounds[:3]) == sorted(names)
    assert interleave([], 3) == []
