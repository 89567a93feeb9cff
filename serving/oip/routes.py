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

Errors have the protocol's shape, ``{"error": "<reason>: <message>"}``: 400 for
a request that does not fit the model, 401 without the bearer token (when
``serving.auth_token_file`` is set), 404 for another model or version, 413 over
the limits, 503 when no model is loaded or the store is unreachable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.requests import Request
from fastapi.responses import JSONResponse, Response

from kelp.errors import KelpError
from kelp.serving.dispatch import VERSION_HEADER, ScoreRoutes
from kelp.serving.errors import RequestError, error_answer
from kelp.serving.oip.inputs import TensorInputs
from kelp.serving.oip.schemas import (
    InferResponseBody,
    ModelMetadata,
    OipError,
    ServerMetadata,
)
from kelp.serving.oip.tensors import BINARY_HEADER, InferRequest, encode_response, parse_request
from kelp.serving.replica import ServingReplica
from kelp.serving.request_log import REQUEST_ID_HEADER
from kelp.serving.scorer import ScoreResult

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


def _oip_error(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": f"{reason}: {message}"}, status_code=status, headers=headers)


def _version_number(version: str) -> int | None:
    return int(version) if version.isascii() and version.isdigit() and len(version) < 19 else None


def add_oip_routes(app: FastAPI, replica: ServingReplica, routes: ScoreRoutes, server_version: str) -> None:
    """Declare the ``/v2`` endpoints on ``app``; inference runs on ``routes``' scoring thread."""
    model_name = replica.cfg.deployment
    inputs = TensorInputs(replica.parser)
    tasks = replica.scorer.model_spec.tasks

    def unknown(name: str) -> JSONResponse:
        return _oip_error(404, "unknown_model", f"this replica serves model {model_name!r}, not {name!r}")

    def loaded_version() -> int | None:
        current = replica.slot.current
        return None if current is None else current.version

    def version_problem(name: str, version: str | None) -> JSONResponse | None:
        """The 404 for another model, or a version this replica has not loaded; None when it fits."""
        if name != model_name:
            return unknown(name)
        if version is None:
            return None
        loaded = loaded_version()
        if _version_number(version) is None or _version_number(version) != loaded:
            shown = "no version yet" if loaded is None else f"version {loaded}"
            return _oip_error(
                404, "version_not_loaded", f"version {version!r} is not loaded; it serves {shown}"
            )
        return None

    @app.get("/v2", response_model=ServerMetadata, summary="Server metadata (Open Inference Protocol)")
    async def server_metadata() -> dict[str, Any]:
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
        is_ready, reason = replica.readiness()
        return Response(status_code=200) if is_ready else _oip_error(503, "not_ready", reason or "")

    def metadata(name: str, version: str | None) -> JSONResponse:
        problem = version_problem(name, version)
        if problem is not None:
            return problem
        loaded = loaded_version()
        body = {
            "name": model_name,
            "versions": [] if loaded is None else [str(loaded)],
            "platform": "kelp_pytorch",
            "inputs": inputs.metadata(),
            "outputs": [{"name": task, "datatype": "FP32", "shape": [-1]} for task in tasks],
        }
        return JSONResponse(body)

    @app.get(
        "/v2/models/{name}", response_model=ModelMetadata, responses=_ERRORS, summary="Model metadata (OIP)"
    )
    async def model_metadata(name: str) -> JSONResponse:
        return metadata(name, None)

    @app.get(
        "/v2/models/{name}/versions/{version}",
        response_model=ModelMetadata,
        responses=_ERRORS,
        summary="Model version metadata (OIP)",
    )
    async def version_metadata(name: str, version: str) -> JSONResponse:
        return metadata(name, version)

    def model_ready(name: str, version: str | None) -> Response:
        problem = version_problem(name, version)
        if problem is not None:
            return problem
        is_ready, reason = replica.readiness()
        return Response(status_code=200) if is_ready else _oip_error(503, "not_ready", reason or "")

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
        raw: bytes, header_length: int | None, version: int | None, client_id: str | None
    ) -> tuple[bytes, int | None, dict[str, str]]:
        """Parse, score, encode: one call on the scoring thread. Also returns the response's headers."""
        request = parse_request(raw, header_length)
        batch = inputs.batch(request.inputs)
        result = replica.scorer.score(batch, version)
        outputs = _outputs(request, result, tasks)
        logged_as = routes.log(request.id or client_id, batch, result)
        headers = {VERSION_HEADER: str(result.model_version)}
        if logged_as is not None:
            headers[REQUEST_ID_HEADER] = logged_as
        body, length = encode_response(_head(model_name, logged_as or request.id, result), outputs)
        return body, length, headers

    async def infer(request: Request, name: str, version: str | None) -> Response:
        refusal = routes.refusal(request.headers.get("authorization"))
        if refusal is not None:
            return _oip_error(
                401, refusal["error"], refusal["detail"], {"WWW-Authenticate": 'Bearer realm="kelp"'}
            )
        if name != model_name:
            return unknown(name)
        pinned = None if version is None else _version_number(version)
        if version is not None and pinned is None:
            return _oip_error(404, "version_not_loaded", f"version {version!r} is not a version number")
        declared = request.headers.get(BINARY_HEADER)
        if declared is not None and not (declared.isascii() and declared.isdigit()):
            return _oip_error(
                400, "invalid_request", f"{BINARY_HEADER} must be a byte count, not {declared!r}"
            )
        raw = await request.body()
        try:
            body, header_length, headers = await routes.run(
                answer,
                raw,
                None if declared is None else int(declared),
                pinned,
                request.headers.get("x-request-id"),
            )
        except KelpError as exc:
            status, payload = error_answer(exc)
            return _oip_error(status, payload["error"], payload["detail"])
        if header_length is None:
            return Response(body, media_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(header_length)
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


def _head(model_name: str, request_id: str | None, result: ScoreResult) -> dict[str, Any]:
    head: dict[str, Any] = {"model_name": model_name, "model_version": str(result.model_version)}
    if request_id is not None:
        head["id"] = request_id
    head["parameters"] = {
        "model_created_at": result.model_created_at,
        "model_age_s": result.model_age_s,
        "embedding_age_max_s": result.embedding_age_max_s,
        "embedding_age_mean_s": result.embedding_age_mean_s,
        "default_row_rate": result.default_row_rate,
    }
    return head


def _outputs(
    request: InferRequest, result: ScoreResult, tasks: tuple[str, ...]
) -> list[tuple[str, np.ndarray, bool]]:
    """``(task, scores, binary)`` of the outputs asked for (every task when none are named)."""
    by_task = result.scores_by_task or {tasks[0]: result.scores}
    if request.outputs is None:
        return [(task, np.asarray(by_task[task], np.float32), request.binary_output) for task in tasks]
    chosen = []
    for wanted in request.outputs:
        if wanted.name not in by_task:
            raise RequestError(
                "unknown_output", f"output {wanted.name!r} is not one of {list(tasks)}", status=400
            )
        chosen.append((wanted.name, np.asarray(by_task[wanted.name], np.float32), wanted.binary))
    return chosen
