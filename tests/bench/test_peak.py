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


def test_gpu_peak_is_cached_per_device_name_beside_the_cpu_peak(tmp_path, monkeypatch):
    cache = tmp_path / "peak.json"
    calls = []
    measured = {"gflops": 51000.0, "by_precision": {"fp32": 51000.0, "tf32": 380000.0, "fp16": 700000.0}}
    monkeypatch.setattr(peak, "measure_gpu_gemm", lambda size, repeats: calls.append(size) or dict(measured))
    first = peak.gpu_peak("NVIDIA H100 80GB HBM3", cache_file=cache, size=256)
    again = peak.gpu_peak("NVIDIA H100 80GB HBM3", cache_file=cache, size=256)
    other = peak.gpu_peak("NVIDIA H200", cache_file=cache, size=256)
    assert calls == [256, 256] and first["cached"] is False and again["cached"] is True and not other["cached"]
    assert again["by_precision"] == measured["by_precision"]
    cache_keys = json.loads(cache.read_text())
    assert set(cache_keys) == {peak.gpu_peak_key("NVIDIA H100 80GB HBM3"), peak.gpu_peak_key("NVIDIA H200")}


def test_the_percentage_of_peak_is_of_the_device_and_precision_it_runs_in(tmp_path, monkeypatch):
    gpu = {"gflops": 50000.0, "by_precision": {"fp32": 50000.0, "tf32": 400000.0, "fp16": 800000.0}}
    monkeypatch.setattr(peak, "gpu_peak", lambda **k: dict(gpu))
    monkeypatch.setattr(peak, "gemm_peak", lambda threads, **k: {"gflops": 100.0, "threads": threads})
    assert peak.device_peak("cuda", 2)["by_precision"]["fp16"] == 800000.0
    assert peak.device_peak("cpu", 2) == {"gflops": 100.0, "threads": 2}
    chosen = {b: peak.peak_gflops(gpu, b) for b in ("pytorch", "onnxruntime", "onnxruntime:best (fp16)",
                                                    "onnxruntime:best (tensorrt)", "onnxruntime:tf32")}
    assert chosen == {"pytorch": 50000.0, "onnxruntime": 50000.0, "onnxruntime:best (fp16)": 800000.0,
                      "onnxruntime:best (tensorrt)": 800000.0, "onnxruntime:tf32": 400000.0}
    assert peak.peak_gflops({"gflops": 100.0}, "onnxruntime:best (fp16)") == 100.0  # a CPU: one fp32 peak
    assert peak.peak_gflops(None, "pytorch") is None


def test_int8_and_bf16_are_set_against_their_own_peak():
    cpu = {"gflops": 100.0, "by_precision": {"fp32": 100.0, "int8": 400.0, "bf16": 200.0}}
    assert peak.peak_gflops(cpu, "onnxruntime:best (fused+int8)") == 400.0
    assert peak.peak_gflops(cpu, "onnxruntime:best (openvino-bf16)") == 200.0
    assert peak.peak_gflops(cpu, "onnxruntime") == 100.0
    assert peak.peak_gflops(cpu, "openvino", cpu_flags=["avx512_bf16"]) == 200.0  # OpenVINO's default there: bf16
    assert peak.peak_gflops(cpu, "openvino", cpu_flags=["avx2"]) == 100.0
    old = {"gflops": 100.0}  # a peak measured before the int8/bf16 ones: no percentage rather than a wrong one
    assert peak.peak_gflops(old, "onnxruntime:best (int8)") is None
    assert peak.backend_precision("onnxruntime:best (openvino-int8)") == "int8"


def test_the_int8_and_bf16_peaks_are_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(peak, "measure_int8_gemm", lambda t, s, r: 7.0)
    monkeypatch.setattr(peak, "measure_bf16_gemm", lambda t, s, r: 5.0)
    got = gemm_peak(1, cache_file=tmp_path / "peak.json", size=64, repeats=1)
    assert got["by_precision"]["int8"] == 7.0 and got["by_precision"]["bf16"] == 5.0
    assert got["by_precision"]["fp32"] == got["gflops"]
    (tmp_path / "old.json").write_text(json.dumps({peak_key(1): {"gflops": 3.0}}))  # no by_precision: measured anew
    assert "by_precision" in gemm_peak(1, cache_file=tmp_path / "old.json", size=64, repeats=1)


def test_int8_and_bf16_kernels_run():
    assert peak.measure_int8_gemm(1, 64, 1) > 0 and peak.measure_bf16_gemm(1, 64, 1) > 0
