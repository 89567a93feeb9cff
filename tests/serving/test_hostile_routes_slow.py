"""Slow and abandoned bodies on every route that reads one, over raw sockets to a real replica.

``serving.body_timeout_s`` bounds the body of ``/v1/score`` (answered before
FastAPI), and of every route FastAPI answers (``/v2`` inference,
``/v1/embeddings``): a client trickling its body a byte at a time gets
``408 body_timeout`` and the connection closed. A client that goes away
mid-body is one quiet log line, never a traceback.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from pathlib import Path

import orjson
import pytest

from kelp.config import KelpConfig

from .conftest import Live
from .helpers import DEPLOYMENT, small_config, wait_until

pytestmark = pytest.mark.integration

BODY_TIMEOUT_S = 1.0
DEADLINE_S = 60  # a bound on waiting for the server, not a timing check
ROUTES = {
    "/v1/score": b'{"samples": [{}]}',
    "/v1/embeddings": b'{"table": "ads", "ids": [1, 2, 3]}',
    f"/v2/models/{DEPLOYMENT}/infer": b'{"inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", '
    b'"data": [3]}]}',
    f"/v2/models/{DEPLOYMENT}/versions/1/infer": b'{"inputs": [{"name": "C1", "shape": [1], '
    b'"datatype": "INT64", "data": [3]}]}',
}


@pytest.fixture
def cfg(redis_url: str, tmp_path: Path) -> KelpConfig:
    """The serving fixtures' config with a short body deadline (overrides conftest's)."""
    return small_config(redis_url, tmp_path, serving={"body_timeout_s": BODY_TIMEOUT_S})


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _trickle(sock: socket.socket, rest: bytes) -> None:
    """Send ``rest`` a byte at a time, slower than the deadline allows, until the server answers."""
    deadline = time.monotonic() + DEADLINE_S
    for byte in rest[:-1]:  # the last byte never comes
        if select.select([sock], [], [], BODY_TIMEOUT_S / 4)[0] or time.monotonic() > deadline:
            return
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return
    select.select([sock], [], [], DEADLINE_S)


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes, bool]:
    """Status, headers and body of the one response on ``sock``, and whether the server then closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"closed without an answer after {data!r}"
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        part = sock.recv(65536)
        assert part, "closed in the middle of the body"
        body += part
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:
        closed = True
    return int(status_line.split(" ")[1]), headers, body, closed


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_trickled_body_is_408_and_closed_on_every_route(live: Live, path: str) -> None:
    body = ROUTES[path]
    with socket.create_connection(("127.0.0.1", live.server.port), timeout=DEADLINE_S) as sock:
        sock.sendall(_head(path, len(body)) + body[:3])
        _trickle(sock, body[3:])
        status, headers, reply, closed = _answer(sock)
    assert status == 408, reply
    payload = orjson.loads(reply)
    assert payload["error"] == "body_timeout" and "serving.body_timeout_s" in payload["detail"], payload
    assert headers.get("connection") == "close" and closed
    # the replica answers the next client normally
    r = live.client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", [p for p in ROUTES if p != "/v1/score"])
def test_a_client_gone_mid_body_is_one_quiet_line(
    live: Live, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    body = ROUTES[path]
    with socket.create_connection(("127.0.0.1", live.server.port), timeout=DEADLINE_S) as sock:
        sock.sendall(_head(path, len(body)) + body[:3])
        time.sleep(0.1)  # let the request reach the app before the client goes
    wait_until(
        lambda: any("went away" in r.getMessage() for r in caplog.records),
        timeout_s=DEADLINE_S,
        what="the disconnect's log line",
    )
    assert live.client.get("/healthz").status_code == 200
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]
    lines = [r.getMessage() for r in caplog.records if "went away" in r.getMessage()]
    assert len(lines) == 1 and path in lines[0], lines
