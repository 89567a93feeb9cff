"""Request heads and bodies are bounded: ``kelp serve`` as a real process, abused over raw sockets.

The replica runs with the default ``serving.max_header_bytes`` (64 KiB), a
small ``serving.max_headers`` and a short ``serving.header_timeout_s`` (so the
slow-client checks are quick), and ``serving.max_body_bytes`` of
helpers.small_config (64 KiB). The oversized heads and bodies are sent a chunk
at a time, looking for an answer after each: the server must answer (and
close) long before the client has sent it all, which is what shows that it
stopped reading instead of buffering.
"""

from __future__ import annotations

import pickle
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
import yaml

from kelp.config import ServingConfig
from kelp.harness import RedisServer, free_port
from kelp.serving.process import uvicorn_options
from kelp.serving.protocol import HeadLimits

from .helpers import small_config, start_serve, wait_until

pytestmark = pytest.mark.integration

MAX_HEADERS = 20
HEADER_TIMEOUT_S = 2.0
CHUNK = 16 * 1024
HOSTILE = 8 * 1024 * 1024  # what the abuser would send if nobody stopped it
DEADLINE_S = 60  # a bound on waiting for the server, not a timing check


@pytest.fixture(scope="module")
def port(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("head-limits")
    port = free_port()
    cfg = small_config(
        redis_server.url,
        tmp,
        serving={
            "host": "127.0.0.1",
            "port": port,
            "max_headers": MAX_HEADERS,
            "header_timeout_s": HEADER_TIMEOUT_S,
        },
    )
    assert cfg.serving.max_header_bytes == 64 * 1024  # the default is what is exercised
    path = tmp / "kelp.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    proc = start_serve(path)
    try:
        wait_until(lambda: _healthy(port) or proc.poll() is not None, timeout_s=DEADLINE_S, what="kelp serve")
        assert proc.poll() is None, proc.communicate()[0]
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)


def _answered(sock: socket.socket) -> bool:
    """Whether the server has written something (or closed) without blocking for long."""
    return bool(select.select([sock], [], [], 0.02)[0])


def _trickle(sock: socket.socket, head: bytes, chunk: bytes, total: int, end: bytes) -> int:
    """Send ``head``, then ``chunk`` after ``chunk`` (``total`` bytes) and ``end``, stopping as soon as
    the server answers or closes; the bytes of chunks sent."""
    sock.sendall(head)
    sent = 0
    try:
        while sent < total:
            if _answered(sock):
                return sent
            sock.sendall(chunk)
            sent += len(chunk)
        sock.sendall(end)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def _response(sock: socket.socket, then_closed: bool = True) -> tuple[int, dict[str, str], bytes, bool]:
    """Status, headers, body of a response on ``sock``, and (with ``then_closed``: waiting for it)
    whether the server then closed the connection."""
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
    closed = False
    if then_closed:
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
    return int(status_line.split(" ")[1]), headers, body, closed


def _assert_error(body: bytes, reason: str, names: str) -> None:
    payload = orjson.loads(body)
    assert set(payload) == {"error", "detail"} and payload["error"] == reason, payload
    assert names in payload["detail"], payload


# -- head size ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/v1/score"])
def test_a_huge_header_is_431_before_it_is_all_sent(port: int, path: str) -> None:
    with _connect(port) as sock:
        head = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode()
        sent = _trickle(sock, head, b"a" * CHUNK, HOSTILE, b"\r\n\r\n")
        status, headers, body, closed = _response(sock)
    assert status == 431 and headers["connection"] == "close" and closed
    _assert_error(body, "header_too_large", "serving.max_header_bytes (65536 bytes)")
    assert sent < HOSTILE // 8, f"the server read {sent} header bytes before refusing"


def test_many_header_lines_of_many_bytes_are_431(port: int) -> None:
    """Under max_headers lines, but each one long: the byte bound still applies."""
    with _connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        sent = _trickle(sock, b"", b"X-Long: " + b"b" * (8 * 1024) + b"\r\n", 15 * 8 * 1024, b"\r\n")
        status, _, body, closed = _response(sock)
    assert status == 431 and closed and sent <= 15 * 8 * 1024
    _assert_error(body, "header_too_large", "serving.max_header_bytes")


def test_a_head_under_the_limit_is_answered(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (60 * 1024) + b"\r\n\r\n")
        status, _, body, _ = _response(sock)
    assert status == 200 and orjson.loads(body) == {"status": "ok"}


