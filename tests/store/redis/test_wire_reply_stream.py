"""ReplyStream: the bytes a fast parser receives past its own replies start the next run's parse.

A pipeline's runs of ``HSET`` counts or ``HGET`` rows are each parsed off the
socket (``read_ints``, ``read_rows``), and each parser receives in large chunks,
so it usually takes the start of the next run's replies too. These tests pin
that the next run is still parsed off the socket (hiredis reads only what is
not such a run), that its replies are exactly Redis's, and that error replies,
redirections, replies held whole in the kept bytes and a connection used again
after a failed read all still come out right, on a real redis-server.
"""

from __future__ import annotations

import array
import fcntl
import select
import socket
import termios
import time
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from kelp.harness import RedisCluster, RedisServer
from kelp.store.redis._wire.int_replies import read_ints
from kelp.store.redis._wire.packed_pipeline import PackedPipeline
from kelp.store.redis._wire.packing import pack_commands
from kelp.store.redis._wire.row_replies import RowReplies, read_rows
from kelp.store.redis._wire.stream import ReplyStream
from kelp.store.redis.client_internals import connection_socket, hiredis_reader

pytestmark = pytest.mark.integration

KEY = b"wire:bucket"
WIDTH = 16


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def client(request: pytest.FixtureRequest, redis_server: RedisServer) -> redis.Redis:
    """A client whose reads time out: a parser that waited for bytes already received fails, not hangs."""
    redis_server.client().flushall()
    return redis.Redis.from_url(redis_server.url, protocol=request.param, socket_timeout=10)


