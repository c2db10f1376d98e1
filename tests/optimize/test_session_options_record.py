"""A variant holds its session options as the :class:`~onnxport.runtime.SessionOptions` record; report.json
carries the same dict as before (keys, order, values), and reading it back gives the record again."""

from __future__ import annotations

import pytest

from onnxport.optimize.openvino import openvino_options
from onnxport.optimize.result import Variant
from onnxport.runtime import CPU, CUDA, TENSORRT, SessionOptions

TRT = SessionOptions(TENSORRT, trt_fp16_enable=True, trt_max_workspace_size=2 * 1024**3, trt_engine_cache_enable=True,
                     trt_engine_cache_path="tensorrt", trt_timing_cache_enable=True, trt_timing_cache_path="tensorrt",
                     use_tf32=False, trt_profile_min_shapes="x:1x8", trt_profile_opt_shapes="x:4x8",
                     trt_profile_max_shapes="x:16x8")
TRT_DICT = {"provider": TENSORRT, "trt_fp16_enable": True, "trt_max_workspace_size": 2 * 1024**3,
            "trt_engine_cache_enable": True, "trt_engine_cache_path": "tensorrt", "trt_timing_cache_enable": True,
            "trt_timing_cache_path": "tensorrt", "use_tf32": False, "trt_profile_min_shapes": "x:1x8",
            "trt_profile_opt_shapes": "x:4x8", "trt_profile_max_shapes": "x:16x8"}


@pytest.mark.parametrize("record, recorded, backend", [
    (SessionOptions.base("cpu"), {"provider": CPU}, "onnxruntime"),
    (SessionOptions.base("cuda"), {"provider": CUDA, "use_tf32": False}, "onnxruntime"),
    (SessionOptions(CUDA, use_tf32=True), {"provider": CUDA, "use_tf32": True}, "onnxruntime"),
    (SessionOptions(CUDA, use_tf32=False, enable_cuda_graph=True, io_binding=True, graph_per_shape=True),
     {"provider": CUDA, "use_tf32": False, "enable_cuda_graph": True, "io_binding": True, "graph_per_shape": True},
     "onnxruntime"),
    (TRT, TRT_DICT, "onnxruntime"),
    (openvino_options("bf16"), {"provider": "openvino", "inference_precision": "bf16", "performance_hint": "LATENCY"},
     "openvino"),
])
def test_a_variants_typed_options_round_trip_through_its_report_entry(record, recorded, backend):
    entry = Variant("v", "variants/v.onnx", True, session_options=record).to_dict()
    assert list(entry["session_options"].items()) == list(recorded.items())  # the same keys, order and values
    assert entry["backend"] == backend and list(entry)[-1] == "session_options"
    assert SessionOptions.from_dict(entry["session_options"]) == record


def test_a_variant_without_options_writes_none():
    entry = Variant("v", None, False).to_dict()
    assert "session_options" not in entry and entry["backend"] == "onnxruntime"


def test_the_benchmark_times_the_best_as_its_record_says(tmp_path):
    """bench's backends for the best: a file of its own under the device's defaults, its own session otherwise
    (labelled with the runtime its record names)."""
    from types import SimpleNamespace

    from onnxport import pipeline
    from onnxport.optimize.result import OptimizeResult

    def backends(best: Variant, device: str = "cpu"):
        run = SimpleNamespace(options=SimpleNamespace(bench=SimpleNamespace(onnx_files=())), source_file=None,
                              model_file=tmp_path / "model.onnx", out=tmp_path, device=device,
                              outcome=SimpleNamespace(optimized=OptimizeResult((best,), best, None, 1)))
        return pipeline._bench_backends(run)

    paths, extra = backends(Variant("fp16", "variants/fp16.onnx", True, session_options=SessionOptions.base("cpu")))
    assert paths["onnxruntime:best (fp16)"] == tmp_path / "best.onnx" and extra == []
    paths, extra = backends(Variant("export", "model.onnx", True, session_options=SessionOptions.base("cuda")), "cuda")
    assert list(paths) == ["onnxruntime"] and extra == []
    paths, (best,) = backends(Variant("openvino", "model.onnx", True, session_options=openvino_options("f32")))
    assert list(paths) == ["onnxruntime"] and best.name == "openvino:best (openvino)"
    _, (tf32,) = backends(Variant("tf32", "model.onnx", True, session_options=SessionOptions(CUDA, use_tf32=True)),
                          "cuda")
    assert tf32.name == "onnxruntime:best (tf32)" and tf32.path == tmp_path / "best.onnx"
