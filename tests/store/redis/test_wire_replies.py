"""The reply parsers read a recorded reply stream the same however the socket hands it over.

``read_rows`` and ``read_ints`` parse raw bytes as they arrive and hand the rest
to hiredis, or on one ``ReplyStream`` to the next run's parse; ``read_replies``
drives hiredis by hand. A reply cut anywhere (inside a length header, between a
value and its CRLF, inside ``$-1``/``_`` or an error line) must neither be
misread nor leave the connection out of step. So each stream is recorded once
from a real redis-server (RESP2, and RESP3 after ``HELLO 3``), then replayed to
a real redis-py connection split at every byte boundary: the first part is
written, the second only once the client has read the first, so the parser's
first receive ends exactly at the cut. Each split parse must equal the unsplit
parse, and the reply after the run (a ``PING``'s) must still come back to
redis-py.

The client is a redis-py Unix socket connection to a small server in a thread:
it relays the connection handshake (``HELLO``, ``CLIENT SETINFO``) to the real
redis-server, then plays the recorded bytes.
"""

from __future__ import annotations

import array
import fcntl
import queue
import select
import socket
import termios
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hiredis
import numpy as np
import pytest
import redis

from kelp.harness import RedisServer
from kelp.store.redis._wire.int_replies import read_ints
from kelp.store.redis._wire.packing import read_replies
from kelp.store.redis._wire.row_replies import RowReplies, read_rows
from kelp.store.redis._wire.stream import ReplyStream
from kelp.store.redis.client_internals import connection_socket, reads_from_socket

WIDTH = 16
KEY = b"wire:rows"
COUNTS = b"wire:counts"
STRING = b"wire:string"


def _command(*words: bytes) -> bytes:
    """One command as a RESP array of bulk strings, as every client sends it."""
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def _id(i: int) -> bytes:
    return i.to_bytes(8, "big")


def _values() -> list[bytes]:
    """Row values whose bytes look like replies: a trailing ``_``, ``$-1\\r\\n``, ``_\\r\\n``, a header."""
    return [
        b"plain row value!",
        b"ends in undersc_",
        b"ab$-1\r\ncdefghijk",
        b"_\r\n_\r\n_\r\n_\r\n_\r\n_",
        b"$16\r\n0123456789\r\n",
    ]


def _setup() -> list[bytes]:
    """Commands that give the recorded reads something to read (their replies are not recorded)."""
    rows = [_command(b"HSET", KEY, _id(i), v) for i, v in enumerate(_values())]
    return [*rows, _command(b"SET", STRING, b"not a hash")]


ROW_RUN = [_command(b"HGET", KEY, _id(i)) for i in (0, 7, 1, 2, 8, 3, 9)]
"""Values and nils (ids 7, 8, 9 have no row), in an order that puts a nil between values."""
LOOKALIKE_RUN = [_command(b"HGET", KEY, _id(i)) for i in (4, 7, 0)]
"""A value that holds a whole value record's header: read_rows declines it and hiredis reads the run."""
ROW_RUN_WITH_ERROR = [_command(b"HGET", KEY, _id(0)), _command(b"HGET", STRING, _id(0)), ROW_RUN[2]]
INT_RUN = [
    _command(b"HSET", COUNTS, b"a", b"1"),
    _command(b"HSET", COUNTS, b"a", b"2"),
    _command(b"HSET", COUNTS, *[w for i in range(12) for w in (b"f%d" % i, b"v")]),
]
"""HSET counts: a new field (1), an existing one (0), and twelve new fields at once (two digits)."""
INT_RUN_WITH_ERROR = [INT_RUN[0], _command(b"HSET", STRING, b"a", b"1"), INT_RUN[1]]
PING = _command(b"PING")


def _record(server: RedisServer, protocol: int, run: list[bytes]) -> bytes:
    """The raw reply bytes of ``run`` plus a ``PING``, from a fresh raw connection in ``protocol``."""
    client = server.client()
    client.flushall()
    with socket.create_connection((server.host, server.port)) as sock:
        if protocol == 3:
            _exchange(sock, [_command(b"HELLO", b"3")])
        _exchange(sock, _setup())
        return _exchange(sock, [*run, PING])


