"""The replica's HTTP/1.1 protocol under uvicorn: httptools, with a bounded request head.

uvicorn's httptools protocol (what ``http="auto"`` picks) puts no limit on a
request's head: the request line and headers are buffered for as long as a
client keeps sending them, and a connection that never finishes its head is
never timed out: a few clients sending never-ending headers grow the replica
without bound. This subclass adds three bounds, all from the serving config
(:class:`HeadLimits`):

* ``max_header_bytes``: once a head passes this many bytes (the request line,
  the names and values, and each header line's ``": "`` and CRLF), the client
  is answered ``431 {"error": "header_too_large", ...}`` and the connection is
  closed, before the rest is read. A head arriving over several reads is
  counted per read as well, so what is buffered stays within the limit plus
  two reads;
* ``max_headers``: a head with more header lines is answered 431 likewise;
* ``header_timeout_s``: a head must be complete this many seconds after it
  began (or after the connection opened, for its first request), else the
  client is answered ``408 {"error": "header_timeout", ...}`` (or, if it sent
  nothing, the connection is just closed). A client trickling one header byte
  at a time holds one connection for that long, then loses it.

The checks run in the parser callbacks uvicorn already calls: a few integer
additions per header, nothing per byte. The deadline is one timer per
connection, re-armed only when it fires (not armed and cancelled per request).
The body is bounded by the app (``serving.max_body_bytes``, 413) and by
uvicorn's flow control.

:func:`http_protocol` gives the ``http=`` argument of ``uvicorn.Config``; it is a
``functools.partial`` of a module-level class, so it pickles into uvicorn's
worker processes (``serving.workers > 1``).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

__all__ = ["GuardedHttpToolsProtocol", "HeadLimits", "http_protocol"]

_LINE_OVERHEAD = 4  # ": " and CRLF around each header's name and value
_Base = HttpToolsProtocol  # its callbacks are called by name: cheaper than super() per header


@dataclass(frozen=True)
class HeadLimits:
    """Bounds on one request's head; see the module docstring for what each answers."""

    max_bytes: int = 64 * 1024
    max_count: int = 100
    timeout_s: float = 10.0


class _HeadTooLargeError(Exception):
    """Raised from a parser callback to stop parsing; httptools re-raises it as its callback error."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HeadLimits` enforced per request head."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: HeadLimits = HeadLimits(),
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self._head_open = False  # a request head has begun and is not complete yet
        self._head_reads = 0  # bytes of the reads that fell wholly inside the open head
        self._head_fields = 0  # bytes of its request line and complete headers
        self._head_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_began = 0.0  # loop time the open head began
        self._begun = False  # whether any request has begun on this connection

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.timeout_s)  # a client that connects and sends nothing is let go then

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        inside = self._head_open
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLargeError):
                self._refuse(431, "header_too_large", str(exc.__context__))
            else:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return
        if inside and self._head_open:  # the whole read is part of one unfinished head
            self._head_reads += len(data)
            if self._head_reads > self.limits.max_bytes and not self.transport.is_closing():
                self._refuse(431, "header_too_large", self._too_many_bytes())

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        _Base.on_message_begin(self)
        self._head_open = self._begun = True
        self._head_began = self.loop.time()
        self._head_reads = self._head_fields = self._head_count = 0
        if self._head_timer is None:
            self._arm(self.limits.timeout_s)

    def on_url(self, url: bytes) -> None:
        self._head_fields += len(url)
        if self._head_fields > self.limits.max_bytes:
            raise _HeadTooLargeError(self._too_many_bytes())
        _Base.on_url(self, url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += len(name) + len(value) + _LINE_OVERHEAD
        self._head_count += 1
        if self._head_fields > self.limits.max_bytes:
            raise _HeadTooLargeError(self._too_many_bytes())
        if self._head_count > self.limits.max_count:
            raise _HeadTooLargeError(f"more than serving.max_headers ({self.limits.max_count}) header lines")
        _Base.on_header(self, name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        _Base.on_headers_complete(self)

    # ------------------------------------------------------------------ the head deadline

    def _arm(self, delay: float) -> None:
        self._head_timer = self.loop.call_later(delay, self._check_head)

    def _check_head(self) -> None:
        """The deadline, checked lazily: a connection keeps one timer across the requests it sends
        in time (re-armed for what is left of the open head's time), not one timer per request."""
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self._head_open:
            if not self._begun:  # connected and sent nothing
                self.transport.close()
            return  # between requests: uvicorn's keep-alive timeout; the next head arms again
        left = self._head_began + self.limits.timeout_s - self.loop.time()
        if left > 0:
            self._arm(left)
        elif self.cycle is not None and not self.cycle.response_complete:
            self._arm(self.limits.timeout_s)  # a pipelined head waits on the response before it
        else:
            self._refuse(
                408,
                "header_timeout",
                "the request head did not arrive within serving.header_timeout_s "
                f"({self.limits.timeout_s:g} s)",
            )

    # ------------------------------------------------------------------ refusals

    def _too_many_bytes(self) -> str:
        return f"request head over serving.max_header_bytes ({self.limits.max_bytes} bytes)"

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """Answer ``status`` with the error shape and close; a response still being written is cut
        instead (a pipelined head must not land inside it)."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        body = orjson.dumps({"error": reason, "detail": detail})
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
        self.transport.write(b"".join(head))
        self.transport.close()


def http_protocol(limits: HeadLimits) -> functools.partial[GuardedHttpToolsProtocol]:
    """The ``http=`` argument of ``uvicorn.Config`` for a replica with these head limits."""
    return functools.partial(GuardedHttpToolsProtocol, limits=limits)
