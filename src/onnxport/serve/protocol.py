"""Open Inference Protocol v2 request decoding and response encoding (JSON and Triton's binary extension)."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

import numpy as np
import orjson

from onnxport.families.serving import BadRequest
from onnxport.serve.models import NUMPY_DTYPES, Signature


@dataclass(frozen=True)
class InferRequest:
    """A decoded, validated request: numpy feeds, batch rows and what to send back."""

    id: str | None
    feeds: dict[str, np.ndarray]
    rows: int
    outputs: tuple[str, ...]          # output names, in response order
    binary: frozenset[str]            # outputs to return as binary data


_KINDS = {"BOOL": "b", "FP16": "biuf", "FP32": "biuf", "FP64": "biuf"}  # JSON value kinds each accepts


def _is_shape(shape: object) -> bool:
    return isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)


_KIND_WORDS = {"f": "numbers with a fraction or past 64 bits", "U": "strings", "O": "nulls, objects or mixed values",
               "b": "booleans", "c": "complex numbers"}


def _json_tensor(name: str, datatype: str, shape: list[int], data: object) -> np.ndarray:
    if not isinstance(data, list):
        raise BadRequest(f"input '{name}': 'data' must be a (flat or nested) list of values")
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError):
        raise BadRequest(f"input '{name}': 'data' is ragged or holds values of mixed kinds") from None
    allowed = _KINDS.get(datatype, "biu")
    if raw.size and raw.dtype.kind not in allowed:
        said = _KIND_WORDS.get(raw.dtype.kind, f"{raw.dtype.kind!r}-kind values")
        raise BadRequest(f"input '{name}': 'data' holds {said}, not {datatype} values")
    if raw.size != math.prod(shape):
        raise BadRequest(f"input '{name}': shape {shape} needs {math.prod(shape)} values, 'data' has {raw.size}")
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    if raw.dtype.kind in "iu" and dtype.kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise BadRequest(f"input '{name}': values outside the {datatype} range")
    return raw.astype(dtype).reshape(shape)


def _binary_tensor(name: str, datatype: str, shape: list[int], chunk: bytes) -> np.ndarray:
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    expected = math.prod(shape) * dtype.itemsize
    if len(chunk) != expected:
        raise BadRequest(f"input '{name}': shape {shape} of {datatype} needs {expected} bytes, got {len(chunk)}")
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent before its Content-Encoding (identity, gzip or deflate), at most ``limit`` bytes."""
    encoding = encoding.strip().lower() or "identity"
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}", 415)
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise BadRequest(f"the body is not valid {encoding} data") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise BadRequest(f"the decompressed request body exceeds the limit of {limit} bytes", 413)
    return out


def split_body(body: bytes, header_length: str | None) -> tuple[object, bytes]:
    """The JSON header (parsed) and the binary tensor data of a body; ``header_length`` is the
    Inference-Header-Content-Length header (None: the whole body is JSON). Checks the declared length first."""
    if header_length is not None:
        if not header_length.strip().isdigit() or int(header_length) > len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_length!r} does not fit the "
                             f"{len(body)}-byte body")
        head, binary = body[:int(header_length)], body[int(header_length):]
    else:
        head, binary = body, b""
    return loads(head), binary


def _not_finite(literal: str) -> float:
    raise BadRequest(f"the request holds {literal}, which JSON has no number for; send non-finite values as "
                     "binary tensor data")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"the request holds the number {text[:40]}, past the largest float64; send non-finite "
                         "values as binary tensor data")
    return value


