"""ONNX file helpers: save, copy and move with external data, the external-data threshold, node walks, sizes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from onnxport.core.errors import ExportFailed, UsageError

if TYPE_CHECKING:
    import onnx

EXTERNAL_DATA_THRESHOLD = 2 * 1024**3


def external_threshold() -> int:
    """Weights above this many bytes go to external data (env ONNXPORT_EXTERNAL_DATA_THRESHOLD, default 2 GiB:
    protobuf cannot hold more in one file)."""
    text = os.environ.get("ONNXPORT_EXTERNAL_DATA_THRESHOLD")
    if text is None:
        return EXTERNAL_DATA_THRESHOLD
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"ONNXPORT_EXTERNAL_DATA_THRESHOLD must be a number of bytes >= 0, got '{text}'",
                         "e.g. ONNXPORT_EXTERNAL_DATA_THRESHOLD=1000000000, or unset it (default 2 GiB)")
    return value


def state_bytes(module) -> int:
    """Bytes of a module's parameters and buffers (its state_dict): what an export writes as weights."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def onnx_file(path: str | Path) -> Path:
    """``path``, a file that exists (checked before anything reads it: a folder or a missing file is a
    UsageError naming it)."""
    path = Path(path)
    if path.is_dir():
        found = next((n for n in ("model.onnx", "best.onnx") if (path / n).is_file()), None)
        raise UsageError(f"{path} is a folder, not an ONNX file",
                         f"give the file itself, e.g. {path / found}" if found else "give the path of a .onnx file")
    if not path.is_file():
        raise UsageError(f"ONNX file not found: {path}", "check the path")
    return path


def read_graph(path: str | Path) -> onnx.ModelProto:
    """The ONNX model at ``path`` without its external weights; a file that is missing or is no ONNX model is
    a UsageError naming it."""
    import onnx

    path = onnx_file(path)
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeWarning or ValueError
        raise UsageError(f"{path} is not an ONNX model ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else 'unreadable'})",
                         "pass a .onnx file written by an ONNX exporter") from None


SAFE_INLINE_BYTES = 1_500_000_000  # protobuf's 2 GiB limit, less room for the graph a rewrite may add


def inline_limit() -> int:
    """Weights above this many bytes go to external data when a graph is rewritten (variants, the localizer's
    copy with every value exposed): the export threshold, or less where protobuf needs the room."""
    return min(SAFE_INLINE_BYTES, external_threshold())


def save_model(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Save ``model``; with ``external`` the weights go to ``<name>.data`` beside it."""
    import onnx

    path = Path(path)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        data = path.with_name(path.name + ".data")
        if data.exists():  # onnx creates it owner-only; serving and Triton containers read it as another user
            data.chmod(path.stat().st_mode & 0o777)
    else:
        onnx.save_model(model, str(path))


def external_data_files(path: Path) -> list[Path]:
    """The external data files an ONNX file refers to (none for a self-contained file)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return [path.parent / loc for loc in sorted(locations)]


def _relocated(src: Path, new_loc: str) -> onnx.ModelProto:
    """``src``'s graph (weights not loaded) with every external-data reference pointing at ``new_loc``."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = new_loc
    return model


def copy_model(src: Path, dst: Path) -> None:
    """Copy an ONNX file and its external data (renamed to ``<dst>.data``); the weights are copied as bytes,
    never loaded, so this works for models of any size."""
    import onnx

    src, dst = Path(src), Path(dst)
    data = external_data_files(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not data:
        shutil.copyfile(src, dst)
        return
    if len(data) != 1:
        raise UsageError(f"{src} spreads its weights over {len(data)} external data files",
                         "re-export it with onnxport (one .data file per model)")
    if not data[0].is_file():
        raise UsageError(f"{src.name} refers to external data {data[0].name}, which is missing",
                         "keep the .data file beside the .onnx file")
    shutil.copyfile(data[0], dst.parent / (dst.name + ".data"))
    tmp = dst.with_name(dst.name + ".tmp")
    onnx.save_model(_relocated(src, dst.name + ".data"), str(tmp))
    os.replace(tmp, dst)


def move_model(src: Path, dst: Path) -> None:
    """Move an ONNX file (and its external data, renamed to ``<dst>.data``) into place atomically."""
    import onnx

    src, dst = Path(src), Path(dst)
    data = external_data_files(src)
    if not data:
        os.replace(src, dst)
        return
    new_loc = dst.name + ".data"
    model = _relocated(src, new_loc)
    if len(data) != 1:
        raise ExportFailed(f"{src} spreads its weights over {len(data)} files", "re-export with onnxport")
    os.replace(data[0], dst.parent / new_loc)
    tmp = dst.with_name(dst.name + ".tmp")
    onnx.save_model(model, str(tmp))
    os.replace(tmp, dst)
    src.unlink(missing_ok=True)


def remove_model(path: str | Path) -> None:
    """Remove a model file and its external data (``<name>.data``), either or both missing."""
    path = Path(path)
    for stale in (path, path.with_name(path.name + ".data")):
        stale.unlink(missing_ok=True)


def walk_nodes(graph: onnx.GraphProto):
    """Every node of ``graph``, those in If/Loop/Scan subgraphs included."""
    import onnx

    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from walk_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from walk_nodes(g)


def file_bytes(path: Path) -> int:
    """Size of an ONNX file plus its external data files."""
    return path.stat().st_size + sum(p.stat().st_size for p in external_data_files(path) if p.exists())
