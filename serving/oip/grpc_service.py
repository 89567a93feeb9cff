"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` on ``serving.grpc_port``.

The service and its messages are the protocol's own proto, as generated in
``tritonclient[grpc]`` (``pip install 'kelp[grpc]'``); Kelp writes no proto of
its own. The health, metadata and inference methods are answered by the same
:class:`~kelp.serving.oip.model.OipModel` the REST routes use, so gRPC, REST
and ``/v1`` give the same floats; the Triton-only methods (model repository,
shared memory, statistics, trace and log settings) answer ``UNIMPLEMENTED``.

Inputs come as ``raw_input_contents`` (what tritonclient sends) or typed
``contents``; outputs go back as ``raw_output_contents`` (FP32). Errors carry
the reason first, as over REST, with the gRPC status of the HTTP one: 401
``UNAUTHENTICATED``, 404 ``NOT_FOUND``, 413 ``RESOURCE_EXHAUSTED``, any other
4xx ``INVALID_ARGUMENT``, 503 ``UNAVAILABLE``, else ``INTERNAL``. With
``serving.auth_token_file`` set, calls need ``authorization: Bearer <token>``
metadata, except the health checks (``ServerLive``, ``ServerReady``,
``ModelReady``): the rule of the REST routes, where the server and model
metadata need the token too. ``x-kelp-synthetic: 1`` metadata keeps an inference out of the request
log, as the header does over REST. ``FP16`` has no typed ``contents`` field in the
protocol, so it comes as ``raw_input_contents`` only (400 otherwise).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kelp.errors import KelpError, UserError
from kelp.serving.errors import RequestError, error_answer
from kelp.serving.oip.model import LOGGED_ID_PARAMETER, OipModel
from kelp.serving.oip.tensors import (
    DTYPES,
    CountCheck,
    InferRequest,
    OutputRequest,
    Tensor,
    from_binary,
)
from kelp.serving.request_log import SYNTHETIC_HEADER, is_synthetic

__all__ = ["GRPC_THREADS", "start_grpc_server"]

GRPC_THREADS = 4
"""Threads that take gRPC calls; inference itself queues on the replica's one scoring thread."""

_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_GRPC_STATUS = {
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    413: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


def _modules() -> tuple[Any, Any, Any]:
    try:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc
    except ImportError:
        raise UserError(
            "serving.grpc_port: the gRPC service needs grpcio and the protocol's generated messages: "
            "pip install 'kelp[grpc]'"
        ) from None
    return grpc, service_pb2, service_pb2_grpc


def start_grpc_server(model: OipModel, host: str, port: int, server_version: str) -> Any:
    """A started ``grpc.Server`` with the inference service on ``host:port``; ``.stop(grace)`` ends it."""
    grpc, pb, rpc = _modules()
    service = _service_class(grpc, pb, rpc)(model, server_version)
    server = grpc.server(ThreadPoolExecutor(GRPC_THREADS, thread_name_prefix="kelp-grpc"))
    rpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise UserError(f"serving.grpc_port: cannot listen on {host}:{port}")
    server.start()
    return server


def _service_class(grpc: Any, pb: Any, rpc: Any) -> type:
    """The servicer, built on the generated base class (imported only when gRPC is on)."""

    class InferenceService(rpc.GRPCInferenceServiceServicer):  # type: ignore[misc,name-defined]
        def __init__(self, model: OipModel, server_version: str) -> None:
            self.model = model
            self.server_version = server_version

        def _abort(self, context: Any, error: KelpError) -> None:
            status, payload = error_answer(error)
            fallback = "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL"  # 422: the input's fault
            code = getattr(grpc.StatusCode, _GRPC_STATUS.get(status, fallback))
            context.abort(code, f"{payload['error']}: {payload['detail']}")

        def _authorized(self, context: Any) -> None:
            metadata = dict(context.invocation_metadata())
            refusal = self.model.routes.refusal(metadata.get("authorization"))
            if refusal is not None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{refusal['error']}: {refusal['detail']}")

        def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
            return pb.ServerLiveResponse(live=True)

        def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.ServerReadyResponse(ready=self.model.replica.readiness()[0])

        def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
            if self.model.problem(request.name, request.version or None) is not None:
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=self.model.replica.readiness()[0])

        def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
            self._authorized(context)
            return pb.ServerMetadataResponse(name="kelp", version=self.server_version, extensions=[])

        def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
            self._authorized(context)
            problem = self.model.problem(request.name, request.version or None)
            if problem is not None:
                self._abort(context, problem)
            described = self.model.metadata()
            tensors = [_tensor_metadata(pb, t) for t in described["inputs"]]
            outputs = [_tensor_metadata(pb, t) for t in described["outputs"]]
            return pb.ModelMetadataResponse(
                name=described["name"],
                versions=described["versions"],
                platform=described["platform"],
                inputs=tensors,
                outputs=outputs,
            )

        def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
            self._authorized(context)
            try:
                pinned = self.model.requested_version(request.model_name, request.model_version or None)
                synthetic = is_synthetic(dict(context.invocation_metadata()).get(SYNTHETIC_HEADER))
                parsed = _infer_request(request, self.model.inputs.check_count)
                done = self.model.routes.run_blocking(self.model.infer, parsed, pinned, None, synthetic)
            except KelpError as exc:
                self._abort(context, exc)
            response = pb.ModelInferResponse(
                model_name=self.model.name,
                model_version=str(done.result.model_version),
                id=done.request_id or "",
            )
            for key, value in done.parameters().items():
                if value is not None and math.isfinite(value):
                    response.parameters[key].double_param = float(value)
            if done.logged_as is not None:
                response.parameters[LOGGED_ID_PARAMETER].string_param = done.logged_as
            for name, values, _binary in done.outputs:
                response.outputs.add(name=name, datatype="FP32", shape=list(values.shape))
                response.raw_output_contents.append(np.ascontiguousarray(values, "<f4").tobytes())
            return response

    return InferenceService