def _exchange(sock: socket.socket, commands: list[bytes]) -> bytes:
    """Send ``commands``; receive until their replies are whole; return exactly those bytes."""
    sock.sendall(b"".join(commands))
    reader = hiredis.Reader()
    got, replies = bytearray(), 0
    while replies < len(commands):
        chunk = sock.recv(65536)
        assert chunk, "redis-server closed the connection"
        got += chunk
        reader.feed(chunk)
        while reader.gets() is not False:
            replies += 1
    assert not reader.has_data(), "more bytes than replies"
    return bytes(got)


class SplittingServer:
    """A Unix socket server for one redis-py connection: relays its handshake, then plays bytes in 2 parts."""

    def __init__(self, path: Path, upstream: RedisServer) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(1)
        self._upstream = upstream
        self._jobs: queue.Queue[tuple[bytes, bytes, socket.socket] | None] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def play(self, first: bytes, second: bytes, client: socket.socket) -> None:
        """Write ``first``; once ``client`` has received all of it, write ``second``."""
        self._jobs.put((first, second, client))
        self._wake_w.send(b"x")

    def close(self) -> None:
        self._jobs.put(None)
        self._wake_w.send(b"x")
        self._thread.join(timeout=30)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        assert not self._errors, self._errors

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
            with conn, socket.create_connection((self._upstream.host, self._upstream.port)) as up:
                requests = hiredis.Reader()
                while True:
                    ready, _, _ = select.select([conn, self._wake_r], [], [])
                    if conn in ready:
                        data = conn.recv(65536)
                        if not data:
                            return
                        requests.feed(data)
                        n = 0
                        while requests.gets() is not False:
                            n += 1
                        conn.sendall(_relay(up, data, n))
                    if self._wake_r in ready:
                        self._wake_r.recv(1)
                        job = self._jobs.get()
                        if job is None:
                            return
                        first, second, client = job
                        conn.sendall(first)
                        _wait_until_read(client)
                        conn.sendall(second)
        except BaseException as exc:
            self._errors.append(exc)
            raise


def _relay(up: socket.socket, data: bytes, replies: int) -> bytes:
    """Forward the client's bytes (``replies`` whole commands) upstream and return their replies."""
    up.sendall(data)
    reader = hiredis.Reader()
    got = bytearray()
    while replies:
        chunk = up.recv(65536)
        assert chunk, "redis-server closed the connection"
        got += chunk
        reader.feed(chunk)
        while replies and reader.gets() is not False:
            replies -= 1
    return bytes(got)


