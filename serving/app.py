"""The serving HTTP API (FastAPI): score endpoints, health, readiness, metrics, model info.

Endpoints (the contract; see docs/serving.md for examples):

* ``POST /v1/score``: ``{"samples": [{"dense": {...}, "sparse": {...}}, ...]}``;
* ``POST /v1/score/candidates``: ``{"user": {...}, "candidates": [{...}, ...]}``
  (or columnar candidates, see :mod:`kelp.serving.features`);
  both take JSON or msgpack (``Content-Type: application/msgpack``) and answer
  :class:`~kelp.serving.schemas.ScoreResponse` as JSON, or as msgpack when the
  request ``Accept``s it; ``X-Kelp-Synthetic: 1`` scores a request without logging it
  (:mod:`kelp.serving.request_log`);
* ``GET /healthz`` (the process is alive), ``GET /readyz`` (model loaded and
  store reachable, else 503 with a reason), ``GET /metrics`` (Prometheus text
  of this process's registry), ``GET /v1/model``, ``GET /openapi.json``.

Errors are ``{"error": <reason>, "detail": ...}``: 401 on the score
endpoints without the bearer token when ``serving.auth_token_file`` is set
(:mod:`kelp.serving.auth`), 408 for a body slower than
``serving.body_timeout_s`` (on every route that reads a body), 413 for a body above
``max_body_bytes`` or more samples than ``max_samples_per_request``, 422 for
anything else the input gets wrong (the reason names it: ``too_many_ids``,
``unknown_feature``, ``bad_dense``...; ``nonfinite_score`` when an item's score
came out NaN or infinite, never a ``null`` score), 503 when there is no model yet or the
store is unreachable. Bad input is never a 5xx. Before the app, the HTTP
protocol (:mod:`kelp.serving.protocol`) answers 431 ``header_too_large`` and 408
``header_timeout`` for request heads over ``serving.max_header_bytes`` /
``max_headers`` or slower than ``header_timeout_s``.

Concurrency: the score endpoints read the raw body on the event loop and do
everything else (parse with orjson/msgpack, check, fetch rows, forward,
encode) in one call on a worker thread, so the blocking store call and the
model forward never block the loop; torch and the Redis client release the
GIL while they work. ``POST`` on the score routes is answered by
:class:`~kelp.serving.dispatch.ScoreRoutes` before FastAPI's middleware and
router (same metrics, body limit and error shapes, for a fraction of the CPU per
request; docs/performance.md). ``/readyz``
is a plain ``def`` (worker thread) too.
The request models of :mod:`kelp.serving.schemas` describe the bodies in the
OpenAPI spec; the endpoints do not build them (that cost more than the rest of
a request, docs/performance.md).
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.requests import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from kelp.errors import KelpError
from kelp.metrics import leave_multiprocess, scrape
from kelp.serving.auth import BearerAuth, load_token
from kelp.serving.body import MSGPACK, decode_body
from kelp.serving.dispatch import Parse, ScoreRoutes
from kelp.serving.errors import error_answer
from kelp.serving.middleware import BodyLimitMiddleware, MetricsMiddleware, RequestRecorder
from kelp.serving.oip.model import OipModel
from kelp.serving.oip.routes import OIP_ENDPOINTS, add_oip_routes, endpoint_label
from kelp.serving.oip.schemas import InferRequestBody
from kelp.serving.replica import ServingReplica
from kelp.serving.request_log import SYNTHETIC_HEADER
from kelp.serving.schemas import (
    EncodeResponse,
    ErrorResponse,
    ModelInfo,
    ReadyResponse,
    RowsRequest,
    RowsResponse,
    ScoreResponse,
)
from kelp.serving.vectors import VectorLookup

__all__ = ["CONFIG_ENV", "app_from_env", "create_app"]

CONFIG_ENV = "KELP_SERVE_CONFIG"  # config path for worker processes (serving.workers > 1)

ENDPOINTS = (
    "/v1/score",
    "/v1/score/candidates",
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/model",
    "/v1/embeddings",
    "/openapi.json",
    *OIP_ENDPOINTS,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorResponse,
        "description": "serving.auth_token_file is set and the bearer token is "
        "missing (`missing_token`) or wrong (`wrong_token`)",
    },
    408: {"model": ErrorResponse, "description": "the body took longer than serving.body_timeout_s"},
    413: {"model": ErrorResponse, "description": "body or sample count over the configured limits"},
    422: {
        "model": ErrorResponse,
        "description": "invalid input; `error` names the reason (`nonfinite_score`: an item's score "
        "came out NaN or infinite, `detail` names it)",
    },
    503: {"model": ErrorResponse, "description": "no model loaded yet, or the store is unreachable"},
}


def _version() -> str:
    try:
        return version("kelp")
    except PackageNotFoundError:  # a source tree that is not installed
        return "0.0.0+unknown"


def _error(status: int, reason: str, detail: Any) -> JSONResponse:
    return JSONResponse({"error": reason, "detail": detail}, status_code=status)


def _validation_reason(errors: list[dict[str, Any]]) -> tuple[int, str]:
    """Map pydantic's errors to (status, reason) using the event schema's reason names where they fit."""
    for e in errors:
        loc = e["loc"]
        if e["type"] == "too_long" and len(loc) == 2 and loc[1] in ("samples", "candidates"):
            return 413, "too_many_samples"
    types = {e["type"] for e in errors}
    if "json_invalid" in types:
        return 422, "bad_json"
    if any(e["type"] == "too_long" and "sparse" in e["loc"] for e in errors):
        return 422, "too_many_ids"
    if any(e["type"] == "extra_forbidden" and ("dense" in e["loc"] or "sparse" in e["loc"]) for e in errors):
        return 422, "unknown_feature"
    if any("sparse" in e["loc"] for e in errors):
        return 422, "bad_id"
    if any("dense" in e["loc"] for e in errors):
        return 422, "bad_dense"
    return 422, "invalid_request"


def _request_body(model: str) -> dict[str, Any]:
    """The OpenAPI request body of a score endpoint: the same schema as JSON or as msgpack."""
    schema = {"$ref": f"#/components/schemas/{model}"}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}, MSGPACK: {"schema": schema}},
        }
    }


class ServingApp(FastAPI):
    """FastAPI, with ``POST`` on the score routes answered by :class:`ScoreRoutes` before its stack."""

    def __init__(self, routes: ScoreRoutes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.score_routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parse = self.score_routes.match(scope)
        if parse is not None:
            await self.score_routes(scope, receive, send, parse)
        else:
            await super().__call__(scope, receive, send)


def _unauthorized(refusal: dict[str, Any]) -> JSONResponse:
    return JSONResponse(refusal, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="kelp"'})


async def _through_fastapi(routes: ScoreRoutes, request: Request, parse: Parse) -> Response:
    """The score routes when FastAPI's stack does answer them (a request under a ``root_path``)."""
    refusal = routes.refusal(request.headers.get("authorization"))
    if refusal is not None:
        return _unauthorized(refusal)
    raw = await request.body()
    headers = request.headers
    client_id = headers.get("x-request-id")
    synthetic = headers.get(SYNTHETIC_HEADER)
    content, media_type, extra = await run_in_threadpool(
        routes.answer,
        raw,
        headers.get("content-type", "application/json"),
        headers.get("accept", ""),
        parse,
        client_id=None if client_id is None else client_id.encode("latin-1"),
        synthetic=None if synthetic is None else synthetic.encode("latin-1"),
    )
    return Response(content, media_type=media_type, headers={k.decode(): v.decode() for k, v in extra})


