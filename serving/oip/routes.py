"""The Open Inference Protocol (KServe v2) REST endpoints of a serving replica, beside ``/v1``.

Clients nobody at Kelp wrote (Triton's ``tritonclient``, KServe's) score
through it. The model's name is the config's ``deployment``, and the one
version a replica lists is the snapshot it has loaded.

* ``GET /v2``: server metadata; ``GET /v2/health/live``, ``/v2/health/ready``:
  200 or 503 (ready = ``/readyz``'s rule: a model loaded and the store answers);
* ``GET /v2/models/{name}[/versions/{v}]``: the model's metadata (inputs as
  :mod:`kelp.serving.oip.inputs` reads them, one ``FP32 [-1]`` output per
  task); ``.../ready``: 200 when ready and serving that version;
* ``POST /v2/models/{name}[/versions/{v}]/infer``: inputs inline or as binary
  data (:mod:`kelp.serving.oip.tensors`); scored on the same thread, with the
  same rows and model, as ``/v1/score``, so the two give the same floats.
  With ``/versions/{v}`` a replica that serves another version answers 404.
  ``X-Kelp-Synthetic: 1`` keeps it out of the request log, as on ``/v1``.

Errors have the protocol's shape, ``{"error": "<reason>: <message>"}``: 400 for
a request that does not fit the model, 401 without the bearer token (when
``serving.auth_token_file`` is set), 404 for another model or version, 413 over
the limits, 503 when no model is loaded or the store is unreachable.

With ``serving.auth_token_file`` set, inference and metadata (server and model)
need the token; the health checks (live, ready, model ready) stay open. gRPC
(:mod:`kelp.serving.oip.grpc_service`) keeps the same rule.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.requests import Request
from fastapi.responses import JSONResponse, Response

from kelp.errors import KelpError
from kelp.serving.dispatch import VERSION_HEADER
from kelp.serving.errors import RequestError, error_answer
from kelp.serving.oip.model import LOGGED_ID_PARAMETER, OipModel
from kelp.serving.oip.schemas import (
    InferResponseBody,
    ModelMetadata,
    OipError,
    ServerMetadata,
)
from kelp.serving.oip.tensors import BINARY_HEADER, encode_response, parse_request
from kelp.serving.request_log import REQUEST_ID_HEADER, SYNTHETIC_HEADER, is_synthetic

__all__ = ["OIP_ENDPOINTS", "add_oip_routes", "endpoint_label"]

OIP_ENDPOINTS = (
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/{name}",
    "/v2/models/{name}/ready",
    "/v2/models/{name}/infer",
    "/v2/models/{name}/versions/{version}",
    "/v2/models/{name}/versions/{version}/ready",
    "/v2/models/{name}/versions/{version}/infer",
)
"""The metric labels of the ``/v2`` routes: the model's name and version are not label values."""

EXTENSIONS = ["binary_tensor_data"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": OipError, "description": "the request does not fit the model; the reason comes first"},
    401: {"model": OipError, "description": "serving.auth_token_file is set and the bearer token is not"},
    404: {"model": OipError, "description": "no model of that name, or another version is loaded"},
    413: {"model": OipError, "description": "body or sample count over the configured limits"},
    503: {"model": OipError, "description": "no model loaded yet, or the store is unreachable"},
}
_NOT_READY = {503: {"model": OipError, "description": "not ready; the error says why"}}


def endpoint_label(path: str) -> str | None:
    """The ``OIP_ENDPOINTS`` template of a ``/v2`` path, or None for any other path."""
    if path == "/v2" or path.startswith("/v2/health/"):
        return path
    parts = path.split("/")
    if len(parts) < 4 or parts[:3] != ["", "v2", "models"]:
        return None
    parts[3] = "{name}"
    if len(parts) > 5 and parts[4] == "versions":
        parts[5] = "{version}"
    return "/".join(parts)


_MAX_DIGITS = 18  # any byte count a body can have; more digits than int() may even take are refused


