"""read_ints: integer replies parsed by numpy off a real redis-server's socket, against hiredis's parse."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from kelp.harness import RedisServer
from kelp.store.redis._wire.int_replies import read_ints
from kelp.store.redis._wire.packed_pipeline import PackedPipeline
from kelp.store.redis._wire.packing import pack_commands, pack_grouped

KEY = b"ints:bucket"


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def client(request: pytest.FixtureRequest, redis_server: RedisServer) -> redis.Redis:
    redis_server.client().flushall()
    return redis.Redis.from_url(redis_server.url, protocol=request.param)


def _keys(n: int, key: bytes = KEY) -> np.ndarray:
    return np.full(n, key, dtype=f"S{len(key)}").view(f"V{len(key)}")


def _fields(ids: np.ndarray) -> np.ndarray:
    return ids.astype(">u8").view("V8")


def _values(n: int) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (n, 80), dtype=np.uint8).view("V80").ravel()


def _hset_run(ids: np.ndarray) -> bytes:
    return pack_commands(("HSET",), _keys(len(ids)), _fields(ids), _values(len(ids)))


def test_hset_counts_come_back_as_one_array_equal_to_what_redis_did(client: redis.Redis) -> None:
    first = np.arange(0, 5000, 2, dtype=np.uint64)
    pipe = PackedPipeline(client)
    pipe.add_packed(_hset_run(first), len(first), integers=True)
    pipe.add_packed(_hset_run(np.arange(5000, dtype=np.uint64)), 5000, integers=True)  # half are new
    created, again = pipe.execute()
    assert isinstance(created, np.ndarray) and created.tolist() == [1] * len(first)
    # The first run's parse received the start of the second's replies: the second starts there.
    assert isinstance(again, np.ndarray) and again.tolist() == [0, 1] * 2500
    assert client.hlen(KEY) == 5000


def test_multi_digit_counts_of_grouped_writes(client: redis.Redis) -> None:
    n = 6400
    bucket = np.arange(n) % 100  # 100 commands of 64 rows: replies ":64\r\n" outgrow 4 bytes each
    keys = np.array([b"ints:b%02d" % b for b in bucket], dtype="S9").view("V9")
    grouped = pack_grouped(("HSET",), bucket, keys, _fields(np.arange(n, dtype=np.uint64)), _values(n))
    pipe = PackedPipeline(client)
    pipe.add_packed(grouped, grouped.count, integers=True)
    pipe.execute_command("PING")
    counts, pong = pipe.execute()
    assert isinstance(counts, np.ndarray) and counts.tolist() == [64] * 100
    assert pong in (b"PONG", "PONG", True)


def test_an_error_reply_in_the_run_lands_in_its_place_and_the_connection_stays_in_step(
    client: redis.Redis,
) -> None:
    client.set(b"ints:string", b"x")
    keys = np.array([KEY] * 5 + [b"ints:string"] + [KEY] * 4, dtype=f"S{len(KEY)}").view(f"V{len(KEY)}")
    conn = client.connection_pool.get_connection()
    try:
        conn.send_packed_command(
            [pack_commands(("HSET",), keys, _fields(np.arange(10, dtype=np.uint64)), _values(10))]
        )
        replies = read_ints(conn, 10)
        assert isinstance(replies, list)
        assert replies[:5] == [1] * 5 and replies[6:] == [1] * 4
        assert isinstance(replies[5], redis.ResponseError) and "WRONGTYPE" in str(replies[5])
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG", True)
    finally:
        client.connection_pool.release(conn)


def test_the_pipeline_raises_the_error_of_an_integer_run(client: redis.Redis) -> None:
    client.set(KEY, b"not a hash")
    pipe = PackedPipeline(client)
    pipe.add_packed(_hset_run(np.arange(100, dtype=np.uint64)), 100, integers=True)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        pipe.execute()
    assert client.ping()
