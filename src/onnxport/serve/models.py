"""What the server serves: model signatures, OIP/Triton datatypes and loading from a folder, file or repository."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxport import families
from onnxport.core.errors import UsageError, one_line
from onnxport.core.outdir import served_output_folder
from onnxport.families.serving import family_layout, read_layout
from onnxport.prove.check import check
from onnxport.runtime.openvino import OPENVINO
from onnxport.runtime.sessions import OrtOptions
from onnxport.runtime.variant_sessions import SessionOptions

# numpy dtype name -> Open Inference Protocol datatype
OIP_DATATYPES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "bfloat16": "BF16", "object": "BYTES",
    "string": "BYTES",
}
NUMPY_DTYPES = {v: k for k, v in OIP_DATATYPES.items() if k not in ("object", "string")}

DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_DELAY_MS = 2.0
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


def layout_file(family: families.Family) -> str:
    """The file holding a family's layout beside its python-backend model.py in a repository entry (triton):
    ``seq2seq.json`` for an encoder-decoder."""
    return f"{family.section}.json"


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: name, numpy dtype name and shape (ints, symbol strings or None)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...] | None

    @property
    def datatype(self) -> str:
        """The OIP datatype ("FP32", "INT64", ...)."""
        return OIP_DATATYPES.get(self.dtype, self.dtype.upper())

    def oip_shape(self) -> list[int]:
        """Shape with -1 for every dynamic dim (``[]`` when the rank is unknown)."""
        return [d if isinstance(d, int) and d >= 0 else -1 for d in (self.shape or ())]

    def to_dict(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": self.oip_shape()}


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs, and whether its first dim is a batch dim that requests can share."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def batchable(self) -> bool:
        """True when every input and output has a dynamic first dim (the same symbol on all inputs)."""
        if not self.inputs or any(not t.shape for t in self.inputs + self.outputs):
            return False
        if any(isinstance(t.shape[0], int) for t in self.inputs + self.outputs):
            return False
        symbols = {t.shape[0] for t in self.inputs if isinstance(t.shape[0], str)}
        return len(symbols) <= 1


def signature(path: Path) -> Signature:
    """The I/O signature of an ONNX file (via :func:`onnxport.check.check`)."""
    result = check(path)

    def spec(io: dict) -> TensorSpec:
        return TensorSpec(io["name"], io["dtype"], tuple(io["shape"]) if io["shape"] is not None else None)

    return Signature(tuple(spec(i) for i in result.inputs), tuple(spec(o) for o in result.outputs))


@dataclass(frozen=True)
class ModelSource:
    """One model to serve: where its ONNX file is and how to run it."""

    name: str
    version: str
    onnx_path: Path
    max_batch: int | None = None          # None: the caller's default
    max_delay_ms: float | None = None     # None: the caller's default
    tuned: OrtOptions | None = None  # report.json's benchmark.tuned, or a repository config's thread counts; None: ORT's defaults
    batching_off: str | None = None  # why this model is served unbatched whatever --max-batch says
    layout: object = None  # the family's layout record report.json recorded (Family.layout), for its extension
    proven_options: SessionOptions | None = None  # report.json's best.session_options: how best.onnx was proven
    constrained_dims: dict | None = None  # report.json's dims the model runs at some sizes of only: {sym: rule/sizes}

    @property
    def threads(self) -> int | None:
        """The intra-op thread count it is served with (None: ONNX Runtime's default)."""
        return None if self.tuned is None else self.tuned.intra_op_num_threads

    @property
    def session_options(self) -> dict:
        """``runtime.session()`` keyword arguments of :attr:`tuned` (``threads``, ``opt_level``, ``options``),
        only those it sets: empty when nothing is tuned (ONNX Runtime's defaults)."""
        t = self.tuned
        if t is None:
            return {}
        kw: dict = {"options": t}
        if t.intra_op_num_threads is not None:
            kw["threads"] = t.intra_op_num_threads
        if t.graph_optimization_level is not None:
            kw["opt_level"] = t.graph_optimization_level
        return kw


MAX_NAME = 200  # a model folder's name, with room for the staging folder's beside it (255 at most)


def _model_name(raw: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", raw).strip("_.") or "model"
    return name


def check_model_name(name: str) -> str:
    """``name`` when it can name a served model and a repository folder as given (letters, digits, '_', '-',
    '.', not starting or ending with '_' or '.': no path, no '..'); UsageError naming --name otherwise."""
    if len(name) > MAX_NAME:
        raise UsageError(f"--name is {len(name)} characters long; a model name takes at most {MAX_NAME}",
                         "choose a shorter --name")
    if _model_name(name) != name:
        raise UsageError(f"--name {name!r} is not a valid model name",
                         "use letters, digits, '_', '-' and '.' (not first or last)")
    return name


def check_repository_folder(repo: Path, out: Path | None = None) -> Path:
    """``repo`` when a model repository can be written there: UsageError when it, or the nearest part of its
    path that exists, is not a folder, is a link to nothing or cannot be written; or when it lies inside the
    output folder ``out`` it is written from."""
    dangling = next((p for p in (repo, *repo.parents) if os.path.lexists(p) and not p.exists()), None)
    if dangling is not None:
        where = "is" if dangling == repo else f"is inside {dangling}, which is"
        raise UsageError(f"--repo {repo} {where} a link to nothing ({os.readlink(dangling)})",
                         "remove the link, or pass another folder for the repository")
    existing = next((p for p in (repo, *repo.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is" if existing == repo else f"is inside {existing}, which is"
        raise UsageError(f"--repo {repo} {where} a file, not a folder", "pass a folder (new or existing) for the repository")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == repo else f" (the nearest existing folder, {existing})"
        raise UsageError(f"--repo {repo}{where} cannot be written", "pass a folder you can write to")
    if out is not None and out.is_dir() and repo.resolve().is_relative_to(out.resolve()):
        raise UsageError(f"--repo {repo} is inside the output folder {out} it is written from",
                         "pass a folder outside it")
    return repo


def read_report(out: Path) -> dict | None:
    """``out/report.json`` of an output folder (None when there is none, or it holds no object); invalid JSON is
    a UsageError."""
    report_path = out / "report.json"
    if not report_path.is_file():
        return None
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except RecursionError:
        raise UsageError(f"{report_path} is not a report: it nests deeper than JSON parsers follow",
                         "re-run onnxport export/convert") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{report_path} is not valid JSON: {one_line(e)}", "re-run onnxport export/convert") from None
    return report if isinstance(report, dict) else None


def _from_output_folder(out: Path) -> ModelSource:
    report = read_report(out)
    onnx_path = served_file(out, report) or out / "model.onnx"
    name, layout, proven, constrained = out.resolve().name, None, None, None  # named after the folder: `serve out/minilm` is "minilm"
    tuned = tuned_options(report)
    if report is not None:
        layout = read_layout(report)
        best = report.get("best")
        recorded = best.get("session_options") if isinstance(best, dict) and onnx_path.name == "best.onnx" else None
        proven = SessionOptions.from_dict(recorded) if isinstance(recorded, dict) and recorded else None
        constrained = _constrained_dims(report)
    note = _not_batch_invariant(report, onnx_path.name)
    return ModelSource(_model_name(name), "1", onnx_path, tuned=tuned,
                       max_batch=1 if note else None, batching_off=note,
                       layout=layout,
                       proven_options=proven,
                       constrained_dims=constrained)


def tuned_options(report: object) -> OrtOptions | None:
    """The ONNX Runtime options report.json's ``benchmark.tuned`` sets (:meth:`OrtOptions.from_tuned`: None
    when it sets none; an unknown execution mode or optimization level is a UsageError)."""
    bench = report.get("benchmark") if isinstance(report, dict) else None
    return OrtOptions.from_tuned(bench.get("tuned")) if isinstance(bench, dict) else None


def _thread_counts(intra: int | None = None, inter: int | None = None) -> OrtOptions | None:
    """A repository config's thread counts as the record (nothing else set; None when neither is given)."""
    if intra is None and inter is None:
        return None
    return dataclasses.replace(OrtOptions.unset(), intra_op_num_threads=intra, inter_op_num_threads=inter)


def served_file(out: Path, report: object = None) -> Path | None:
    """The file ``serve OUT/`` and ``triton OUT/`` take from an output folder (None when it holds none):
    ``best.onnx`` (the best variant convert chose, copied there), else ``model.onnx``, else the one its model
    family serves (``Family.served``: an encoder-decoder's decoder with past, docs/seq2seq.md)."""
    for name in ("best.onnx", "model.onnx"):
        if (out / name).is_file():
            return out / name
    for family in families.families():
        if family.served is not None and (found := family.served(out, report)) is not None:
            return found
    return None


def component_folders(out: Path) -> list[Path]:
    """The output folders of an output folder made of several models (report.json's ``components``: a diffusion
    pipeline's text encoders, denoiser and autoencoder halves), each holding a file to serve; [] for any other
    folder. A component's name is a plain model name naming a folder inside ``out``, or it is left out."""
    report = read_report(out)
    listed = report.get("components") if isinstance(report, dict) else None
    found: list[Path] = []
    for entry in listed if isinstance(listed, list) else []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or _model_name(name) != name:
            continue
        folder = out / name
        if folder.is_dir() and served_file(folder) is not None:
            found.append(folder)
    return found


def output_folder(path: Path) -> Path:
    """The output folder a served file belongs to (:func:`onnxport.core.outdir.served_output_folder`)."""
    return served_output_folder(path)


def _constrained_dims(report: Any) -> dict | None:
    """The dims of report.json's model the ONNX model is proven at some sizes of only: {symbol: the rule, else
    the sizes}."""
    model = report.get("model") if isinstance(report, dict) else None
    dims = model.get("dims") if isinstance(model, dict) else None
    if not isinstance(dims, dict):
        return None
    found = {str(sym): str(d.get("rule") or ",".join(map(str, d.get("sizes") or [])))
             for sym, d in dims.items() if isinstance(d, dict) and d.get("sizes")}
    return found or None


def _not_batch_invariant(report: Any, served: str) -> str | None:
    """Why the served file must not be batched (its proof found a row's answer changes inside a batch)."""
    if not isinstance(report, dict):
        return None
    record, what = None, "the export"
    if served == "best.onnx" and isinstance(report.get("best"), dict):
        what = str(report["best"].get("name"))
        record = next((v.get("batch_invariant") for v in report.get("variants") or []
                       if isinstance(v, dict) and v.get("name") == what), None)
    if record is None and what in ("the export", "export"):
        record = (report.get("validation") or {}).get("batch_invariance")
    if not isinstance(record, dict) or record.get("passed", True):
        return None
    diff = record.get("max_abs_diff")
    by = f" by up to {diff:.3g}" if isinstance(diff, (int, float)) else ""
    by += f" ({record['reason']})" if isinstance(record.get("reason"), str) else ""
    return (f"{what} is not batch-invariant: a row alone and the same row inside a batch of {record.get('rows')} "
            f"differ{by} (dynamic int8 computes activation scales over the whole batch), so each request runs "
            "alone")


def _config_value(text: str, key: str) -> str | None:
    m = re.search(rf"^\s*{key}\s*:\s*\"?([^\"\s]+)\"?", text, re.MULTILINE)
    return m.group(1) if m else None


def _config_parameter(text: str, key: str) -> str | None:
    m = re.search(rf'key\s*:\s*"{key}"\s*value\s*:?\s*\{{\s*string_value\s*:\s*"([^"]*)"', text)
    return m.group(1) if m else None


def _from_repository_entry(entry: Path) -> ModelSource | None:
    config_path = entry / "config.pbtxt"
    text = config_path.read_text(encoding="utf-8") if config_path.is_file() else ""
    if _config_value(text, "backend") == "python":
        found = next((m for f in families.families() if f.files and (m := _family_entry(entry, text, f))), None)
        if found is not None:
            return found
    filename = _config_value(text, "default_model_filename") or "model.onnx"
    versions = sorted((int(v.name) for v in entry.iterdir()
                       if v.is_dir() and v.name.isdigit() and (v / filename).is_file()), reverse=True)
    if not versions:
        if text:
            raise UsageError(f"the repository model '{entry.name}' has no version folder with {filename}",
                             f"put the model at {entry}/1/{filename}")
        return None
    platform = _config_value(text, "platform") or _config_value(text, "backend")
    if platform not in (None, "onnxruntime_onnx", "onnxruntime", "openvino"):
        raise UsageError(f"the repository model '{entry.name}' uses platform '{platform}'",
                         "onnxport serves ONNX models only (platform: \"onnxruntime_onnx\")")
    max_batch = _config_value(text, "max_batch_size")
    delay = _config_value(text, "max_queue_delay_microseconds")
    counts: dict[str, int] = {}
    for key, arg in (("intra_op_thread_count", "intra"), ("inter_op_thread_count", "inter")):
        value = _config_parameter(text, key)
        if value and value.isdigit() and int(value) > 0:
            counts[arg] = int(value)
    name = _config_value(text, "name") or entry.name
    proven: SessionOptions | None = None
    if platform == "openvino":  # onnxport triton wrote it for a best proven on OpenVINO: served there too
        proven = SessionOptions(OPENVINO, inference_precision=_config_parameter(text, "INFERENCE_PRECISION_HINT")
                                or "f32", performance_hint=_config_parameter(text, "PERFORMANCE_HINT") or "LATENCY")
        threads = _config_parameter(text, "INFERENCE_NUM_THREADS")
        counts.update({"intra": int(threads)} if threads and threads.isdigit() else {})
    return ModelSource(name, str(versions[0]), entry / str(versions[0]) / filename,
                       max_batch=int(max_batch) if max_batch and max_batch.isdigit() else None,
                       max_delay_ms=int(delay) / 1000 if delay and delay.isdigit() else None,
                       tuned=_thread_counts(**counts), proven_options=proven)


def _family_entry(entry: Path, text: str, family: families.Family) -> ModelSource | None:
    """A python-backend entry ``onnxport triton`` wrote for a family served from several files (an
    encoder-decoder: its newest version folder holds the three files and ``seq2seq.json``): served by the last
    of its files (the decoder with past), with its layout read back by the family (for its extension)."""
    name = layout_file(family)
    versions = sorted((int(v.name) for v in entry.iterdir() if v.is_dir() and v.name.isdigit()
                       and (v / name).is_file() and all((v / f).is_file() for f in family.files)), reverse=True)
    if not versions:
        return None
    folder = entry / str(versions[0])
    try:
        layout = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{folder / name} is not valid JSON: {e}", "run onnxport triton again") from None
    threads = _config_parameter(text, "intra_op_thread_count")
    return ModelSource(_config_value(text, "name") or entry.name, str(versions[0]), folder / family.files[-1],
                       tuned=_thread_counts(int(threads)) if threads and threads.isdigit() and int(threads) else None,
                       layout=family_layout(family, layout))


def discover(path: str | Path, name: str | None = None) -> list[ModelSource]:
    """The models under PATH: an onnxport output folder (the model is named after the folder), a single
    .onnx file (named after the file) or a Triton-style repository (named after its entries). ``name``
    renames the one model of a folder or file."""
    sources = _discover(Path(path))
    if name is None:
        return sources
    if len(sources) != 1:
        raise UsageError(f"--name renames one model, and {path} holds {len(sources)}",
                         "leave --name out for a repository (its folders name the models)")
    return [dataclasses.replace(sources[0], name=check_model_name(name))]


def check_family_files(path: Path) -> None:
    """A UsageError naming the files missing from ``path`` where it holds some of a family's files served
    together (an encoder-decoder's output without decoder_with_past_model.onnx)."""
    for family in families.families():
        missing = [f for f in family.files if not (path / f).is_file()]
        if family.files and len(missing) < len(family.files):
            raise UsageError(f"{path} lacks {', '.join(missing)} of the files served together "
                             f"({', '.join(family.files)})", "run 'onnxport export' again into this folder")


def _discover(path: Path) -> list[ModelSource]:
    if path.is_file():
        if path.suffix != ".onnx":
            raise UsageError(f"{path} is not an .onnx file",
                             "serve an onnxport output folder, a .onnx file or a Triton model repository")
        return [ModelSource(_model_name(path.stem), "1", path)]
    if not path.is_dir():
        raise UsageError(f"{path} does not exist", "pass an onnxport output folder, a .onnx file or a repository")
    if served_file(path) is not None:
        return [_from_output_folder(path)]
    parts = component_folders(path)
    if parts:  # a model made of several (report.json's components): each served under its part's name
        return [_from_output_folder(folder) for folder in parts]
    sources = [s for entry in sorted(path.iterdir()) if entry.is_dir() and (s := _from_repository_entry(entry))]
    if not sources:
        check_family_files(path)
        raise UsageError(f"{path} holds no model to serve",
                         "pass an onnxport output folder (with model.onnx), a .onnx file, or a Triton repository "
                         "(DIR/<name>/config.pbtxt and DIR/<name>/1/model.onnx)")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise UsageError(f"the repository {path} names a model twice: {names}", "give every model a unique name")
    return sources

