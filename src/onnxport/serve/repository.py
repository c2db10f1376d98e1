"""Triton model repository (config.pbtxt + versioned model) and a KServe InferenceService manifest: what
``onnxport triton`` writes (the public entry :func:`triton_repository`, also importable as
``onnxport.deploy.triton_repository``)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxport import families
from onnxport.core.errors import UsageError
from onnxport.core.onnxfile import external_data_files
from onnxport.runtime.sessions import OrtOptions
from onnxport.runtime.variant_sessions import SessionOptions, without_cuda_graph
from onnxport.serve.models import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_DELAY_MS,
    MAX_NAME,
    check_family_files,
    component_folders,
    read_report,
    served_file,
    tuned_options,
)
from onnxport.serve.models import signature as read_signature
from onnxport.serve.triton import config_pbtxt, family_config_pbtxt, model_config
from onnxport.serve.triton_env import ModelEnvironment, check, model_environment


def _dns_name(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63] or "model"


def inference_service(name: str, *, gpu: bool = False, model_format: str = "onnx") -> str:
    """A KServe InferenceService manifest serving the repository with Triton (storageUri is a placeholder);
    ``model_format`` "triton" for a python-backend model."""
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
        name: {model_format}
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
    environment: ModelEnvironment | None = None  # a python-backend model's: the versions its environment needs
    warnings: tuple[str, ...] = ()  # why that environment cannot work (triton_env.check)

    def to_dict(self) -> dict:
        out = {"name": self.name, "repo_dir": str(self.repo_dir), "model_dir": str(self.model_dir),
               "config": str(self.config_path), "model": str(self.model_path),
               "manifest": str(self.manifest_path), "max_batch_size": self.max_batch_size,
               "files": [str(f) for f in self.files]}
        if self.environment is not None:
            out["requirements"] = self.environment.requirements()
            out["warnings"] = list(self.warnings)
        return out


def _read_out(path: Path) -> tuple[Path, str, OrtOptions | None, dict[str, int], SessionOptions | None]:
    """ONNX file, default name, tuned ONNX Runtime options (report ``benchmark.tuned``; None: none), warmup
    sizes and the best variant's session options (report ``best.session_options``) from an output folder or
    .onnx file."""
    if path.is_file():
        if path.suffix != ".onnx":
            raise UsageError(f"{path} is not an .onnx file", "pass an onnxport output folder or a .onnx file")
        return path, path.stem, None, {}, None
    if not path.is_dir():
        raise UsageError(f"{path} does not exist", "pass an onnxport output folder or a .onnx file")
    report = read_report(path) or {}
    onnx_path = served_file(path, report)
    if onnx_path is None:
        check_family_files(path)  # a family's files, some there: the missing ones named
        raise UsageError(f"{path} holds no model.onnx", "run 'onnxport export' or 'onnxport convert' first")
    name, sizes = path.resolve().name, {}
    tuned: OrtOptions | None = None
    variant: SessionOptions | None = None
    if report:
        model = report.get("model") or {}
        name = model.get("name") or name
        for symbol, rng in (model.get("dims") or {}).items():
            if isinstance(rng, dict) and isinstance(rng.get("export"), int):
                sizes[symbol] = rng["export"]
        tuned = tuned_options(report)
        best = report.get("best")
        if onnx_path.name == "best.onnx" and isinstance(best, dict) and isinstance(best.get("session_options"), dict):
            variant = SessionOptions.from_dict(best["session_options"])
    return onnx_path, name, tuned, sizes, variant


def triton_repositories(out_or_onnx: str | Path, repo_dir: str | Path, *, name: str | None = None,
                        **options: Any) -> list[TritonRepository]:
    """What :func:`triton_repository` writes, one entry per model: an output folder made of several models
    (report.json's ``components``: a diffusion pipeline) writes one entry per component, named after it
    (``name``: their prefix, ``{name}_{component}``); any other source, its one entry."""
    path = Path(out_or_onnx)
    made = next((p for p in reversed((Path(repo_dir), *Path(repo_dir).parents)) if not os.path.lexists(p)), None)
    try:
        parts = component_folders(path) if path.is_dir() else []
        if not parts:
            return [triton_repository(path, repo_dir, name=name, **options)]
        return [triton_repository(folder, repo_dir, name=f"{name}_{folder.name}" if name else folder.name,
                                  **options) for folder in parts]
    except BaseException:
        if made is not None:  # the folders this call made, gone with what it wrote
            shutil.rmtree(made, ignore_errors=True)
        raise


def triton_repository(out_or_onnx: str | Path, repo_dir: str | Path, *, name: str | None = None,
                      max_batch: int = DEFAULT_MAX_BATCH, max_delay_ms: float = DEFAULT_MAX_DELAY_MS,
                      instance_count: int = 1, gpu: bool = False, force: bool = False) -> TritonRepository:
    """Write ``REPO/<name>/config.pbtxt``, ``REPO/<name>/1/model.onnx`` (+ external data) and
    ``REPO/<name>/inferenceservice.yaml`` for an onnxport output folder or a .onnx file.

    An existing ``REPO/<name>`` is replaced only with ``force=True``. ``serve REPO`` serves the result.
    With ``gpu``, the config reproduces the session options the best variant was proven and timed with
    (TF32, CUDA graph, TensorRT fp16: report ``best.session_options``).
    """
    onnx_path, default_name, tuned, sizes, variant = _read_out(Path(out_or_onnx))
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name or default_name).strip("_.") or "model"
    if len(name) > MAX_NAME:
        raise UsageError(f"the model name {name[:40]}… is {len(name)} characters long; a model name takes at "
                         f"most {MAX_NAME}", "pass a shorter --name")
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
    family = _served_with_others(onnx_path)
    if family is not None and Path(out_or_onnx).is_dir():
        return _family_repository(family, Path(out_or_onnx), onnx_path, name, model_dir, instance_count, gpu,
                                  None if tuned is None else tuned.intra_op_num_threads)
    if gpu and Path(out_or_onnx).is_dir():
        variant = _gpu_session(Path(out_or_onnx), variant)
    sig = read_signature(onnx_path)
    config = model_config(sig, name, max_batch=max_batch, max_delay_us=int(max_delay_ms * 1000),
                          instance_count=instance_count, gpu=gpu, tuned=tuned, warmup_sizes=sizes,
                          variant_options=variant)
    tmp = _staging(model_dir)
    try:
        _copy_onnx(onnx_path, tmp / "1" / "model.onnx")
        if (onnx_path.parent / "tokenizer").is_dir():  # a decoder's: serve's generate takes text with it
            shutil.copytree(onnx_path.parent / "tokenizer", tmp / "1" / "tokenizer")
        (tmp / "config.pbtxt").write_text(config_pbtxt(config), encoding="utf-8")
        (tmp / "inferenceservice.yaml").write_text(inference_service(name, gpu=gpu), encoding="utf-8")
        _move_in(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = tuple(sorted(p for p in model_dir.rglob("*") if p.is_file()))
    return TritonRepository(name, repo, model_dir, model_dir / "config.pbtxt", model_dir / "1" / "model.onnx",
                            model_dir / "inferenceservice.yaml", config["max_batch_size"], files)


def _gpu_session(out: Path, variant: SessionOptions | None) -> SessionOptions | None:
    """The session options a GPU entry of ``out``'s served file runs with: the family's own (``gpu_session``,
    its file run step by step: the CUDA provider without a CUDA graph) when report.json's section names a family
    that has them, else ``variant`` (the best's recorded options)."""
    report = read_report(out) or {}
    family = next((f for f in families.families() if f.gpu_session is not None and f.section in report), None)
    if family is None:
        return variant
    return without_cuda_graph(variant) if variant is not None else SessionOptions.from_dict(family.gpu_session)


def _staging(model_dir: Path) -> Path:
    """A fresh ``.<name>.tmp/1/`` beside ``model_dir``, where the entry is written before it is moved in."""
    tmp = model_dir.with_name(f".{model_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "1").mkdir(parents=True)
    return tmp


def _move_in(tmp: Path, model_dir: Path) -> None:
    if model_dir.exists():
        shutil.rmtree(model_dir)
    tmp.rename(model_dir)


def _copy_onnx(onnx_path: Path, target: Path) -> None:
    """Copy an ONNX file to ``target`` and its external data files beside it (under the names it refers to)."""
    shutil.copy2(onnx_path, target)
    for data in external_data_files(onnx_path):
        if not data.is_file() or not data.resolve().is_relative_to(onnx_path.parent.resolve()):
            raise UsageError(f"{onnx_path.name} refers to external data {data} that is missing or outside "
                             "its folder", "keep the external data files beside the .onnx file")
        dst = target.parent / data.relative_to(onnx_path.parent)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(data, dst)


def _served_with_others(onnx_path: Path) -> families.Family | None:
    """The family whose several files ``onnx_path`` is the served one of (an encoder-decoder's decoder with
    past), when it writes a python-backend entry for them (``Family.repository``); None otherwise."""
    return next((f for f in families.families()
                 if f.files and f.repository is not None and onnx_path.name == f.files[-1]), None)


def _family_repository(family: families.Family, out: Path, served: Path, name: str, model_dir: Path,
                       instance_count: int, gpu: bool, threads: int | None) -> TritonRepository:
    """A python-backend entry for a family served from several files: its files (the best variant's when
    convert chose one) beside what the family's ``repository`` gives (``1/model.py``, the files it writes, the
    ones it copies from the output folder, its config), ``config.pbtxt`` (with what the model's Python
    environment needs: :mod:`onnxport.serve.triton_env`) and the manifest."""
    report = read_report(out)
    entry = family.repository(out, report or {}, name, instance_count=instance_count, threads=threads, gpu=gpu)
    tmp = _staging(model_dir)
    try:
        for file in family.files:
            _copy_onnx(served.parent / file, tmp / "1" / file)
        (tmp / "1" / "model.py").write_text(entry.model, encoding="utf-8")
        for file, text in entry.written.items():
            (tmp / "1" / file).write_text(text, encoding="utf-8")
        for path in entry.copied:
            if path.is_dir():
                shutil.copytree(path, tmp / "1" / path.name)
            elif path.is_file():
                shutil.copy2(path, tmp / "1" / path.name)
        env = model_environment([tmp / "1" / file for file in family.files], report)
        (tmp / "config.pbtxt").write_text(_with_environment(family_config_pbtxt(entry.config, entry.notes), env),
                                          encoding="utf-8")
        (tmp / "inferenceservice.yaml").write_text(inference_service(name, model_format="triton"), encoding="utf-8")
        _move_in(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = tuple(sorted(p for p in model_dir.rglob("*") if p.is_file()))
    return TritonRepository(name, model_dir.parent, model_dir, model_dir / "config.pbtxt",
                            model_dir / "1" / "model.py", model_dir / "inferenceservice.yaml", 0, files,
                            env, tuple(check(env)))


def _with_environment(pbtxt: str, env: ModelEnvironment) -> str:
    """``pbtxt`` with the environment's comment lines after its leading comments."""
    lines = pbtxt.splitlines()
    head = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "\n".join([*lines[:head], *(f"# {line}" for line in env.lines()), *lines[head:]]) + "\n"
