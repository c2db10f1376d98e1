"""Triton model configuration (config.pbtxt) from a served signature: the server answers /config with it and
the Triton repository writer saves it."""

from __future__ import annotations

import json

from onnxport.families.serving import TritonEnum
from onnxport.runtime.sessions import CUDA, TENSORRT, OrtOptions
from onnxport.runtime.variant_sessions import SessionOptions, is_openvino
from onnxport.serve.models import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_DELAY_MS,
    Signature,
    TensorSpec,
)

_Enum = TritonEnum  # a protobuf enum value: written without quotes in text format


_MAPS = {"parameters", "inputs"}  # map<string, message> fields in ModelConfig
_TRT_DEFAULT = {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                                                   "trt_engine_cache_enable": "1"}}
_TRT_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes", "trt_timing_cache_enable")



def triton_type(spec: TensorSpec) -> str:
    """Triton's data_type for a tensor ("TYPE_FP32", "TYPE_INT64", ...)."""
    datatype = spec.datatype
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _dims(spec: TensorSpec, batched: bool) -> list[int]:
    dims = spec.oip_shape() or [-1]
    return dims[1:] if batched else dims


def _tensor(spec: TensorSpec, batched: bool) -> dict:
    dims = _dims(spec, batched)
    entry: dict = {"name": spec.name, "data_type": _Enum(triton_type(spec)), "dims": dims or [1]}
    if not dims:  # a [batch] tensor: Triton wants dims [1] reshaped to a scalar per row
        entry["reshape"] = {"shape": []}
    return entry


def gpu_accelerators(variant_options: SessionOptions | None) -> list[dict]:
    """Triton onnxruntime backend ``gpu_execution_accelerator`` entries reproducing the best variant's session
    options (report ``best.session_options``): TensorRT with fp16 and its profile shapes when the best ran
    under TensorRT; the CUDA provider's ``use_tf32`` (off unless the best is ``tf32``: onnxport proves fp32
    with it off), ``enable_cuda_graph``, ``prefer_nhwc`` and ``sdpa_kernel``. Without recorded GPU options: TensorRT in FP16 (not proven)."""
    options = variant_options
    if options is None or options.provider not in (CUDA, TENSORRT):
        return [_TRT_DEFAULT]
    accel = []
    if options.provider == TENSORRT:
        workspace = options.trt_max_workspace_size
        params = {"precision_mode": "FP16" if options.trt_fp16_enable else "FP32",
                  "max_workspace_size_bytes": str(1073741824 if workspace is None else workspace),
                  "trt_engine_cache_enable": "1"}
        set_keys = {k: v for k in _TRT_KEYS if (v := getattr(options, k)) is not None}
        params.update({k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in set_keys.items()})
        accel.append({"name": "tensorrt", "parameters": params})
    cuda = {"use_tf32": "1" if options.use_tf32 else "0"}
    if options.enable_cuda_graph:
        cuda["enable_cuda_graph"] = "1"
    if options.prefer_nhwc:  # fp16-nhwc
        cuda["prefer_nhwc"] = "1"
    if options.sdpa_kernel is not None:  # fp16-sdpa
        cuda["sdpa_kernel"] = str(int(options.sdpa_kernel))
    accel.append({"name": "cuda", "parameters": cuda})
    return accel


def openvino_parameters(variant_options: SessionOptions, threads: int | None = None) -> dict:
    """Triton OpenVINO backend parameters reproducing an OpenVINO variant's session options (report
    ``best.session_options``): its inference precision (OpenVINO's own default on a bf16 CPU is bf16, so it is
    always written), its performance hint and, when tuned, its thread count (OpenVINO property names)."""
    params = {"INFERENCE_PRECISION_HINT": variant_options.inference_precision or "f32",
              "PERFORMANCE_HINT": variant_options.performance_hint or "LATENCY"}
    if threads:
        params["INFERENCE_NUM_THREADS"] = int(threads)
    return params


