"""The two score routes as a plain ASGI handler in front of FastAPI (the hot path).

Through FastAPI, a score request passes two middleware wrappers, Starlette's
error and exception middleware, the router, a ``Request`` object, anyio's
thread hand-off (a checkpoint, a capacity limiter and a cancel scope on the
event loop) and a ``Response`` object: with the work stubbed out, that costs
far more CPU per request than this path (docs/performance.md). A ``POST`` to
``/v1/score`` or ``/v1/score/candidates`` is answered by :class:`ScoreRoutes`
directly; every other request goes to FastAPI unchanged. The routes stay declared in FastAPI
(the OpenAPI spec, and the same handler behind them).

What the FastAPI stack did for these routes is kept, with the same pieces:

* metrics: :class:`~kelp.serving.middleware.RequestRecorder` (same names, labels and statuses);
* the body limit: 413 ``body_too_large`` on a declared ``Content-Length`` over
  ``serving.max_body_bytes`` before reading, and once a streamed body passes it;
* errors: :func:`~kelp.serving.errors.error_answer`, the mapping the app's
  exception handlers use; an unexpected exception is left to uvicorn (500), as before.

Two guards run before any work: the optional bearer token
(:class:`~kelp.serving.auth.BearerAuth`: 401 before the body is read), and a
deadline on the body (``serving.body_timeout_s``: 408 ``body_timeout``), so a
client that trickles its body holds one idle connection and nothing else.
Neither costs the fast path more than a header comparison and one timer handle.

The work itself (decode, check, fetch, forward, encode) runs on a thread of
its own (:class:`ScoringLane`), not on the event loop: a store that hangs
(up to ``store.socket_timeout_s`` per attempt) must not stall ``/healthz``,
and a large request must not hold up the loop. The lane is one thread and a
queue: the outcome comes back as one ``call_soon_threadsafe`` that settles the
loop's own future, about half the CPU of ``run_in_executor`` (which chains a
second future to the first, with callbacks on both sides).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

import orjson
from starlette.types import Receive, Scope, Send

from kelp.consumers.batch import MicroBatch
from kelp.errors import KelpError
from kelp.serving.auth import BearerAuth
from kelp.serving.body import decode_body, encode_body, wants_msgpack
from kelp.serving.errors import error_answer
from kelp.serving.middleware import (
    RequestRecorder,
    body_timeout,
    body_too_large,
    declared_length,
    send_response,
)
from kelp.serving.request_log import (
    REQUEST_ID_HEADER,
    SYNTHETIC_HEADER,
    RequestLog,
    client_request_id,
    is_synthetic,
    new_request_id,
)
from kelp.serving.scorer import Scorer, ScoreResult

__all__ = ["VERSION_HEADER", "Parse", "ScoreRoutes", "ScoringLane", "body_timeout"]

Parse = Callable[[Any], MicroBatch]
_T = TypeVar("_T")

Settle = Callable[[bool, Any], None]
"""How the lane hands back a call's outcome: ``(True, its result)`` or ``(False, what it raised)``."""
_STOP = object()