def _tensor_metadata(pb: Any, described: dict[str, Any]) -> Any:
    """One tensor of the metadata as the protocol's message, which has no ``parameters``: gRPC clients
    get the datatype to send, REST clients also the list of those taken."""
    return pb.ModelMetadataResponse.TensorMetadata(
        name=described["name"], datatype=described["datatype"], shape=described["shape"]
    )


def _infer_request(request: Any, check_count: CountCheck | None = None) -> InferRequest:
    """The protocol buffer request as the REST parser's :class:`InferRequest` (every output binary);
    ``check_count`` sees each input's element count before its elements are read."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RequestError(
            "invalid_request", f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs", 400
        )
    inputs: dict[str, Tensor] = {}
    for k, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        if tensor.datatype not in DTYPES:
            raise RequestError("invalid_request", f"{where}: datatype {tensor.datatype!r} is unknown", 400)
        shape = tuple(int(d) for d in tensor.shape)
        if any(d < 0 for d in shape):
            raise RequestError("invalid_request", f"{where}: a negative dimension in {list(shape)}", 400)
        count = math.prod(shape)
        if check_count is not None:
            check_count(tensor.name, count)
        if raw:
            data = from_binary(raw[k], tensor.datatype, count, where)
        else:
            data = _typed_contents(tensor, count, where)
        if tensor.name in inputs:
            raise RequestError("invalid_request", f"input {tensor.name!r} is given twice", 400)
        inputs[tensor.name] = Tensor(tensor.name, tensor.datatype, shape, data)
    if not inputs:
        raise RequestError("invalid_request", "the request has no inputs", 400)
    outputs = tuple(OutputRequest(o.name, True) for o in request.outputs) or None
    return InferRequest(request.id or None, inputs, outputs, True)


def _typed_contents(tensor: Any, count: int, where: str) -> np.ndarray:
    field = _CONTENTS.get(tensor.datatype)
    if field is None:  # the protocol's InferTensorContents has no field for it (FP16)
        raise RequestError(
            "invalid_request",
            f"{where}: {tensor.datatype} has no typed contents in the protocol; "
            "send it as raw_input_contents",
            400,
        )
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise RequestError("invalid_request", f"{where}: {len(values)} values for {count} elements", 400)
    dtype = DTYPES[tensor.datatype]
    if dtype is None:
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out
    try:
        return np.array(values, dtype=dtype)
    except OverflowError:
        raise RequestError(
            "invalid_request", f"{where}: a value is out of range for {tensor.datatype}", 400
        ) from None
