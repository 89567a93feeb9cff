"""read_rows: row replies parsed natively (kelp_native) off a real redis-server, as hiredis parses them."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import redis

from kelp.harness import RedisServer
from kelp.store.redis._wire.packed_pipeline import PackedPipeline
from kelp.store.redis._wire.packing import pack_commands
from kelp.store.redis._wire.row_replies import RowReplies, read_rows, receive

WIDTH = 80
KEY = b"rows:bucket"


def _tricky_values(n: int) -> np.ndarray:
    """Values whose bytes look like replies: a trailing "_" (its CRLF follows), "$-1\\r\\n", "_\\r\\n",
    and the value header itself inside them; the rest random."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 256, (n, WIDTH), dtype=np.uint8)
    values[::3, -1] = ord("_")
    for i, piece in enumerate([b"$-1\r\n", b"_\r\n", b"$80\r\n", b"\r\n$80\r\n"]):
        values[i::5, 10 : 10 + len(piece)] = np.frombuffer(piece, np.uint8)
    return values


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def client(request: pytest.FixtureRequest, redis_server: RedisServer) -> redis.Redis:
    redis_server.client().flushall()
    return redis.Redis.from_url(redis_server.url, protocol=request.param)


def _fields(ids: np.ndarray) -> np.ndarray:
    return ids.astype(">u8").view("V8")


def _store_rows(client: redis.Redis, ids: np.ndarray, values: np.ndarray) -> None:
    pipe = client.pipeline(transaction=False)
    for i, v in zip(ids.tolist(), values, strict=True):
        pipe.hset(KEY, int(i).to_bytes(8, "big"), v.tobytes())
    pipe.execute()


def _hget_run(ids: np.ndarray) -> bytes:
    keys = np.full(len(ids), KEY, dtype=f"S{len(KEY)}").view(f"V{len(KEY)}")
    return pack_commands(("HGET",), keys, _fields(ids))


def test_rows_and_nils_come_back_exactly_as_hiredis_reads_them(client: redis.Redis) -> None:
    values = _tricky_values(3000)
    stored = np.arange(0, 6000, 2, dtype=np.uint64)  # every other id asked for has a row
    _store_rows(client, stored, values)
    asked = np.arange(6000, dtype=np.uint64)
    pipe = PackedPipeline(client)
    pipe.add_packed(_hget_run(asked), len(asked), WIDTH)
    (fast,) = pipe.execute()
    assert isinstance(fast, RowReplies)
    assert fast.tolist() == _hiredis_read(client, asked)
    np.testing.assert_array_equal(fast.present, np.arange(6000) % 2 == 0)
    np.testing.assert_array_equal(fast.values.view(np.uint8).reshape(-1, WIDTH), values)


def _hiredis_read(client: redis.Redis, asked: np.ndarray) -> list[bytes | None]:
    pipe = PackedPipeline(client)
    pipe.add_packed(_hget_run(asked), len(asked))
    (replies,) = pipe.execute()
    return replies


def test_two_runs_and_a_plain_command_in_one_pipeline_each_get_their_own_replies(client: redis.Redis) -> None:
    values = _tricky_values(500)
    ids = np.arange(500, dtype=np.uint64)
    _store_rows(client, ids, values)
    first, second = ids[:300], np.r_[ids[200:], np.arange(1000, 1100, dtype=np.uint64)]
    pipe = PackedPipeline(client)
    pipe.add_packed(_hget_run(first), len(first), WIDTH)
    pipe.execute_command("PING")
    pipe.add_packed(_hget_run(second), len(second), WIDTH)
    a, pong, b = pipe.execute()
    assert pong in (True, b"PONG", "PONG")
    assert a.tolist() == _hiredis_read(client, first)
    got_b = b.tolist() if isinstance(b, RowReplies) else b
    assert got_b == _hiredis_read(client, second)


def test_an_error_reply_among_rows_is_handed_to_hiredis_and_the_connection_stays_in_step(
    client: redis.Redis,
) -> None:
    """A foreign reply (WRONGTYPE here) hands the rest to hiredis: the error is in its place, as before."""
    _store_rows(client, np.arange(10, dtype=np.uint64), _tricky_values(10))
    client.set(b"rows:string", b"x")  # as long as KEY, so one fixed-width key column holds both
    keys = np.array([KEY] * 5 + [b"rows:string"] + [KEY] * 4, dtype=f"S{len(KEY)}").view(f"V{len(KEY)}")
    conn = client.connection_pool.get_connection()
    try:
        conn.send_packed_command([pack_commands(("HGET",), keys, _fields(np.arange(10, dtype=np.uint64)))])
        replies = read_rows(conn, 10, WIDTH)
        assert isinstance(replies, list)
        assert isinstance(replies[5], redis.ResponseError) and "WRONGTYPE" in str(replies[5])
        assert all(isinstance(r, bytes) and len(r) == WIDTH for i, r in enumerate(replies) if i != 5)
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG", True)
    finally:
        client.connection_pool.release(conn)


def test_a_closed_socket_is_a_redis_connection_error() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    with pytest.raises(redis.ConnectionError, match="closed"):
        receive(ours, memoryview(bytearray(16)))
    ours.close()
