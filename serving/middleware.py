"""Pure-ASGI middleware of the serving app: request metrics and the body-size limit.

Pure ASGI (not ``BaseHTTPMiddleware``) so neither adds a task or a copy of
the body per request.

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
from collections.abc import Iterable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kelp.serving.metrics import ServingMetrics

__all__ = ["BodyLimitMiddleware", "MetricsMiddleware", "body_too_large"]


def body_too_large(limit: int) -> dict[str, Any]:
    return {
        "error": "body_too_large",
        "detail": f"request body exceeds serving.max_body_bytes ({limit} bytes)",
    }


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServingMetrics, endpoints: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = frozenset(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in self.endpoints else "other"
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        started = time.perf_counter()
        self.metrics.inflight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.inflight.dec()
            self.metrics.request_seconds.labels(endpoint=endpoint).observe(time.perf_counter() - started)
            self.metrics.requests.labels(endpoint=endpoint, status=str(status[0])).inc()


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit:
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


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