class ScoringLane:
    """The scoring thread: calls run one at a time, in arrival order.

    One thread: a request holds the GIL for most of its work; a second thread would overlap only the
    store round trip, and every GIL release (each torch op, each socket call) between two runnable
    threads becomes a switch, so more threads cost CPU and tail latency (docs/performance.md).
    Waiting requests queue first come first served, and the event loop stays free for /healthz and
    /metrics even if the store hangs.

    The thread starts with the first call and stops at :meth:`close` once the calls queued before
    it have run; a call after :meth:`close` starts a new one.
    """

    def __init__(self, name: str = "kelp-score_0") -> None:
        self.name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def run(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` on the lane, awaited on the running event loop."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: no one waits, and the lane goes on
                loop.call_soon_threadsafe(_settle, done, ok, value)

        self._submit(work, args, settle)
        return await done

    def run_blocking(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` on the lane, for a caller on a thread of its own: it waits for the outcome."""
        done: Future[_T] = Future()

        def settle(ok: bool, value: Any) -> None:
            if ok:
                done.set_result(value)
            else:
                done.set_exception(value)

        self._submit(work, args, settle)
        return done.result()

    def close(self) -> None:
        """Let the thread finish what is queued, then stop; does not wait for it."""
        with self._lock:
            if self._thread is not None:
                self._calls.put(_STOP)
                self._thread = None
                self._calls = queue.SimpleQueue()

    def _submit(self, work: Callable[..., Any], args: tuple[Any, ...], settle: Settle) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_serve, args=(self._calls,), name=self.name, daemon=True
                )
                self._thread.start()
            self._calls.put((work, args, settle))


def _serve(calls: queue.SimpleQueue[Any]) -> None:
    """The lane's thread: run each call and hand back its outcome, until the stop mark."""
    while True:
        call = calls.get()
        if call is _STOP:
            return
        work, args, settle = call
        del call  # the last request's objects are not kept alive while the lane waits
        try:
            result = work(*args)
        except BaseException as exc:  # handed to the caller, as an executor's future does
            settle(False, exc)
        else:
            settle(True, result)
            del result
        del work, args, settle


def _settle(done: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Settle the awaiting request's future on the loop, unless its task was cancelled meanwhile."""
    if done.done():
        return
    if ok:
        done.set_result(value)
    else:
        done.set_exception(value)


VERSION_HEADER = "kelp-model-version"
"""The response header naming the model version that scored a request (``/v1`` and ``/v2``)."""
VERSION_HEADER_BYTES = VERSION_HEADER.encode()
REQUEST_ID_HEADER_BYTES = REQUEST_ID_HEADER.encode()
SYNTHETIC_HEADER_BYTES = SYNTHETIC_HEADER.encode()
Headers = tuple[tuple[bytes, bytes], ...]


class _BodyTooLargeError(Exception):
    pass


_WWW_AUTHENTICATE = ((b"www-authenticate", b'Bearer realm="kelp"'),)
_CLOSE = ((b"connection", b"close"),)  # a late body's rest must not be left to arrive on the connection


class ScoreRoutes:
    """Answers ``POST`` on the score paths; :meth:`match` says whether a request is one of them."""

    def __init__(
        self,
        scorer: Scorer,
        parsers: dict[str, Parse],
        recorder: RequestRecorder,
        max_body_bytes: int,
        *,
        body_timeout_s: float = 10.0,
        auth: BearerAuth | None = None,
        request_log: RequestLog | None = None,
    ) -> None:
        self.scorer = scorer
        self.request_log = request_log
        self.parsers = parsers
        self.recorder = recorder
        self.limit = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.auth = auth
        self._lane = ScoringLane()

    def match(self, scope: Scope) -> Parse | None:
        """The parser of a score route when ``scope`` is a POST to one, else None."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None  # a root_path (behind a proxy) is left to Starlette's path rules
        return self.parsers.get(scope["path"])

    def answer(
        self,
        raw: bytes,
        content_type: str,
        accept: str,
        parse: Parse,
        *,
        client_id: bytes | None = None,
        synthetic: bytes | None = None,
    ) -> tuple[bytes, str, Headers]:
        """Decode, check, score, encode: one worker-thread call per request, no per-candidate objects.

        Returns the body, its media type and the headers naming the model version
        (and, with the request log on and the request not marked synthetic, the request's id).
        """
        skip_log = is_synthetic(synthetic)
        batch = parse(decode_body(raw, content_type))
        result = self.scorer.score(batch)
        body = result.to_json()
        headers: Headers = ((VERSION_HEADER_BYTES, b"%d" % result.model_version),)
        logged_as = self.log(client_id, batch, result, synthetic=skip_log)
        if logged_as is not None:
            body["request_id"] = logged_as
            headers += ((REQUEST_ID_HEADER_BYTES, logged_as.encode()),)
        content, media = encode_body(body, wants_msgpack(accept))
        return content, media, headers

    def refusal(self, authorization: str | None) -> dict[str, Any] | None:
        """The 401 body for a request with this ``Authorization`` header, or None when it may pass."""
        if self.auth is None:
            return None
        return self.auth.refusal(None if authorization is None else authorization.encode("latin-1"))

    def log(
        self,
        client_id: bytes | str | None,
        batch: MicroBatch,
        result: ScoreResult,
        *,
        synthetic: bool = False,
    ) -> str | None:
        """Record a scored request in the request log and return the id it is logged under (new for each
        request; the client's own id, when valid, is kept beside it); None when the log is off or the
        request is synthetic (a probe's or a test's: no one saw its scores, so the join must not train
        on it; counted instead)."""
        if self.request_log is None:
            return None
        if synthetic:
            self.request_log.skip_synthetic()
            return None
        logged_as = new_request_id()
        self.request_log.record(logged_as, batch, result, client_request_id(client_id))
        return logged_as

    async def __call__(self, scope: Scope, receive: Receive, send: Send, parse: Parse) -> None:
        endpoint = scope["path"]
        started = self.recorder.start()
        status = 500  # what the metrics record when no answer was sent (a client that went away)
        try:
            content_type, accept, declared, authorization = "application/json", "", None, None
            client_id: bytes | None = None
            synthetic: bytes | None = None
            for name, value in scope["headers"]:
                if name == b"content-type":
                    content_type = value.decode("latin-1")
                elif name == b"accept":
                    accept = value.decode("latin-1")
                elif name == b"content-length":
                    declared = declared_length(((name, value),))
                elif name == b"authorization":
                    authorization = value
                elif name == b"x-request-id":
                    client_id = value
                elif name == SYNTHETIC_HEADER_BYTES:
                    synthetic = value
            refusal = None if self.auth is None else self.auth.refusal(authorization)
            if refusal is not None:
                status = 401
                await send_response(send, 401, orjson.dumps(refusal), b"application/json", _WWW_AUTHENTICATE)
                return
            headers: Headers = ()
            if declared is not None and declared > self.limit:
                status, content, media = 413, orjson.dumps(body_too_large(self.limit)), "application/json"
            else:
                try:
                    raw = await self._body(receive)
                except _BodyTooLargeError:
                    status, content, media = 413, orjson.dumps(body_too_large(self.limit)), "application/json"
                except TimeoutError:
                    status, headers = 408, _CLOSE
                    content, media = orjson.dumps(body_timeout(self.body_timeout_s)), "application/json"
                else:
                    if raw is None:
                        return
                    answer = partial(self.answer, client_id=client_id, synthetic=synthetic)
                    status, content, media, headers = await self._answer(
                        answer, raw, content_type, accept, parse
                    )
            await send_response(send, status, content, media.encode(), headers)
        finally:
            self.recorder.finish(endpoint, status, started)

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole body (None if the client disconnected); :class:`_BodyTooLargeError` past the limit,
        :class:`TimeoutError` when it takes longer than ``body_timeout_s``."""
        chunks: list[bytes] = []
        seen = 0
        async with asyncio.timeout(self.body_timeout_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > self.limit:
                    raise _BodyTooLargeError
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _answer(
        self,
        answer: Callable[..., tuple[bytes, str, Headers]],
        raw: bytes,
        content_type: str,
        accept: str,
        parse: Parse,
    ) -> tuple[int, bytes, str, Headers]:
        """``answer`` (:meth:`answer` with the request's marks) on the scoring thread, errors as answers."""
        try:
            content, media, headers = await self.run(answer, raw, content_type, accept, parse)
        except KelpError as exc:
            status, payload = error_answer(exc)
            return status, orjson.dumps(payload), "application/json", ()
        return 200, content, media, headers

    async def run(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` on the scoring thread: every route that scores queues there, in arrival order."""
        return await self._lane.run(work, *args)

    def run_blocking(self, work: Callable[..., _T], *args: Any) -> _T:
        """:meth:`run` for a caller on a thread of its own (a gRPC handler): it waits for the result."""
        return self._lane.run_blocking(work, *args)

    def close(self) -> None:
        """Stop the scoring thread (once the server has finished its requests)."""
        self._lane.close()
