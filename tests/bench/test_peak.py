"""The GEMM peak: measured once, then read from its cache file."""

from __future__ import annotations

import json

import pytest

from onnxport.bench import gemm_peak, peak, peak_key


def test_peak_is_measured_once_then_cached(tmp_path, monkeypatch):
    cache = tmp_path / "sub" / "peak.json"
    first = gemm_peak(1, cache_file=cache, size=64, repeats=1)
    assert first["cached"] is False and first["gflops"] > 0 and cache.is_file()
    stored = json.loads(cache.read_text())
    assert list(stored) == [peak_key(1)]
    monkeypatch.setattr(peak, "measure_gemm", lambda *a, **k: pytest.fail("measured again"))
    second = gemm_peak(1, cache_file=cache, size=64, repeats=1)
    assert second["cached"] is True and second["gflops"] == first["gflops"]
    calls = []
    monkeypatch.setattr(peak, "measure_gemm", lambda t, s, r: calls.append(t) or {"gflops": 1.0})
    assert gemm_peak(1, cache_file=cache, refresh=True)["gflops"] == 1.0 and calls == [1]
    cache.write_text("not json")  # a corrupt cache is measured anew, not an error
    assert gemm_peak(1, cache_file=cache)["cached"] is False