def create_app(replica: ServingReplica, *, manage_lifecycle: bool = True) -> FastAPI:
    """The FastAPI app for ``replica``; with ``manage_lifecycle`` the app starts and closes it."""
    models = replica.models
    serving = replica.cfg.serving
    token = load_token(serving.auth_token_file)  # a missing or empty file: UserError before serving

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            replica.start()
        grpc_server = None
        if serving.grpc_port is not None:
            from kelp.serving.oip.grpc_service import start_grpc_server

            grpc_server = start_grpc_server(oip_model, serving.host, serving.grpc_port, _version())
        try:
            yield
        finally:
            if grpc_server is not None:
                grpc_server.stop(grace=5).wait()
            routes.close()
            if manage_lifecycle:
                replica.close()
            leave_multiprocess()

    routes = ScoreRoutes(
        replica.scorer,
        {"/v1/score": replica.parser.samples, "/v1/score/candidates": replica.parser.candidates},
        RequestRecorder(replica.metrics, ENDPOINTS),
        serving.max_body_bytes,
        body_timeout_s=serving.body_timeout_s,
        auth=None if token is None else BearerAuth(token),
        request_log=replica.request_log,
    )
    oip_model = OipModel(replica, routes)

    app = ServingApp(
        routes,
        title="Kelp serving",
        version=_version(),
        description="Scores samples with the latest published model and embeddings from the shared store.",
        lifespan=lifespan,
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        status, reason = _validation_reason(errors)
        return _error(status, reason, errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not decode the body (not UTF-8...): same as bad JSON
            return _error(422, "bad_json", exc.detail)
        reasons = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        return _error(exc.status_code, reasons.get(exc.status_code, "http_error"), exc.detail)

    @app.exception_handler(KelpError)
    async def _kelp_error(_request: Request, exc: KelpError) -> JSONResponse:
        # A RequestError carries its status and reason; any other KelpError is operational: 503.
        status, payload = error_answer(exc)
        return JSONResponse(payload, status_code=status)

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses=_ERRORS,
        summary="Score a batch of samples",
        openapi_extra=_request_body("ScoreRequest"),
    )
    async def score(request: Request) -> Response:
        return await _through_fastapi(routes, request, replica.parser.samples)

    @app.post(
        "/v1/score/candidates",
        response_model=ScoreResponse,
        responses=_ERRORS,
        summary="Score N candidates that share one user's features",
        openapi_extra=_request_body("CandidatesRequest"),
    )
    async def score_candidates(request: Request) -> Response:
        return await _through_fastapi(routes, request, replica.parser.candidates)

    vectors = VectorLookup(
        replica.store,
        replica.parser,
        replica.scorer,
        serving.max_samples_per_request * serving.max_ids_per_feature,
        serving.max_vector_values,
    )

    @app.post(
        "/v1/embeddings",
        response_model=RowsResponse | EncodeResponse,
        responses=_ERRORS,
        summary="Stored rows of ids, or the model's encode() vectors of samples (for an ANN index)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    media: {
                        "schema": {
                            "oneOf": [
                                {"$ref": "#/components/schemas/RowsRequest"},
                                {"$ref": "#/components/schemas/ScoreRequest"},
                            ]
                        }
                    }
                    for media in ("application/json", MSGPACK)
                },
            }
        },
    )
    async def embeddings(request: Request) -> Response:
        refusal = routes.refusal(request.headers.get("authorization"))
        if refusal is not None:
            return _unauthorized(refusal)
        raw = await request.body()
        content_type = request.headers.get("content-type", "application/json")
        # Encoding a large answer takes a while: on the scoring thread, not the event loop.
        answer = await routes.run(lambda: orjson.dumps(vectors.answer(decode_body(raw, content_type))))
        return Response(answer, media_type="application/json")

    @app.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
    def readyz() -> JSONResponse:
        ready, reason = replica.readiness()
        replica.metrics.ready.set(1 if ready else 0)
        current = replica.slot.current
        body = {
            "status": "ready" if ready else "not_ready",
            "reason": reason,
            "model_version": current.version if current else None,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", summary="Prometheus metrics of this process", response_class=Response)
    async def metrics() -> Response:
        return Response(scrape(replica.registry, replica.metrics.local), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/model", response_model=ModelInfo, responses={503: {"model": ErrorResponse}})
    async def model_info() -> JSONResponse:
        current = replica.slot.current
        if current is None:
            return _error(503, "no_model", "no model snapshot loaded yet")
        return JSONResponse(current.info())

    add_oip_routes(app, oip_model, _version())

    def openapi() -> dict[str, Any]:
        """FastAPI's spec plus the request models' schemas (the endpoints read raw bodies)."""
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            _, defs = models_json_schema(
                [
                    (models.score, "validation"),
                    (models.candidates, "validation"),
                    (InferRequestBody, "validation"),
                    (RowsRequest, "validation"),
                ],
                ref_template="#/components/schemas/{model}",
            )
            spec.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(
        BodyLimitMiddleware, max_body_bytes=serving.max_body_bytes, body_timeout_s=serving.body_timeout_s
    )
    app.add_middleware(
        MetricsMiddleware, metrics=replica.metrics, endpoints=ENDPOINTS, template=endpoint_label
    )
    return app


def app_from_env() -> FastAPI:
    """App factory for uvicorn worker processes: reads the config path from ``KELP_SERVE_CONFIG``."""
    from kelp.config import load_config

    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise RuntimeError(f"{CONFIG_ENV} is not set (kelp serve sets it for its workers)")
    from kelp.serving.process import tune_process

    app = create_app(ServingReplica(load_config(path)))
    tune_process()
    return app
