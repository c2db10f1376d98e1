"""Structural checks of an ONNX file: checker, shape inference, I/O signature, graph summary, dynamic dims."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper

from onnxport.core.diagnostics import Diagnostic, error, info, warning
from onnxport.core.errors import UsageError
from onnxport.core.onnxfile import file_bytes, onnx_file, walk_nodes
from onnxport.core.records import CheckResult, DimCheck
from onnxport.core.spec import InputSpec
from onnxport.runtime.feeds import input_mapping


def _dtype_name(elem_type: int) -> str:
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _io(value: onnx.ValueInfoProto) -> dict:
    t = value.type.tensor_type
    shape: list[int | str | None] | None = None
    if t.HasField("shape"):
        shape = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                shape.append(d.dim_param)
            else:
                shape.append(None)
    return {"name": value.name, "dtype": _dtype_name(t.elem_type), "shape": shape}






def external_data_short(path: Path, model: onnx.ModelProto) -> str | None:
    """Why the external data ``model`` (loaded from ``path`` without it) declares does not fit the files beside it:
    a tensor whose offset + length ends past its data file's size (onnx.checker does not look), or whose length
    is not its shape's bytes. None when every reference fits."""
    sizes: dict[str, int] = {}
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location")
        if not loc:
            continue
        file = path.parent / loc
        if loc not in sizes:
            try:
                sizes[loc] = file.stat().st_size
            except OSError:
                continue  # a missing file is the checker's finding
        offset, length = int(info.get("offset", 0) or 0), info.get("length")
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type else 0
        expected = math.prod(t.dims) * itemsize if itemsize and t.data_type not in (
            onnx.TensorProto.STRING, onnx.TensorProto.INT4, onnx.TensorProto.UINT4) else None
        length = int(length) if length is not None else (expected if expected is not None else sizes[loc] - offset)
        if expected is not None and length != expected:
            return (f"external data of '{t.name}' declares {length} bytes, its shape {list(t.dims)} needs "
                    f"{expected}")
        if offset + length > sizes[loc]:
            return (f"external data of '{t.name}' ends at byte {offset + length} of {loc}, which holds "
                    f"{sizes[loc]} bytes")
    return None


def check(path: str | Path, inputs: tuple[InputSpec, ...] | None = None, dims: dict | None = None) -> CheckResult:
    """Check ``path`` structurally; with ``inputs``, verify that every declared-dynamic dim is symbolic."""
    path = onnx_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"{path} is not a readable ONNX file: {str(e).splitlines()[0][:200]}",
                         "pass a .onnx file written by an ONNX exporter") from None
    if path.stat().st_size == 0 or not model.HasField("graph"):
        raise UsageError(f"{path} is not an ONNX model (it holds no graph)", "pass a .onnx file written by an ONNX exporter")
    diags: list[Diagnostic] = []
    checker_error = None
    try:
        onnx.checker.check_model(str(path))
    except Exception as e:  # noqa: BLE001 - every checker failure is reported
        checker_error = str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__
        hint = "the file does not follow the ONNX spec; re-export it or report the exporter bug"
        if "should be stored in" in checker_error:
            hint = ("the weights live in an external data file that is missing: keep the .data file(s) beside "
                    "the .onnx file, under the name the graph refers to")
        diags.append(error("onnx-checker", f"onnx.checker rejects the model: {checker_error}", hint=hint))
    if checker_error is None and (short := external_data_short(path, model)):
        checker_error = short
        diags.append(error("external-data-short", short,
                           hint="the .data file beside the model is truncated or not the one the graph was saved "
                                "with: copy it again whole, or re-export"))
    shape_error = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "inferred.onnx"
            onnx.shape_inference.infer_shapes_path(str(path), str(out), strict_mode=True)
    except Exception as e:  # noqa: BLE001
        shape_error = str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__
        diags.append(warning("shape-inference", f"ONNX shape inference fails: {shape_error}",
                             hint="runtimes may still run the model, but tools that need static shapes will not"))
    graph = model.graph
    init_names = {i.name for i in graph.initializer}
    graph_inputs = tuple(_io(v) for v in graph.input if v.name not in init_names)
    graph_outputs = tuple(_io(v) for v in graph.output)
    histogram = Counter(
        (f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in walk_nodes(graph)
    )
    params = sum(math.prod(t.dims) for t in graph.initializer
                 if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                                    onnx.TensorProto.DOUBLE, onnx.TensorProto.INT8, onnx.TensorProto.UINT8))
    opsets = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
    dim_checks, more = _declared_inputs(inputs, graph_inputs, dims)
    diags.extend(more)
    return CheckResult(
        path=path, ok=checker_error is None, checker_error=checker_error, shape_inference_error=shape_error,
        ir_version=int(model.ir_version), opset=opsets.get("ai.onnx", 0), opsets=opsets,
        producer=f"{model.producer_name} {model.producer_version}".strip(), nodes=sum(histogram.values()),
        initializers=len(graph.initializer), parameters=int(params), bytes=file_bytes(path),
        op_histogram=dict(histogram.most_common()), inputs=graph_inputs, outputs=graph_outputs,
        dynamic_dims=tuple(dim_checks), diagnostics=tuple(diags),
    )


def _declared_inputs(inputs: tuple[InputSpec, ...] | None, graph_inputs: tuple, dims: dict | None
                     ) -> tuple[list[DimCheck], list[Diagnostic]]:
    """Each declared input found in the graph (by name, else by position as parity feeds it) and each of its
    dynamic axes checked: (the dim checks, the diagnostics)."""
    dim_checks: list[DimCheck] = []
    diags: list[Diagnostic] = []
    if not inputs:
        return dim_checks, diags
    by_name = {io["name"]: io for io in graph_inputs}
    try:  # the names parity feeds by: the same names, else the same positions (runtime/feeds.py)
        mapping = input_mapping(inputs, [io["name"] for io in graph_inputs])
    except UsageError:
        mapping = {}
    renamed = [f"'{mapping[s.name]}' for '{s.name}'" for s in inputs if mapping.get(s.name, s.name) != s.name]
    if renamed:
        diags.append(info("inputs-by-position", f"the ONNX inputs are named otherwise ({', '.join(renamed)}): "
                                                "fed by position", hint="name the --input entries after the ONNX "
                                                                         "inputs to match them by name"))
    for spec in inputs:
        io = by_name.get(mapping.get(spec.name, spec.name))
        if io is None:
            diags.append(error("input-missing", f"the ONNX model has no input '{spec.name}'",
                               hint="the exporter dropped an input that the model does not use, or renamed it"))
            continue
        for axis, d in enumerate(spec.shape):
            if not isinstance(d, str):
                continue
            got = io["shape"][axis] if io["shape"] and axis < len(io["shape"]) else None
            rng = (dims or {}).get(d)
            symbolic = not isinstance(got, int)
            dim_checks.append(DimCheck(spec.name, axis, d, symbolic, got if isinstance(got, int) else None,
                                       getattr(rng, "min", None), getattr(rng, "max", None)))
            if not symbolic:
                diags.append(error(
                    "dynamic-dim-fixed",
                    f"input '{spec.name}' axis {axis} ('{d}') was declared dynamic but came out fixed to {got}",
                    hint="the model ties this size to a constant (e.g. a Linear's in_features or a hard-coded "
                         "reshape); declare it fixed in --input, or make the model accept any size",
                ))
    return dim_checks, diags
