"""Triton model repository (config.pbtxt + versioned model) and a KServe InferenceService manifest."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError
from .serve.models import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_DELAY_MS,
    Signature,
    TensorSpec,
    session_options_from_tuned,
)
from .serve.models import signature as read_signature


class _Enum(str):
    """A protobuf enum value: written without quotes in text format."""


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


def model_config(sig: Signature, name: str, *, max_batch: int = DEFAULT_MAX_BATCH,
                 max_delay_us: int = int(DEFAULT_MAX_DELAY_MS * 1000), instance_count: int = 1,
                 gpu: bool = False, session_options: dict | None = None,
                 warmup_sizes: dict[str, int] | None = None) -> dict:
    """Triton's model configuration for ``sig`` as a dict (Triton's JSON form of ``ModelConfig``).

    ``max_batch`` is the Triton ``max_batch_size``; it becomes 0 (no batch dim) for models whose first dim
    is not dynamic. ``warmup_sizes`` gives sizes for dynamic non-batch dims by symbol (default 1).
    """
    batch = max_batch if (sig.batchable and max_batch > 0) else 0
    options = session_options or {}
    config: dict = {
        "name": name, "platform": "onnxruntime_onnx", "backend": "onnxruntime", "max_batch_size": batch,
        "version_policy": {"latest": {"num_versions": 1}},
        "input": [_tensor(t, batch > 0) for t in sig.inputs],
        "output": [_tensor(t, batch > 0) for t in sig.outputs],
    }
    if batch > 1:
        preferred = [b for b in (2, 4, 8, 16, 32, 64, 128, 256) if b <= batch][-2:]
        config["dynamic_batching"] = {"preferred_batch_size": preferred, "max_queue_delay_microseconds": max_delay_us}
    config["instance_group"] = [{"count": instance_count, "kind": _Enum("KIND_GPU" if gpu else "KIND_CPU")}]
    params = {"intra_op_thread_count": options.get("threads") or 0,
              "inter_op_thread_count": options.get("inter_op_threads") or 0}
    if options.get("execution_mode"):
        params["execution_mode"] = 1 if options["execution_mode"] == "parallel" else 0
    config["parameters"] = {k: {"string_value": str(v)} for k, v in params.items()}
    if gpu:
        config["optimization"] = {"execution_accelerators": {"gpu_execution_accelerator": [{
            "name": "tensorrt",
            "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                           "trt_engine_cache_enable": "1"}}]}}
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


_MAPS = {"parameters", "inputs"}  # map<string, message> fields in ModelConfig


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
    body.pop("backend", None)  # platform says it; Triton rejects a platform/backend mismatch, not redundancy
    text = _pbtxt(body)
    notes = ["# Triton Inference Server model configuration written by onnxport.",
             "# Dims are per request row when max_batch_size > 0; -1 marks a dynamic dim."]
    if not any("KIND_GPU" in line for line in text):
        text += ["", "# On a GPU, replace instance_group above with:",
                 "# instance_group { count: 1 kind: KIND_GPU }",
                 "# and optionally let TensorRT run the model (onnxport triton --gpu writes this):",
                 '# optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }']
    return "\n".join(notes + text) + "\n"


def _dns_name(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63] or "model"


def inference_service(name: str, *, gpu: bool = False) -> str:
    """A KServe InferenceService manifest serving the repository with Triton (storageUri is a placeholder)."""
    resources = ('        limits:\n          cpu: "2"\n          memory: 2Gi' if not gpu else
                 '        limits:\n          cpu: "2"\n          memory: 4Gi\n          nvidia.com/gpu: "1"')
    return f"""# KServe InferenceService for the Triton model repository written by onnxport.
