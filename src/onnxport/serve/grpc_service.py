"""The KServe v2 / Triton gRPC front (``inference.GRPCInferenceService``) beside the HTTP app: the same models,
batchers, metrics, request limit and drain, with the message classes generated in ``tritonclient.grpc``.

Errors map to status codes: unknown model or version NOT_FOUND, a request the client must fix
INVALID_ARGUMENT, a server that is draining UNAVAILABLE, anything else INTERNAL. A message over the request
limit is refused by gRPC itself (RESOURCE_EXHAUSTED). RPCs not implemented here answer UNIMPLEMENTED.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from onnxport.core.errors import UsageError
from onnxport.core.version import __version__ as ONNXPORT_VERSION
from onnxport.serve.batcher import InferenceError, Outputs, ShuttingDown
from onnxport.serve.models import OIP_DATATYPES
from onnxport.serve.protocol import BadRequest, InferRequest
from onnxport.serve.served import EXTENSIONS, SERVER_NAME, Gate, ServedModel, find, offload

# the typed field of InferTensorContents that carries each datatype (FP16 and BF16 travel as raw bytes only)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_HTTP_TO_GRPC = {404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
                 503: grpc.StatusCode.UNAVAILABLE}


def status_of(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and message for an error raised while answering an RPC."""
    if isinstance(error, BadRequest):
        return _HTTP_TO_GRPC.get(error.status, grpc.StatusCode.INVALID_ARGUMENT), error.message
    if isinstance(error, ShuttingDown):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    if isinstance(error, InferenceError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    return grpc.StatusCode.INTERNAL, f"internal server error: {type(error).__name__}: {str(error)[:300]}"


def _rpc(*, admitted: bool = True) -> Callable:
    """Answer an RPC with its errors mapped to status codes; ``admitted`` RPCs pass the drain gate first
    (UNAVAILABLE once the server is shutting down). Health RPCs are not admitted: they answer while draining."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def handler(self: Service, request, context: grpc.aio.ServicerContext):
            if admitted and not self.gate.enter():
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
            try:
                return await method(self, request, context)
            except Exception as e:  # noqa: BLE001 - every error becomes a status code, none kills the server
                code, message = status_of(e)
            finally:
                if admitted:
                    self.gate.leave()
            await context.abort(code, message)

        return handler

    return wrap


def _parameters(params) -> dict:
    """An InferParameter map as plain values, for the OIP request header."""
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in params.items()
            if value.WhichOneof("parameter_choice")}


def _tensor(t, raw: bytes | None) -> dict:
    """One ModelInferRequest input as an OIP JSON tensor (typed contents) or a binary one (raw contents)."""
    params = _parameters(t.parameters)
    if any(key in params for key in _SHARED_MEMORY):
        raise BadRequest(f"input '{t.name}': the shared-memory extension is not supported by this server")
    tensor: dict = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
    given = [field.name for field, _ in t.contents.ListFields()]
    if raw is not None:
        if given:
            raise BadRequest(f"input '{t.name}' has both raw_input_contents and typed contents ({given[0]})")
        tensor["parameters"] = {"binary_data_size": len(raw)}
        return tensor
    want = CONTENTS.get(t.datatype)
    if want is None and t.datatype in OIP_DATATYPES.values():
        raise BadRequest(f"input '{t.name}': {t.datatype} has no typed contents field; send it in raw_input_contents")
    if given and given != [want]:
        raise BadRequest(f"input '{t.name}' of datatype {t.datatype} carries {', '.join(given)}; "
                         f"its values belong in {want}")
    tensor["data"] = list(getattr(t.contents, want)) if want else []
    return tensor


async def request_parts(request) -> tuple[dict, bytes]:
    """A ModelInferRequest as the OIP JSON header and binary data the HTTP front decodes."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
                         "send every input raw, or none")
    header: dict = {"inputs": [_tensor(t, raw[i] if raw else None) for i, t in enumerate(request.inputs)]}
    if request.id:
        header["id"] = request.id
    if request.outputs:
        outputs = []
        for out in request.outputs:
            params = _parameters(out.parameters)
            if any(key in params for key in _SHARED_MEMORY):
                raise BadRequest(f"output '{out.name}': the shared-memory extension is not supported by this server")
            outputs.append({"name": out.name, "parameters": {"class_count": params.get("classification", 0)}})
        header["outputs"] = outputs
    return header, b"".join(raw)