@pytest.fixture
def through_hiredis(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The reply counts of every read that went through hiredis (a fast parser's fallback included)."""
    calls: list[int] = []
    replies = ReplyStream.replies

    def spy(self: ReplyStream, n: int) -> list[object]:
        calls.append(n)
        return replies(self, n)

    monkeypatch.setattr(ReplyStream, "replies", spy)
    yield calls


def _column(keys: list[bytes]) -> np.ndarray:
    width = len(keys[0])
    return np.array(keys, dtype=f"S{width}").view(f"V{width}")


def _fields(ids: np.ndarray) -> np.ndarray:
    return ids.astype(">u8").view("V8")


def _hset_run(ids: np.ndarray, key: bytes = KEY, keys: list[bytes] | None = None) -> bytes:
    """``HSET key id value`` per id (``keys``: one key per id instead); every value ``WIDTH`` bytes."""
    values = np.full(len(ids), b"v" * WIDTH, dtype=f"S{WIDTH}").view(f"V{WIDTH}")
    return pack_commands(("HSET",), _column(keys or [key] * len(ids)), _fields(ids), values)


def _hget_run(ids: np.ndarray) -> bytes:
    return pack_commands(("HGET",), _column([KEY] * len(ids)), _fields(ids))


def _unread(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue (FIONREAD)."""
    out = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, out, True)
    return out[0]


def _wait_for_bytes(conn: redis.Connection, size: int) -> None:
    """Block until ``size`` reply bytes wait in the socket, so a parser's first receive takes them all."""
    sock = connection_socket(conn)
    assert sock is not None
    deadline = time.monotonic() + 10
    while _unread(sock) < size:
        assert time.monotonic() < deadline, f"{_unread(sock)} of {size} reply bytes arrived"
        select.select([], [], [], 0.001)


def test_consecutive_runs_of_a_pipeline_are_all_parsed_off_the_socket(
    client: redis.Redis, through_hiredis: list[int]
) -> None:
    held = set(range(0, 3000, 3))
    client.hset(KEY, mapping={i.to_bytes(8, "big"): b"x" * WIDTH for i in held})
    runs = [range(0, 6000, 2), range(6000, 6005), range(5000, 9000)]
    pipe = PackedPipeline(client)
    for ids in runs:
        pipe.add_packed(_hset_run(np.array(ids, dtype=np.uint64)), len(ids), integers=True)
    pipe.add_packed(_hget_run(np.arange(8990, 9010, dtype=np.uint64)), 20, WIDTH)
    pipe.execute_command("PING")
    *counts, rows, pong = pipe.execute()
    assert through_hiredis == [1]  # the PING's reply only
    for ids, got in zip(runs, counts, strict=True):
        assert isinstance(got, np.ndarray) and got.tolist() == [int(i not in held) for i in ids]
        held.update(ids)
    assert isinstance(rows, RowReplies) and rows.tolist() == [b"v" * WIDTH] * 10 + [None] * 10
    assert pong in (b"PONG", "PONG", True)
    conn = client.connection_pool.get_connection()
    try:
        assert not hiredis_reader(conn).has_data()  # every reply read, none left over for the next user
    finally:
        client.connection_pool.release(conn)


def test_runs_held_whole_in_the_kept_bytes_are_read_without_waiting_on_the_socket(
    client: redis.Redis, through_hiredis: list[int]
) -> None:
    """Every reply is in the socket before the first parse, whose first receive takes them all (its
    buffer has room to spare): the runs after it must be read from those bytes, never from a socket
    that will send nothing more (the client's read timeout would fail the test)."""
    client.hset(KEY, (1).to_bytes(8, "big"), b"r" * WIDTH)
    conn = client.connection_pool.get_connection()
    try:
        ping = b"*1\r\n$4\r\nPING\r\n"
        conn.send_packed_command(
            [
                _hset_run(np.arange(100, 200, dtype=np.uint64)),
                _hset_run(np.arange(199, 202, dtype=np.uint64)),
                _hget_run(np.array([1, 2], dtype=np.uint64)),
                ping,
            ]
        )
        nil = 5 if conn.protocol in (2, "2", None) else 3
        _wait_for_bytes(conn, 100 * 4 + 3 * 4 + (WIDTH + 5 + 2) + nil + len(b"+PONG\r\n"))
        with ReplyStream(conn) as stream:
            created = read_ints(stream, 100)
            again = read_ints(stream, 3)
            rows = read_rows(stream, 2, WIDTH)
            pong = stream.replies(1)
        assert isinstance(created, np.ndarray) and created.tolist() == [1] * 100
        assert isinstance(again, np.ndarray) and again.tolist() == [0, 1, 1]
        assert isinstance(rows, RowReplies) and rows.tolist() == [b"r" * WIDTH, None]
        assert pong in ([b"PONG"], ["PONG"], [True])
        assert through_hiredis == [1]
        assert not hiredis_reader(conn).has_data()
    finally:
        client.connection_pool.release(conn)


def test_an_error_in_a_run_after_kept_bytes_lands_in_its_place(
    client: redis.Redis, through_hiredis: list[int]
) -> None:
    """The second run starts in bytes the first received and holds a ``WRONGTYPE``: hiredis reads on
    from that reply, and the runs after it come back right, through hiredis where it holds their bytes."""
    client.set(b"wire:string", b"x")  # as long as KEY
    conn = client.connection_pool.get_connection()
    try:
        keys = [KEY] * 5 + [b"wire:string"] + [KEY] * 4
        conn.send_packed_command(
            [
                _hset_run(np.arange(100, dtype=np.uint64)),
                _hset_run(np.arange(95, 105, dtype=np.uint64), keys=keys),
                _hset_run(np.arange(100, 110, dtype=np.uint64)),
            ]
        )
        _wait_for_bytes(conn, 100 * 4 + 9 * 4 + 10 * 4)
        with ReplyStream(conn) as stream:
            created = read_ints(stream, 100)
            mixed = read_ints(stream, 10)
            last = read_ints(stream, 10)
        assert isinstance(created, np.ndarray) and created.tolist() == [1] * 100
        assert isinstance(mixed, list)
        assert mixed[:5] == [0] * 5 and mixed[6:] == [1] * 4
        assert isinstance(mixed[5], redis.ResponseError) and "WRONGTYPE" in str(mixed[5])
        assert list(last) == [1] + [0] * 4 + [1] * 5  # id 100's write went to the string key
        assert through_hiredis[0] == 5  # the error and the four after it; nothing before
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG", True)
    finally:
        client.connection_pool.release(conn)


def test_a_connection_used_again_after_a_failed_read_starts_clean(
    client: redis.Redis, through_hiredis: list[int]
) -> None:
    """A read that times out in the middle of a run (which may have started from kept bytes) drops
    the connection with the bytes it held; the next pipeline on the pool reconnects, and its runs are
    parsed off the socket and right."""
    kwargs = {**client.connection_pool.connection_kwargs, "socket_timeout": 0.5}
    pipe = PackedPipeline(redis.Redis(connection_pool=redis.ConnectionPool(**kwargs)))
    pipe.add_packed(_hset_run(np.arange(1000, dtype=np.uint64)), 1000, integers=True)
    wait = b"*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$4\r\n2000\r\n"  # no replica: answers 0 after 2 s
    pipe.add_packed(_hset_run(np.arange(1000, 1005, dtype=np.uint64)) + wait, 6, integers=True)
    with pytest.raises(redis.TimeoutError):
        pipe.execute()
    through_hiredis.clear()
    pipe.add_packed(_hset_run(np.arange(500, 1500, dtype=np.uint64)), 1000, integers=True)
    pipe.add_packed(_hset_run(np.arange(1500, 1600, dtype=np.uint64)), 100, integers=True)
    again, more = pipe.execute()
    assert through_hiredis == []
    assert isinstance(again, np.ndarray) and again.tolist() == [0] * 505 + [1] * 495
    assert isinstance(more, np.ndarray) and more.tolist() == [1] * 100


def _key_on(node: RedisServer, *, here: bool) -> bytes:
    """A key the cluster ``node`` holds (``here``), or one it answers ``MOVED`` for."""
    client = node.client()
    for i in range(1000):
        key = b"wire:{t%03d}" % i
        try:
            client.exists(key)
        except redis.exceptions.MovedError:
            if not here:
                return key
        else:
            if here:
                return key
    raise AssertionError("every key on one node")


def test_a_redirection_in_a_run_after_kept_bytes_comes_back_in_its_place(
    clean_redis_cluster: RedisCluster, through_hiredis: list[int]
) -> None:
    """A cluster node answers ``MOVED`` for a key it does not hold; read after the kept bytes of a run
    before it, the redirection is in its place and the other counts are right."""
    node = clean_redis_cluster.servers[0]
    here, there = _key_on(node, here=True), _key_on(node, here=False)
    client = redis.Redis(host=node.host, port=node.port, socket_timeout=10)
    pipe = PackedPipeline(client)
    pipe.add_packed(_hset_run(np.arange(2000, dtype=np.uint64), key=here), 2000, integers=True)
    keys = [here] * 5 + [there] + [here] * 4
    pipe.add_packed(_hset_run(np.arange(1995, 2005, dtype=np.uint64), keys=keys), 10, integers=True)
    created, mixed = pipe.execute(raise_on_error=False)
    assert isinstance(created, np.ndarray) and created.tolist() == [1] * 2000
    assert mixed[:5] == [0] * 5 and mixed[6:] == [1] * 4
    assert isinstance(mixed[5], redis.exceptions.MovedError)
    assert through_hiredis == [5]
    assert client.ping()