def _unread(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue (FIONREAD)."""
    out = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, out, True)
    return out[0]


def _wait_until_read(sock: socket.socket) -> None:
    """Block until the client has taken every byte already sent to it (its parser is then past them)."""
    while _unread(sock):
        select.select([], [], [], 0.0005)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture
def wired(
    protocol: int, redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[redis.Connection, SplittingServer]]:
    """A connected redis-py connection (hiredis parser, ``protocol``) to a :class:`SplittingServer`."""
    server = SplittingServer(tmp_path / "wire.sock", redis_server)
    conn = redis.UnixDomainSocketConnection(path=str(tmp_path / "wire.sock"), protocol=protocol)
    conn.connect()
    assert reads_from_socket(conn), "the fast paths need redis-py's hiredis parser"
    try:
        yield conn, server
    finally:
        conn.disconnect()
        server.close()


def _plain(result: Any) -> tuple[str, Any]:
    """A parse result as comparable values: rows, integers, or a reply list with errors by type and text."""
    if isinstance(result, RowReplies):
        return "rows", (result.present.tolist(), result.values.tolist())
    if isinstance(result, np.ndarray):
        return "ints", result.tolist()
    return "list", [(type(r).__name__, str(r)) if isinstance(r, BaseException) else r for r in result]


def _parse_split(
    conn: redis.Connection, server: SplittingServer, stream: bytes, cut: int, parse: Callable[[Any], Any]
) -> tuple[tuple[str, Any], Any]:
    """``parse`` the stream delivered in two parts cut at ``cut``; then the ``PING``'s reply after it."""
    client = connection_socket(conn)
    assert client is not None
    server.play(stream[:cut], stream[cut:], client)
    parsed = _plain(parse(conn))
    return parsed, conn.read_response()


def _one_stream(*reads: Callable[[ReplyStream], Any]) -> Callable[[Any], list[Any]]:
    """``reads`` in turn on one :class:`ReplyStream` over the connection: each run after the first
    starts in the bytes the run before received past its replies, cut wherever the split fell."""

    def parse(conn: Any) -> list[Any]:
        with ReplyStream(conn) as stream:
            return [_plain(read(stream)) for read in reads]

    return parse


PARSERS: dict[str, tuple[list[bytes], Callable[[Any], Any]]] = {
    "read_rows": (ROW_RUN, lambda c: read_rows(c, len(ROW_RUN), WIDTH)),
    "read_rows, an error among the rows": (ROW_RUN_WITH_ERROR, lambda c: read_rows(c, 3, WIDTH)),
    "read_rows, a value like a record": (LOOKALIKE_RUN, lambda c: read_rows(c, 3, WIDTH)),
    "read_replies, rows": (ROW_RUN, lambda c: read_replies(c, len(ROW_RUN))),
    "read_ints": (INT_RUN, lambda c: read_ints(c, len(INT_RUN))),
    "read_ints, an error among the counts": (INT_RUN_WITH_ERROR, lambda c: read_ints(c, 3)),
    "read_replies, counts": (INT_RUN, lambda c: read_replies(c, len(INT_RUN))),
    "read_ints, then read_rows on one stream": (
        [*INT_RUN, *ROW_RUN],
        _one_stream(lambda s: read_ints(s, len(INT_RUN)), lambda s: read_rows(s, len(ROW_RUN), WIDTH)),
    ),
    "read_rows, then read_ints on one stream": (
        [*ROW_RUN, *INT_RUN],
        _one_stream(lambda s: read_rows(s, len(ROW_RUN), WIDTH), lambda s: read_ints(s, len(INT_RUN))),
    ),
}

EXPECTED: dict[str, tuple[str, Any]] = {
    "read_rows": (
        "rows",
        (
            [True, False, True, True, False, True, False],
            [_values()[i] for i in (0, 1, 2, 3)],
        ),
    ),
    "read_rows, an error among the rows": (
        "list",
        [
            _values()[0],
            ("ResponseError", "WRONGTYPE Operation against a key holding the wrong kind of value"),
            _values()[1],
        ],
    ),
    "read_rows, a value like a record": ("list", [_values()[4], None, _values()[0]]),
    "read_replies, rows": ("list", [_values()[0], None, *_values()[1:3], None, _values()[3], None]),
    "read_ints": ("ints", [1, 0, 12]),
    "read_ints, an error among the counts": (
        "list",
        [1, ("ResponseError", "WRONGTYPE Operation against a key holding the wrong kind of value"), 0],
    ),
    "read_replies, counts": ("list", [1, 0, 12]),
}
"""What each unsplit parse must be: the recorded commands' replies, read by hand."""
EXPECTED["read_ints, then read_rows on one stream"] = ("list", [EXPECTED["read_ints"], EXPECTED["read_rows"]])
EXPECTED["read_rows, then read_ints on one stream"] = ("list", [EXPECTED["read_rows"], EXPECTED["read_ints"]])


@pytest.mark.integration
@pytest.mark.parametrize("name", list(PARSERS))
def test_a_reply_stream_cut_at_any_byte_parses_as_the_whole_stream(
    name: str, protocol: int, wired: tuple[redis.Connection, SplittingServer], redis_server: RedisServer
) -> None:
    conn, server = wired
    run, parse = PARSERS[name]
    stream = _record(redis_server, protocol, run)
    if run is ROW_RUN:  # the second reply is a nil: RESP2's null bulk string, RESP3's null
        assert stream[23:28] == b"$-1\r\n" if protocol == 2 else stream[23:26] == b"_\r\n"
    whole = _parse_split(conn, server, stream, len(stream), parse)
    assert whole == (EXPECTED[name], b"PONG")
    for cut in range(1, len(stream)):
        assert _parse_split(conn, server, stream, cut, parse) == whole, f"cut at byte {cut} of {stream!r}"