def _byte_count(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS


def _oip_error(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": f"{reason}: {message}"}, status_code=status, headers=headers)


def _protocol_status(status: int) -> int:
    """An input the model cannot use is a 400 here, as the protocol and KServe answer it; ``/v1``
    tells a well-formed but unusable input apart as 422."""
    return 400 if status == 422 else status


def _refused(error: RequestError) -> JSONResponse:
    return _oip_error(_protocol_status(error.status), error.reason, str(error))


def add_oip_routes(app: FastAPI, model: OipModel, server_version: str) -> None:
    """Declare the ``/v2`` endpoints of ``model`` on ``app``; inference runs on its routes' scoring thread."""
    routes = model.routes

    def unauthorized(request: Request) -> JSONResponse | None:
        """The 401 for a request without the bearer token (when one is set), else None."""
        refusal = routes.refusal(request.headers.get("authorization"))
        if refusal is None:
            return None
        return _oip_error(
            401, refusal["error"], refusal["detail"], {"WWW-Authenticate": 'Bearer realm="kelp"'}
        )

    def readiness() -> Response:
        is_ready, reason = model.replica.readiness()
        return Response(status_code=200) if is_ready else _oip_error(503, "not_ready", reason or "")

    @app.get(
        "/v2",
        response_model=ServerMetadata,
        responses={401: _ERRORS[401]},
        summary="Server metadata (Open Inference Protocol)",
    )
    async def server_metadata(request: Request) -> Any:
        refused = unauthorized(request)
        if refused is not None:
            return refused
        return {"name": "kelp", "version": server_version, "extensions": EXTENSIONS}

    @app.get("/v2/health/live", summary="Liveness (Open Inference Protocol)", response_class=Response)
    async def live() -> Response:
        return Response(status_code=200)

    @app.get(
        "/v2/health/ready",
        summary="Readiness (Open Inference Protocol)",
        responses=_NOT_READY,
        response_class=Response,
    )
    def ready() -> Response:
        return readiness()

    def metadata(request: Request, name: str, version: str | None) -> JSONResponse:
        refused = unauthorized(request)
        if refused is not None:
            return refused
        problem = model.problem(name, version)
        return _refused(problem) if problem is not None else JSONResponse(model.metadata())

    @app.get(
        "/v2/models/{name}", response_model=ModelMetadata, responses=_ERRORS, summary="Model metadata (OIP)"
    )
    async def model_metadata(request: Request, name: str) -> JSONResponse:
        return metadata(request, name, None)

    @app.get(
        "/v2/models/{name}/versions/{version}",
        response_model=ModelMetadata,
        responses=_ERRORS,
        summary="Model version metadata (OIP)",
    )
    async def version_metadata(request: Request, name: str, version: str) -> JSONResponse:
        return metadata(request, name, version)

    def model_ready(name: str, version: str | None) -> Response:
        problem = model.problem(name, version)
        return _refused(problem) if problem is not None else readiness()

    @app.get(
        "/v2/models/{name}/ready",
        responses={**_ERRORS, **_NOT_READY},
        summary="Model readiness (OIP)",
        response_class=Response,
    )
    def ready_model(name: str) -> Response:
        return model_ready(name, None)

    @app.get(
        "/v2/models/{name}/versions/{version}/ready",
        responses={**_ERRORS, **_NOT_READY},
        summary="Model version readiness (OIP)",
        response_class=Response,
    )
    def ready_version(name: str, version: str) -> Response:
        return model_ready(name, version)

    def answer(
        raw: bytes, header_length: int | None, version: int | None, client_id: str | None, synthetic: bool
    ) -> tuple[bytes, int | None, dict[str, str]]:
        """Parse, score, encode: one call on the scoring thread. Also returns the response's headers."""
        parsed = parse_request(raw, header_length, model.inputs.check_count)
        done = model.infer(parsed, version, client_id, synthetic)
        headers = {VERSION_HEADER: str(done.result.model_version)}
        if done.logged_as is not None:
            headers[REQUEST_ID_HEADER] = done.logged_as
        head: dict[str, Any] = {"model_name": model.name, "model_version": str(done.result.model_version)}
        if done.request_id is not None:
            head["id"] = done.request_id
        head["parameters"] = done.parameters()
        if done.logged_as is not None:
            head["parameters"][LOGGED_ID_PARAMETER] = done.logged_as
        body, length = encode_response(head, done.outputs)
        return body, length, headers

    async def infer(request: Request, name: str, version: str | None) -> Response:
        refused = unauthorized(request)
        if refused is not None:
            return refused
        try:
            pinned = model.requested_version(name, version)
            synthetic = is_synthetic(request.headers.get(SYNTHETIC_HEADER))
        except RequestError as exc:
            return _refused(exc)
        declared = request.headers.get(BINARY_HEADER)
        if declared is not None and not _byte_count(declared):
            return _oip_error(
                400,
                "invalid_request",
                f"{BINARY_HEADER} must be a byte count (at most {_MAX_DIGITS} digits), "
                f"not {declared[:40]!r}" + ("..." if len(declared) > 40 else ""),
            )
        raw = await request.body()
        try:
            body, header_length, headers = await routes.run(
                answer,
                raw,
                None if declared is None else int(declared),
                pinned,
                request.headers.get("x-request-id"),
                synthetic,
            )
        except KelpError as exc:
            status, payload = error_answer(exc)
            return _oip_error(_protocol_status(status), payload["error"], payload["detail"])
        if header_length is None:
            return Response(body, media_type="application/json", headers=headers)
        headers[BINARY_HEADER] = str(header_length)
        return Response(body, media_type="application/octet-stream", headers=headers)

    infer_doc: dict[str, Any] = {
        "response_model": InferResponseBody,
        "responses": {
            **_ERRORS,
            200: {
                "content": {"application/octet-stream": {}},
                "description": "JSON, or JSON and binary outputs",
            },
        },
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/InferRequestBody"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            }
        },
    }

    @app.post("/v2/models/{name}/infer", summary="Score named input tensors (OIP)", **infer_doc)
    async def infer_latest(request: Request, name: str) -> Response:
        return await infer(request, name, None)

    @app.post(
        "/v2/models/{name}/versions/{version}/infer", summary="Score with one version (OIP)", **infer_doc
    )
    async def infer_version(request: Request, name: str, version: str) -> Response:
        return await infer(request, name, version)