def model_config(sig: Signature, name: str, *, max_batch: int = DEFAULT_MAX_BATCH,
                 max_delay_us: int = int(DEFAULT_MAX_DELAY_MS * 1000), instance_count: int = 1,
                 gpu: bool = False, tuned: OrtOptions | None = None, warmup_sizes: dict[str, int] | None = None,
                 variant_options: SessionOptions | None = None) -> dict:
    """Triton's model configuration for ``sig`` as a dict (Triton's JSON form of ``ModelConfig``).

    ``max_batch`` is the Triton ``max_batch_size``; it becomes 0 (no batch dim) for models whose first dim
    is not dynamic. ``warmup_sizes`` gives sizes for dynamic non-batch dims by symbol (default 1).
    ``variant_options``: the best variant's session options (report ``best.session_options``), reproduced on
    a GPU (:func:`gpu_accelerators`); a CUDA graph replays the shapes it captured, so dynamic batching is off.
    ``tuned``: the ONNX Runtime options to write as parameters (thread counts, and the execution mode when it
    is given; None: ONNX Runtime's defaults).
    """
    batch = max_batch if (sig.batchable and max_batch > 0) else 0
    options = tuned if tuned is not None else OrtOptions.unset()
    openvino = not gpu and is_openvino(variant_options)
    config: dict = {
        "name": name, "platform": "onnxruntime_onnx", "backend": "onnxruntime", "max_batch_size": batch,
        "version_policy": {"latest": {"num_versions": 1}},
        "input": [_tensor(t, batch > 0) for t in sig.inputs],
        "output": [_tensor(t, batch > 0) for t in sig.outputs],
    }
    if openvino:  # Triton's OpenVINO backend reads model.onnx itself
        del config["platform"]
        config.update(backend="openvino", default_model_filename="model.onnx")
    graph = gpu and variant_options is not None and bool(variant_options.enable_cuda_graph)
    if batch > 1 and not graph:
        preferred = [b for b in (2, 4, 8, 16, 32, 64, 128, 256) if b <= batch][-2:]
        config["dynamic_batching"] = {"preferred_batch_size": preferred, "max_queue_delay_microseconds": max_delay_us}
    config["instance_group"] = [{"count": instance_count, "kind": _Enum("KIND_GPU" if gpu else "KIND_CPU")}]
    params = {"intra_op_thread_count": options.intra_op_num_threads or 0,
              "inter_op_thread_count": options.inter_op_num_threads or 0}
    if openvino and variant_options is not None:
        params = openvino_parameters(variant_options, options.intra_op_num_threads)
    elif options.execution_mode:
        params["execution_mode"] = 1 if options.execution_mode == "parallel" else 0
    config["parameters"] = {k: {"string_value": str(v)} for k, v in params.items()}
    if gpu:
        config["optimization"] = {"execution_accelerators": {
            "gpu_execution_accelerator": gpu_accelerators(variant_options)}}
    warm_inputs = {}
    for t in sig.inputs:
        dims = [d if isinstance(d, int) and d >= 0 else (warmup_sizes or {}).get(str(d), 1)
                for d in (t.shape or [1])][1 if batch > 0 else 0:]
        float_type = t.datatype in ("FP16", "FP32", "FP64", "BF16")
        warm_inputs[t.name] = {"data_type": _Enum(triton_type(t)), "dims": dims,
                               ("random_data" if float_type else "zero_data"): True}
    config["model_warmup"] = [{"name": "onnxport_warmup", "batch_size": 1,
                               "inputs": warm_inputs}]
    return config


def _scalar(value: object) -> str:
    if isinstance(value, _Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def _pbtxt(data: dict, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for key, value in data.items():
        if key in _MAPS and isinstance(value, dict):
            for k, v in value.items():
                entry = ([f"{pad}  value {{", *_pbtxt(v, indent + 2), f"{pad}  }}"] if isinstance(v, dict)
                         else [f"{pad}  value: {_scalar(v)}"])  # map<string, string>
                lines += [f"{pad}{key} {{", f"{pad}  key: {json.dumps(k)}", *entry, f"{pad}}}"]
        elif isinstance(value, dict):
            lines += [f"{pad}{key} {{", *_pbtxt(value, indent + 1), f"{pad}}}"]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for v in value:
                lines += [f"{pad}{key} {{", *_pbtxt(v, indent + 1), f"{pad}}}"]
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return lines


def config_pbtxt(config: dict) -> str:
    """Render a :func:`model_config` dict as Triton's config.pbtxt (protobuf text format), with comments."""
    body = dict(config)
    if "platform" in body:
        body.pop("backend", None)  # platform says it; Triton rejects a platform/backend mismatch, not redundancy
    text = _pbtxt(body)
    notes = ["# Triton Inference Server model configuration written by onnxport.",
             "# Dims are per request row when max_batch_size > 0; -1 marks a dynamic dim."]
    if body.get("backend") == "openvino":
        notes += ["# best.onnx was proven and timed on OpenVINO (report best.session_options): Triton's OpenVINO",
                  "# backend runs it at the same inference precision. For the onnxruntime backend instead, replace",
                  '# backend and default_model_filename with platform: "onnxruntime_onnx" and drop the parameters',
                  "# (ONNX Runtime runs the same file, but onnxport proved and timed this variant on OpenVINO)."]
    if any("enable_cuda_graph" in line for line in text):
        notes += ["# enable_cuda_graph: ONNX Runtime captures one CUDA graph per session at the first input shapes",
                  "# it runs and replays it: send requests of those shapes only (dynamic batching is off), or",
                  "# remove the parameter for dynamic shapes."]
    if not any("KIND_GPU" in line for line in text) and body.get("backend") != "openvino":
        text += ["", "# On a GPU, replace instance_group above with:",
                 "# instance_group { count: 1 kind: KIND_GPU }",
                 "# and optionally let TensorRT run the model (onnxport triton --gpu writes this):",
                 '# optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }']
    return "\n".join(notes + text) + "\n"


def family_config_pbtxt(config: dict, notes: tuple[str, ...] = ()) -> str:
    """Render a family's python-backend config (:attr:`onnxport.families.serving.RepositoryEntry.config`) as
    config.pbtxt, after its comment lines ``notes``."""
    return "\n".join([*notes, *_pbtxt(config)]) + "\n"