def _check_text(value: object) -> None:
    """A BadRequest where a string of ``value`` (a parsed body) holds a lone surrogate, which is no Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest("the request holds a string that is not valid Unicode (a lone surrogate "
                                 f"escape such as \\u{ord(item[_surrogate(item)]):04x})") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _surrogate(text: str) -> int:
    return next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)


def loads(text: bytes) -> object:
    """A JSON request body parsed: by orjson (several times faster than the json module, so a large body holds
    the interpreter lock, and the event loop's health answers, for a fraction of the time), by the json module
    where orjson refuses it (integers past 64 bits). NaN, Infinity, a number past float64 and a lone surrogate
    are a BadRequest (400): strict JSON holds none of them (binary tensor data may hold non-finite values)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        found = json.loads(text, parse_constant=_not_finite, parse_float=_finite)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the request is not valid JSON: {str(e)[:200]}") from None
    _check_text(found)
    return found


def parse_body(body: bytes, sig: Signature, *, encoding: str, header_length: str | None, limit: int,
               batched: bool, max_batch: int) -> InferRequest:
    """A whole HTTP infer body (as read, before its Content-Encoding) to an InferRequest: inflate, split, parse
    the JSON, check it, make the numpy feeds. CPU-bound for large bodies: the server runs it off its event loop."""
    header, binary = split_body(inflate(body, encoding, limit), header_length)
    return decode(header, binary, sig, batched=batched, max_batch=max_batch)


@dataclass(frozen=True)
class _Planned:
    """One input, its description checked, its values not read yet."""

    name: str
    datatype: str
    shape: list[int]
    data: object = None          # the JSON values ...
    chunk: bytes | None = None   # ... or the binary ones


def decode(header: object, binary: bytes, sig: Signature, *, batched: bool, max_batch: int) -> InferRequest:
    """Check a request against the model signature and turn it into numpy feeds. Every cheap check (names,
    datatypes, shapes, the batch size against ``max_batch``, binary sizes, value counts) runs on every input
    before any values are converted."""
    if not isinstance(header, dict):
        raise BadRequest("the request body must be a JSON object with an 'inputs' list")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    params = header.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("'inputs' must be a non-empty list of tensors")
    expected = {t.name: t for t in sig.inputs}
    planned: dict[str, _Planned] = {}
    offset = 0
    for tensor in inputs:
        plan = _plan(tensor, expected, planned, binary, offset, batched=batched, max_batch=max_batch)
        offset += len(plan.chunk) if plan.chunk is not None else 0
        planned[plan.name] = plan
    if offset != len(binary):
        raise BadRequest(f"the binary body has {len(binary) - offset} bytes that no input claims")
    missing = sorted(set(expected) - set(planned))
    if missing:
        raise BadRequest(f"missing input(s) {missing}; the model's inputs are {sorted(expected)}")
    rows = 1
    if batched:
        firsts = {p.shape[0] for p in planned.values()}
        if len(firsts) != 1:
            raise BadRequest(f"the inputs disagree on the batch size (first dims {sorted(firsts)})")
        rows = firsts.pop()
    outputs, binary_out = _requested_outputs(header, params, sig)
    feeds = {p.name: _binary_tensor(p.name, p.datatype, p.shape, p.chunk) if p.chunk is not None
             else _json_tensor(p.name, p.datatype, p.shape, p.data) for p in planned.values()}
    return InferRequest(request_id, feeds, rows, outputs, binary_out)


def _plan(tensor: object, expected: dict, planned: dict, binary: bytes, offset: int, *, batched: bool,
          max_batch: int) -> _Planned:
    """One entry of 'inputs', checked without reading its values."""
    if not isinstance(tensor, dict):
        raise BadRequest("every entry of 'inputs' must be an object with name, datatype, shape and data")
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(name, str) or name not in expected:
        raise BadRequest(f"unknown input {name!r}; the model's inputs are {sorted(expected)}")
    if name in planned:
        raise BadRequest(f"input '{name}' is given twice")
    spec = expected[name]
    if datatype != spec.datatype:
        raise BadRequest(f"input '{name}' has datatype {datatype!r}; the model expects {spec.datatype}")
    if spec.datatype not in NUMPY_DTYPES:
        raise BadRequest(f"input '{name}': datatype {spec.datatype} is not supported by this server")
    if not _is_shape(shape):
        raise BadRequest(f"input '{name}': 'shape' must be a list of non-negative integers")
    if spec.shape is not None:
        if len(shape) != len(spec.shape):
            raise BadRequest(f"input '{name}' has shape {shape}; the model expects {spec.oip_shape()}")
        for got, want in zip(shape, spec.shape):
            if isinstance(want, int) and want >= 0 and got != want:
                raise BadRequest(f"input '{name}' has shape {shape}; the model expects {spec.oip_shape()}")
    if batched:
        if not shape:
            raise BadRequest(f"input '{name}' has no batch dim (shape []); the model batches along the first dim")
        if not 1 <= shape[0] <= max_batch:
            raise BadRequest(f"batch size {shape[0]} is outside 1..{max_batch} (the server's max batch size)")
    tparams = tensor.get("parameters") or {}
    if not isinstance(tparams, dict):
        raise BadRequest(f"input '{name}': 'parameters' must be an object")
    size = tparams.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            raise BadRequest(f"input '{name}': binary_data_size {size!r} does not fit the binary body "
                             f"({len(binary) - offset} bytes left)")
        if "data" in tensor:
            raise BadRequest(f"input '{name}' has both 'data' and binary_data_size")
        needed = math.prod(shape) * np.dtype(NUMPY_DTYPES[datatype]).itemsize
        if size != needed:
            raise BadRequest(f"input '{name}': shape {shape} of {datatype} needs {needed} bytes, got {size}")
        return _Planned(name, datatype, shape, chunk=binary[offset:offset + size])
    if "data" not in tensor:
        raise BadRequest(f"input '{name}' has no 'data' and no binary_data_size parameter")
    data = tensor["data"]
    if not isinstance(data, list):
        raise BadRequest(f"input '{name}': 'data' must be a (flat or nested) list of values")
    count = math.prod(shape)
    if len(data) != count and not (shape and len(data) == shape[0]):  # flat, or nested along the first dim
        raise BadRequest(f"input '{name}': shape {shape} needs {count} values, 'data' has {len(data)} "
                         f"{'entries' if data and isinstance(data[0], list) else 'values'}")
    return _Planned(name, datatype, shape, data=data)


def _requested_outputs(header: dict, params: dict, sig: Signature) -> tuple[tuple[str, ...], frozenset[str]]:
    names = [t.name for t in sig.outputs]
    default_binary = params.get("binary_data_output") is True
    requested = header.get("outputs")
    if requested is None:
        return tuple(names), frozenset(names) if default_binary else frozenset()
    if not isinstance(requested, list):
        raise BadRequest("'outputs' must be a list of objects with a 'name'")
    chosen, binary = [], set()
    for out in requested:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise BadRequest("every entry of 'outputs' must be an object with a 'name'")
        if out["name"] not in names:
            raise BadRequest(f"unknown output {out['name']!r}; the model's outputs are {names}")
        if out["name"] in chosen:  # each copy would be computed and written again: a small request, a huge answer
            raise BadRequest(f"output {out['name']!r} is asked twice in 'outputs'; ask for each output once")
        oparams = out.get("parameters") or {}
        if not isinstance(oparams, dict):
            raise BadRequest(f"output '{out['name']}': 'parameters' must be an object")
        if oparams.get("class_count"):
            raise BadRequest("the classification extension (class_count) is not supported by this server")
        if oparams.get("binary_data", default_binary) is True:
            binary.add(out["name"])
        chosen.append(out["name"])
    return tuple(chosen), frozenset(binary)


ORJSON_DTYPES = frozenset("?bBhHiIlLqQefd")  # numpy kinds orjson writes itself (bool, ints, float16/32/64)
NON_FINITE_WORDS = ("NaN", "Infinity", "-Infinity")  # proto3's JSON mapping of a float's non-finite values


def _finite_or_words(array: np.ndarray) -> np.ndarray | list:
    """``array`` itself where it is all finite, else its values as a list with NaN, +inf and -inf written as
    the strings "NaN", "Infinity" and "-Infinity": how proto3's JSON mapping writes them (the v2 protocol's
    gRPC messages), which strict JSON parsers accept and ``np.array(data, dtype)`` (tritonclient's
    ``as_numpy``) reads back as the same values. JSON itself has no number for them."""
    if array.dtype.kind != "f" or bool(np.isfinite(array).all()):
        return array
    flat = array.ravel()
    values = flat.tolist()
    for i in np.flatnonzero(~np.isfinite(flat)).tolist():
        v = values[i]
        values[i] = NON_FINITE_WORDS[0] if v != v else NON_FINITE_WORDS[1] if v > 0 else NON_FINITE_WORDS[2]
    return values


def dumps(body: dict) -> bytes:
    """A response body as strict JSON, tensors' ``data`` given as numpy arrays: by orjson straight from the
    arrays (a 48 MB answer in a fraction of the json module's time, so the event loop is not held); an array
    holding NaN or Infinity has those written as strings (:func:`_finite_or_words`), never as the bare ``NaN``
    no JSON parser has to accept; the json module for a dtype orjson does not write."""
    outputs = [{**t, "data": _finite_or_words(t["data"])} if isinstance(t.get("data"), np.ndarray) else t
               for t in body.get("outputs", ())]
    if "outputs" in body:
        body = {**body, "outputs": outputs}
    arrays = [t["data"] for t in outputs if isinstance(t.get("data"), np.ndarray)]
    if all(a.dtype.char in ORJSON_DTYPES for a in arrays):
        try:
            return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:
            pass
    plain = {**body, "outputs": [{**t, "data": t["data"].tolist()} if isinstance(t.get("data"), np.ndarray) else t
                                 for t in outputs]}
    return json.dumps(plain, separators=(",", ":"), allow_nan=False).encode()


def encode(model: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray],
           sig: Signature) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the length of its JSON header."""
    datatypes = {t.name: t.datatype for t in sig.outputs}
    tensors, chunks = [], []
    for name in request.outputs:
        array = np.ascontiguousarray(outputs[name])
        tensor: dict = {"name": name, "datatype": datatypes.get(name) or "FP32", "shape": list(array.shape)}
        if name in request.binary:
            raw = array.tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = array.ravel()
        tensors.append(tensor)
    body: dict = {"model_name": model, "model_version": version, "outputs": tensors}
    if request.id is not None:
        body["id"] = request.id
    head = dumps(body)
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)
