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
    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", "avx2,avx512_bf16")
    got = gemm_peak(1, cache_file=tmp_path / "peak.json", size=64, repeats=1)
    assert got["by_precision"]["int8"] == 7.0 and got["by_precision"]["bf16"] == 5.0
    assert got["by_precision"]["fp32"] == got["gflops"]
    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", "avx2,fma")  # no native bf16: no bf16 peak, never a converted one
    got = gemm_peak(1, cache_file=tmp_path / "plain.json", size=64, repeats=1)
    assert got["by_precision"]["bf16"] is None and "no native bf16" in got["precision_methods"]["bf16"]
    assert peak.peak_gflops(got, "onnxruntime:best (openvino-bf16)") is None
    (tmp_path / "old.json").write_text(json.dumps({peak_key(1): {"gflops": 3.0}}))  # no by_precision: measured anew
    assert "by_precision" in gemm_peak(1, cache_file=tmp_path / "old.json", size=64, repeats=1)


def test_int8_and_bf16_kernels_run():
    assert peak.measure_int8_gemm(1, 64, 1) > 0 and peak.measure_bf16_gemm(1, 64, 1) > 0


def test_the_default_peak_is_a_matter_of_seconds():
    """The default measurement (fp32, int8 and where native, bf16) on this CPU stays short."""
    got = peak.measure_gemm(2)
    assert got["size"] == peak.PEAK_SIZE == 1024 and got["seconds"] < 20, got


def test_an_unusable_cache_is_a_warning_not_a_silent_remeasurement(tmp_path, monkeypatch):
    monkeypatch.setattr(peak, "measure_gemm", lambda *a, **k: {"gflops": 2.0})
    (tmp_path / "file").write_text("x")
    got = gemm_peak(1, cache_file=tmp_path / "file" / "peak.json")  # its folder is a file: nothing can be kept
    assert got["gflops"] == 2.0 and got["cached"] is False
    assert "cannot create the cache folder" in got["cache_warning"] and "ONNXPORT_CACHE_DIR" in got["cache_warning"]
    assert "cache_warning" not in gemm_peak(1, cache_file=tmp_path / "ok" / "peak.json")


def test_a_slow_precision_is_not_timed_over_and_over():
    """A GEMM slower than PEAK_SECONDS_MAX (no native kernel) is timed once: Ctrl-C acts between calls."""
    import time

    calls = []
    assert peak._time_best(lambda: calls.append(1) or time.sleep(peak.PEAK_SECONDS_MAX + 0.05), 5) > 1.0
    assert len(calls) == 1