def test_a_long_url_counts_too(port: int) -> None:
    with _connect(port) as sock:
        _trickle(sock, b"GET /healthz?q=", b"c" * CHUNK, HOSTILE, b" HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body, closed = _response(sock)
    assert status == 431 and closed
    _assert_error(body, "header_too_large", "serving.max_header_bytes")


# -- header count ---------------------------------------------------------------------------------


def _with_headers(count: int) -> bytes:
    lines = [b"Host: x"] + [b"X-%d: %d" % (i, i) for i in range(count - 1)]
    return b"GET /healthz HTTP/1.1\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


def test_max_headers_lines_are_answered_one_more_is_431(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(_with_headers(MAX_HEADERS))
        assert _response(sock)[0] == 200
    with _connect(port) as sock:
        sock.sendall(_with_headers(MAX_HEADERS + 1))
        status, _, body, closed = _response(sock)
    assert status == 431 and closed
    _assert_error(body, "header_too_large", f"serving.max_headers ({MAX_HEADERS})")


# -- slow and idle clients ------------------------------------------------------------------------


def test_a_head_trickled_a_byte_at_a_time_is_408_and_closed(port: int) -> None:
    """Slowloris: each byte comes in well within any idle timeout, but the head never ends."""
    with _connect(port) as sock:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
        sock.sendall(head)
        sent = 0
        while not select.select([sock], [], [], 0.05)[0]:
            sock.sendall(b"s")
            sent += 1
            assert sent < DEADLINE_S / 0.05, "the server never let the slow head go"
        status, headers, body, closed = _response(sock)
    assert status == 408 and headers["connection"] == "close" and closed
    _assert_error(body, "header_timeout", f"serving.header_timeout_s ({HEADER_TIMEOUT_S:g} s)")


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with _connect(port) as sock:
        assert sock.recv(1) == b""  # closed by the server (the socket timeout is DEADLINE_S)


def test_a_connection_sending_whole_heads_in_time_is_kept_past_the_deadline(port: int) -> None:
    """The deadline is per head, not per connection: prompt requests on one connection, spread over
    more than twice ``header_timeout_s``, are all answered (the connection is never dropped)."""
    with _connect(port) as sock:
        for i in range(9):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-N: %d\r\n\r\n" % i)
            status, headers, _, _ = _response(sock, then_closed=False)
            assert status == 200 and headers.get("connection") != "close", (i, headers)
            time.sleep(HEADER_TIMEOUT_S / 4)  # well within uvicorn's keep-alive timeout (5 s)


# -- body size ------------------------------------------------------------------------------------


def test_a_streamed_body_over_the_limit_is_413_before_it_is_all_sent(port: int) -> None:
    head = (
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n" % CHUNK + b" " * CHUNK + b"\r\n"
    with _connect(port) as sock:
        sent = _trickle(sock, head, chunk, HOSTILE, b"0\r\n\r\n")
        status, _, body, _ = _response(sock)
    assert status == 413
    _assert_error(body, "body_too_large", "serving.max_body_bytes")
    assert sent < HOSTILE // 8, f"the server read {sent} body bytes before refusing"


def test_a_declared_body_over_the_limit_is_413_before_a_byte_of_it(port: int) -> None:
    head = (
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    )
    with _connect(port) as sock:
        sock.sendall(head % HOSTILE)
        status, _, body, _ = _response(sock)
    assert status == 413
    _assert_error(body, "body_too_large", "serving.max_body_bytes")


# -- configuration --------------------------------------------------------------------------------


def test_the_limits_come_from_the_serving_config_and_pickle_into_workers() -> None:
    """``serving.workers > 1`` hands uvicorn's config to spawned processes: the protocol must pickle."""
    serving = ServingConfig(max_header_bytes=4096, max_headers=7, header_timeout_s=3.0)
    http = pickle.loads(pickle.dumps(uvicorn_options(serving)["http"]))
    assert http.keywords == {"limits": HeadLimits(max_bytes=4096, max_count=7, timeout_s=3.0)}
    defaults = ServingConfig()
    assert (defaults.max_header_bytes, defaults.max_headers, defaults.header_timeout_s) == (65536, 100, 10.0)


def test_uvicorn_picks_the_guarded_protocol() -> None:
    import uvicorn

    from kelp.serving.protocol import GuardedHttpToolsProtocol

    config = uvicorn.Config(lambda *_: None, **uvicorn_options(ServingConfig()))
    config.load()
    assert config.http_protocol_class.func is GuardedHttpToolsProtocol  # type: ignore[attr-defined]