async def _decoded(m: ServedModel, request) -> InferRequest:
    """The request decoded for ``m`` (in the parse pool when the message is large)."""
    header, binary = await request_parts(request)
    return await offload(request.ByteSize(), m.decode, header, binary)


def response(m: ServedModel, req: InferRequest, outputs: Outputs) -> service_pb2.ModelInferResponse:
    """The requested outputs, in request order, as raw_output_contents."""
    datatypes = {t.name: t.datatype for t in m.signature.outputs}
    answer = service_pb2.ModelInferResponse(model_name=m.name, model_version=m.source.version, id=req.id or "")
    for name in req.outputs:
        array = np.ascontiguousarray(outputs[name])
        datatype = datatypes.get(name) or OIP_DATATYPES.get(array.dtype.name, "FP32")
        answer.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        answer.raw_output_contents.append(array.tobytes())
    return answer


class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The Triton gRPC inference service over the served models (the base class answers UNIMPLEMENTED)."""

    def __init__(self, models: dict[str, ServedModel], gate: Gate) -> None:
        self.models = models
        self.gate = gate

    @_rpc(admitted=False)
    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    @_rpc(admitted=False)
    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.gate.open)

    @_rpc(admitted=False)
    async def ModelReady(self, request, context):
        m = self.models.get(request.name)  # like Triton: an unknown model is not ready (no error)
        ready = m is not None and request.version in ("", m.source.version) and self.gate.open
        return service_pb2.ModelReadyResponse(ready=ready)

    @_rpc()
    async def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=ONNXPORT_VERSION, extensions=EXTENSIONS)

    @_rpc()
    async def ModelMetadata(self, request, context):
        m = find(self.models, request.name, request.version)
        return json_format.ParseDict(m.metadata(), service_pb2.ModelMetadataResponse())

    @_rpc()
    async def ModelConfig(self, request, context):
        m = find(self.models, request.name, request.version)
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(m.config(), model_config_pb2.ModelConfig()))

    @_rpc()
    async def ModelStatistics(self, request, context):
        chosen = [find(self.models, request.name, request.version)] if request.name else list(self.models.values())
        answer = service_pb2.ModelStatisticsResponse()
        for m in chosen:
            json_format.ParseDict(m.statistics(), answer.model_stats.add())
        return answer

    @_rpc()
    async def RepositoryIndex(self, request, context):
        answer = service_pb2.RepositoryIndexResponse()
        for m in self.models.values():
            answer.models.add(name=m.name, version=m.source.version, state="READY")
        return answer

    @_rpc()
    async def ModelInfer(self, request, context):
        m = find(self.models, request.model_name, request.model_version)
        return await m.infer(_decoded(m, request), functools.partial(response, m))


def _unimplemented(name: str) -> Callable:
    async def method(self: Service, request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not supported by this server")

    method.__name__ = name
    return method


for _name in dir(service_pb2_grpc.GRPCInferenceServiceServicer):  # shared memory, model control, streaming...
    if not _name.startswith("_") and _name not in Service.__dict__:
        setattr(Service, _name, _unimplemented(_name))


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def grpc_server(models: dict[str, ServedModel], gate: Gate, *, host: str, port: int,
                max_message_bytes: int) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server (not started) bound to host:port, and the port it got. Call it inside the running
    event loop that serves the HTTP app: the batchers belong to that loop. UsageError when the port is taken."""
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
    ])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(models, gate), server)
    where = address(host, port)
    try:
        bound = server.add_insecure_port(where)
    except RuntimeError as e:
        raise UsageError(f"cannot listen on {where} for gRPC: {e}",
                         "pick a free port with --grpc-port, or stop the process that holds it") from None
    if not bound:
        raise UsageError(f"cannot listen on {where} for gRPC",
                         "pick a free port with --grpc-port, or stop the process that holds it")
    return server, bound