# Upload the repository folder (the one that holds {name}/) and set storageUri to it.
# Requests: POST /v2/models/{name}/infer (Open Inference Protocol v2).
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: {_dns_name(name)}
spec:
  predictor:
    model:
      modelFormat:
        name: onnx
      runtime: kserve-tritonserver
      protocolVersion: v2
      storageUri: s3://YOUR-BUCKET/PATH/TO/REPOSITORY  # placeholder: the repository root
      resources:
        requests:
          cpu: "1"
          memory: 1Gi
{resources}
"""


@dataclass(frozen=True)
class TritonRepository:
    """What :func:`triton_repository` wrote."""

    name: str
    repo_dir: Path
    model_dir: Path
    config_path: Path
    model_path: Path
    manifest_path: Path
    max_batch_size: int
    files: tuple[Path, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "repo_dir": str(self.repo_dir), "model_dir": str(self.model_dir),
                "config": str(self.config_path), "model": str(self.model_path),
                "manifest": str(self.manifest_path), "max_batch_size": self.max_batch_size,
                "files": [str(f) for f in self.files]}


def _read_out(path: Path) -> tuple[Path, str, dict, dict[str, int]]:
    """ONNX file, default name, session options and warmup sizes from an output folder or .onnx file."""
    if path.is_file():
        if path.suffix != ".onnx":
            raise UsageError(f"{path} is not an .onnx file", "pass an onnxport output folder or a .onnx file")
        return path, path.stem, {}, {}
    if not path.is_dir():
        raise UsageError(f"{path} does not exist", "pass an onnxport output folder or a .onnx file")
    onnx_path = path / "best.onnx" if (path / "best.onnx").is_file() else path / "model.onnx"
    if not onnx_path.is_file():
        raise UsageError(f"{path} holds no model.onnx", "run 'onnxport export' or 'onnxport convert' first")
    name, options, sizes = path.resolve().name, {}, {}
    if (path / "report.json").is_file():
        try:
            report = json.loads((path / "report.json").read_text(encoding="utf-8"))
        except ValueError as e:
            raise UsageError(f"{path / 'report.json'} is not valid JSON: {e}", "re-run onnxport export") from None
        model = report.get("model") or {}
        name = model.get("name") or name
        for symbol, rng in (model.get("dims") or {}).items():
            if isinstance(rng, dict) and isinstance(rng.get("export"), int):
                sizes[symbol] = rng["export"]
        bench = report.get("benchmark")
        if isinstance(bench, dict):
            options = session_options_from_tuned(bench.get("tuned"))
    return onnx_path, name, options, sizes


def triton_repository(out_or_onnx: str | Path, repo_dir: str | Path, *, name: str | None = None,
                      max_batch: int = DEFAULT_MAX_BATCH, max_delay_ms: float = DEFAULT_MAX_DELAY_MS,
                      instance_count: int = 1, gpu: bool = False, force: bool = False) -> TritonRepository:
    """Write ``REPO/<name>/config.pbtxt``, ``REPO/<name>/1/model.onnx`` (+ external data) and
    ``REPO/<name>/inferenceservice.yaml`` for an onnxport output folder or a .onnx file.

    An existing ``REPO/<name>`` is replaced only with ``force=True``. ``serve REPO`` serves the result.
    """
    from .export import external_data_files

    onnx_path, default_name, options, sizes = _read_out(Path(out_or_onnx))
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name or default_name).strip("_.") or "model"
    if max_batch < 0 or instance_count < 1 or max_delay_ms < 0:
        raise UsageError(f"max_batch={max_batch}, instances={instance_count}, max_delay_ms={max_delay_ms}",
                         "use max_batch >= 0 (0 = no batching), instances >= 1 and a delay >= 0")
    repo = Path(repo_dir)
    model_dir = repo / name
    if model_dir.exists():
        if not force:
            raise UsageError(f"{model_dir} already exists", "pass --force to replace it, or choose another --name")
        if not model_dir.is_dir():
            raise UsageError(f"{model_dir} exists and is not a folder", "remove it or choose another --name")
    sig = read_signature(onnx_path)
    config = model_config(sig, name, max_batch=max_batch, max_delay_us=int(max_delay_ms * 1000),
                          instance_count=instance_count, gpu=gpu, session_options=options, warmup_sizes=sizes)
    tmp = repo / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "1").mkdir(parents=True)
    try:
        shutil.copy2(onnx_path, tmp / "1" / "model.onnx")
        for data in external_data_files(onnx_path):
            if not data.is_file() or not data.resolve().is_relative_to(onnx_path.parent.resolve()):
                raise UsageError(f"{onnx_path.name} refers to external data {data} that is missing or outside "
                                 "its folder", "keep the external data files beside the .onnx file")
            target = tmp / "1" / data.relative_to(onnx_path.parent)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(data, target)
        (tmp / "config.pbtxt").write_text(config_pbtxt(config), encoding="utf-8")
        (tmp / "inferenceservice.yaml").write_text(inference_service(name, gpu=gpu), encoding="utf-8")
        if model_dir.exists():
            shutil.rmtree(model_dir)
        tmp.rename(model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = tuple(sorted(p for p in model_dir.rglob("*") if p.is_file()))
    return TritonRepository(name, repo, model_dir, model_dir / "config.pbtxt", model_dir / "1" / "model.onnx",
                            model_dir / "inferenceservice.yaml", config["max_batch_size"], files)
