"""Pure-ASGI middleware of the serving app: request metrics and the body-size limit.

Pure ASGI (not ``BaseHTTPMiddleware``) so neither adds a task or a copy of
the body per request. The score routes skip this stack
(:mod:`kelp.serving.dispatch`) and use the same pieces directly:
:class:`RequestRecorder`, :func:`declared_length`, :func:`body_too_large`.

* :class:`MetricsMiddleware`: ``kelp_serving_request_seconds{endpoint}``,
  ``kelp_serving_requests_total{endpoint,status}`` and the in-flight gauge.
  ``endpoint`` is the route path for known routes and ``other`` for anything
  else, so a scanner cannot blow up label cardinality.
* :class:`BodyLimitMiddleware`: a declared ``Content-Length`` above
  ``max_body_bytes`` is answered 413 before the body is read; a chunked body is
  counted as it streams, and the request fails with 413 once it passes the limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kelp.serving.metrics import ServingMetrics

__all__ = [
    "BodyLimitMiddleware",
    "MetricsMiddleware",
    "RequestRecorder",
    "body_too_large",
    "declared_length",
    "send_response",
]


def body_too_large(limit: int) -> dict[str, Any]:
    return {
        "error": "body_too_large",
        "detail": f"request body exceeds serving.max_body_bytes ({limit} bytes)",
    }


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length`` (-1 when it is not a number), None when it has none."""
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


class RequestRecorder:
    """Records one request in the serving metrics; the labelled children are looked up once.

    ``prometheus_client``'s ``labels()`` takes a lock and builds a key on every
    call; a request records three metrics, so the children are cached here.
    """

    def __init__(
        self,
        metrics: ServingMetrics,
        endpoints: Iterable[str],
        template: Callable[[str], str | None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.endpoints = frozenset(endpoints)
        self.template = template
        self._seconds: dict[str, Histogram] = {}
        self._answered: dict[tuple[str, int], Counter] = {}

    def endpoint(self, path: str) -> str:
        """The label of ``path``: itself, its route template (paths with names in them), or "other"."""
        if path in self.endpoints:
            return path
        label = None if self.template is None else self.template(path)
        return label if label is not None and label in self.endpoints else "other"

    def start(self) -> float:
        self.metrics.inflight.inc()
        return time.perf_counter()

    def finish(self, endpoint: str, status: int, started: float) -> None:
        elapsed = time.perf_counter() - started
        self.metrics.inflight.dec()
        seconds = self._seconds.get(endpoint)
        if seconds is None:
            seconds = self._seconds[endpoint] = self.metrics.request_seconds.labels(endpoint=endpoint)
        seconds.observe(elapsed)
        answered = self._answered.get((endpoint, status))
        if answered is None:
            answered = self.metrics.requests.labels(endpoint=endpoint, status=str(status))
            self._answered[(endpoint, status)] = answered
        answered.inc()


class MetricsMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        metrics: ServingMetrics,
        endpoints: Iterable[str],
        template: Callable[[str], str | None] | None = None,
    ) -> None:
        self.app = app
        self.recorder = RequestRecorder(metrics, endpoints, template)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = self.recorder.endpoint(scope.get("path", ""))
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        started = self.recorder.start()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.recorder.finish(endpoint, status[0], started)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope.get("headers", ()))
        if declared is not None and declared > self.limit:
            await _send_json(send, 413, body_too_large(self.limit))
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # FastAPI re-raises HTTPException from body reading; the app's handler answers 413.
                    raise HTTPException(413, detail=body_too_large(self.limit)["detail"])
            return message

        await self.app(scope, limited, send)


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    media_type: bytes,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A complete response (``Content-Type``, ``Content-Length``, ``extra_headers``) in two ASGI messages."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", media_type),
                (b"content-length", str(len(body)).encode()),
                *extra_headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    await send_response(send, status, json.dumps(payload).encode(), b"application/json")
