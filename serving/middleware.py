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
  A body not complete ``body_timeout_s`` after the request reached the app is
  answered 408 ``body_timeout`` and the connection closed; a client that goes
  away mid-body is logged in one line (no traceback).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kelp.serving.metrics import ServingMetrics

__all__ = [
    "BodyLimitMiddleware",
    "MetricsMiddleware",
    "RequestRecorder",
    "body_timeout",
    "body_too_large",
    "declared_length",
    "send_response",
]

_log = logging.getLogger(__name__)
_CLOSE = ((b"connection", b"close"),)  # a late body's rest must not be read as a next request


def body_too_large(limit: int) -> dict[str, Any]:
    return {
        "error": "body_too_large",
        "detail": f"request body exceeds serving.max_body_bytes ({limit} bytes)",
    }


def body_timeout(seconds: float) -> dict[str, Any]:
    return {
        "error": "body_timeout",
        "detail": f"the request body did not arrive within serving.body_timeout_s ({seconds:g} s)",
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


class _BodyTimeoutError(Exception):
    """The body was not complete by its deadline (raised from ``receive``, answered 408 here)."""


class BodyLimitMiddleware:
    """The body guards of every route FastAPI answers: size (413) and deadline (408).

    Any route that reads a body (``/v2`` inference, ``/v1/embeddings``, the score routes under a
    ``root_path``) gets them here rather than in its handler, so a new route cannot forget them.
    The deadline covers ``receive`` only until the body is complete: what a handler waits for
    afterwards (a disconnect, while the scoring thread works) is not a body.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 10.0) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope.get("headers", ()))
        if declared is not None and declared > self.limit:
            await _send_json(send, 413, body_too_large(self.limit))
            return
        seen = 0
        complete = False
        started = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def guarded() -> Message:
            nonlocal seen, complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise _BodyTimeoutError from None
            if message["type"] != "http.request":
                complete = True  # a disconnect: Starlette raises ClientDisconnect, answered below
                return message
            seen += len(message.get("body", b""))
            if seen > self.limit:
                # FastAPI re-raises HTTPException from body reading; the app's handler answers 413.
                raise HTTPException(413, detail=body_too_large(self.limit)["detail"])
            complete = not message.get("more_body", False)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded, watched)
        except _BodyTimeoutError:
            if started:  # a handler that answers before reading its body: nothing left to say
                return
            # The rest of the body may still come: close, so it is never read as a next request.
            await _send_json(send, 408, body_timeout(self.timeout_s), _CLOSE)
        except ClientDisconnect:
            # The client went away mid-body: routine for a server, one line and no traceback.
            _log.info(
                "client %s went away before its %s %s body was complete",
                _client(scope),
                scope.get("method", ""),
                scope.get("path", ""),
            )


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return "?" if not client else f"{client[0]}:{client[1]}"


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


async def _send_json(
    send: Send, status: int, payload: dict[str, Any], extra_headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    await send_response(send, status, json.dumps(payload).encode(), b"application/json", extra_headers)
