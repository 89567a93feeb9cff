"""One contract for both waiting stores: what a step writes, the next step reads, in deadline order."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import redis

from kelp.harness import RedisServer
from kelp.join.records import Action
from kelp.join.state import (
    NEGATIVE,
    POSITIVE,
    Changes,
    MemoryWaitingStore,
    RedisWaitingStore,
    StateValueError,
    Waiting,
    WaitingStore,
)
from kelp.store.redis.acl import default_user, setuser_line

TASKS = ["click", "buy"]


JOIN_PASSWORD = "j0in-pw"


@pytest.fixture(params=["memory", "redis", "redis-join-user"])
def store(request: pytest.FixtureRequest) -> Iterator[WaitingStore]:
    """``redis-join-user``: the same Redis, logged in as ``kelp store acl --role join``'s user, so the
    contract also proves that the role allows every command a joiner sends."""
    if request.param == "memory":
        yield MemoryWaitingStore()
        return
    url = request.getfixturevalue("redis_url")
    if request.param == "redis":
        client = redis.Redis.from_url(url)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        server.client().execute_command(*setuser_line("contract", "join", password=JOIN_PASSWORD).split())
        client = _join_client(server)
    s = RedisWaitingStore(client, "contract")
    yield s
    s.close()


def _join_client(server: RedisServer) -> redis.Redis:
    return redis.Redis(
        host=server.host, port=server.port, username=default_user("contract", "join"), password=JOIN_PASSWORD
    )


def _waiting(rid: str, ts: float, n: int = 3) -> Waiting:
    return Waiting.new(rid, ts, _raw(rid), n, TASKS)


def _raw(rid: str) -> bytes:
    """A stand-in for the impression as read: a msgpack map, as every impression is."""
    return msgpack.packb({"request": {"id": rid}})


def test_a_put_impression_reads_back_with_its_decisions(store: WaitingStore) -> None:
    w = _waiting("r1", 100.0)
    w.labels["click"][1] = POSITIVE
    w.labels["buy"][:] = NEGATIVE
    w.emitted[1] = 1
    w.closed.add("buy")
    store.apply(Changes(put={"r1": (w, 160.0, 600.0)}))
    got = store.load(["r1", "absent"], TASKS)
    assert list(got) == ["r1"]
    r1 = got["r1"]
    assert (r1.ts, r1.raw, r1.n, r1.closed) == (100.0, _raw("r1"), 3, {"buy"})
    np.testing.assert_array_equal(r1.labels["click"], [0, POSITIVE, 0])
    np.testing.assert_array_equal(r1.labels["buy"], [NEGATIVE] * 3)
    np.testing.assert_array_equal(r1.emitted, [0, 1, 0])
    assert r1.stored_bytes == len(r1.pack())


def test_a_task_added_to_the_config_starts_undecided(store: WaitingStore) -> None:
    store.apply(Changes(put={"r1": (Waiting.new("r1", 1.0, _raw("r1"), 2, ["click"]), 61.0, 600.0)}))
    got = store.load(["r1"], TASKS)["r1"]
    np.testing.assert_array_equal(got.labels["buy"], [0, 0])


def test_due_lists_deadlines_at_or_before_the_watermark_earliest_first(store: WaitingStore) -> None:
    store.apply(
        Changes(
            put={
                "late": (_waiting("late", 10.0), 300.0, 600.0),
                "first": (_waiting("first", 1.0), 100.0, 600.0),
                "second": (_waiting("second", 2.0), 200.0, 600.0),
            }
        )
    )
    assert store.due(99.0, 10) == []
    assert store.due(200.0, 10) == ["first", "second"]
    assert store.due(1000.0, 2) == ["first", "second"]
    store.apply(Changes(put={"first": (_waiting("first", 1.0), 400.0, 600.0)}))  # a new deadline
    assert store.due(1000.0, 10) == ["second", "late", "first"]


def test_deleted_impressions_are_gone_with_their_deadline_and_bytes(store: WaitingStore) -> None:
    a, b = _waiting("a", 1.0), _waiting("b", 2.0)
    store.apply(Changes(put={"a": (a, 5.0, 600.0), "b": (b, 6.0, 600.0)}))
    assert store.counts() == (2, len(a.pack()) + len(b.pack()), 0)
    stored = store.load(["a"], TASKS)["a"]
    store.apply(Changes(delete={"a": stored}))
    assert store.load(["a", "b"], TASKS).keys() == {"b"}
    assert store.due(100.0, 10) == ["b"]
    assert store.counts() == (1, len(b.pack()), 0)


def test_early_actions_wait_with_their_deadline_and_leave(store: WaitingStore) -> None:
    actions = [Action("click", 60.0, "r9", 5, 10.0), Action("buy", 600.0, "r9", None, 11.0)]
    store.apply(Changes(early_put={"r9": (actions, 71.0, 600.0)}))
    assert store.load_early(["r9", "r8"]) == {"r9": actions}
    assert store.early_due(70.0, 10) == []
    assert store.early_due(71.0, 10) == ["r9"]
    assert store.counts()[2] == 1
    store.apply(Changes(early_delete={"r9"}))
    assert store.load_early(["r9"]) == {}
    assert store.early_due(1e12, 10) == []


def test_the_watermark_is_kept_with_the_state(store: WaitingStore) -> None:
    assert store.watermark() is None
    store.apply(Changes(watermark=1_700_000_000.25))
    assert store.watermark() == 1_700_000_000.25


def test_the_join_user_reaches_only_the_waiting_state(redis_server: RedisServer) -> None:
    """``--role join`` touches ``{kelp:D:join}`` keys and nothing else: no row, counter or snapshot key
    of its deployment, no key of another deployment, no server command."""
    admin = redis_server.client()
    admin.flushall()
    admin.execute_command(*setuser_line("contract", "join", password=JOIN_PASSWORD).split())
    joiner = _join_client(redis_server)
    assert joiner.set("{kelp:contract:join}:w", b"1") and joiner.get("{kelp:contract:join}:w") == b"1"
    for key in ("k2:contract:C1:0", "{k1:contract:model}:latest", "{kelp:other:join}:w", "kelp:contract:x"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            joiner.get(key)
    with pytest.raises(redis.exceptions.NoPermissionError):
        joiner.flushall()


def _put_raw(store: WaitingStore, rid: str, blob: bytes, deadline: float, *, early: bool = False) -> None:
    assert isinstance(store, MemoryWaitingStore | RedisWaitingStore)
    store.put_raw(rid, blob, deadline, early=early)


@pytest.mark.parametrize(
    "bad",
    [
        {"put": {"ok": (_waiting("ok", 1.0), 61.0, 600.0), "nan": (_waiting("nan", 2.0), math.nan, 600.0)}},
        {"put": {"ok": (_waiting("ok", 1.0), 61.0, 600.0), "inf": (_waiting("inf", 2.0), 62.0, math.inf)}},
        {"put": {"ok": (_waiting("ok", 1.0), 61.0, 600.0)}, "watermark": math.nan},
        {
            "put": {"ok": (_waiting("ok", 1.0), 61.0, 600.0)},
            "early_put": {"e": ([Action("click", 60.0, "e", 5, math.nan)], 71.0, 600.0)},
        },
    ],
    ids=["nan-deadline", "inf-ttl", "nan-watermark", "nan-action"],
)
def test_a_step_with_a_value_redis_would_refuse_is_applied_not_at_all(
    store: WaitingStore, bad: dict[str, Any]
) -> None:
    with pytest.raises(StateValueError):
        store.apply(Changes(**bad))
    assert store.load(["ok", "nan", "inf", "e"], TASKS) == {} and store.load_early(["e"]) == {}
    assert store.counts() == (0, 0, 0) and store.watermark() is None


def test_a_step_is_applied_whole_even_when_redis_would_refuse_one_command(redis_url: str) -> None:
    """A deadline set that is not a sorted set: ZADD would fail after the SETs ran (MULTI has no
    rollback), leaving impressions without deadlines. Nothing of the step may be applied."""
    client = redis.Redis.from_url(redis_url)
    store = RedisWaitingStore(client, "contract")
    client.set("{kelp:contract:join}:due", b"not a sorted set")
    with pytest.raises(redis.ResponseError, match="not a sorted set"):
        store.apply(Changes(put={"r1": (_waiting("r1", 1.0), 61.0, 600.0)}, watermark=5.0))
    assert client.get("{kelp:contract:join}:i:r1") is None and client.get("{kelp:contract:join}:wm") is None
    client.delete("{kelp:contract:join}:due")
    client.hset("{kelp:contract:join}:stats", "bytes", b"garbage")  # only a gauge: reset, not refused
    store.apply(Changes(put={"r1": (_waiting("r1", 1.0), 61.0, 600.0)}))
    assert store.load(["r1"], TASKS).keys() == {"r1"} and store.due(100.0, 10) == ["r1"]
    assert store.counts()[1] == len(_waiting("r1", 1.0).pack())


def test_a_huge_ttl_is_capped_to_one_redis_accepts(store: WaitingStore) -> None:
    store.apply(Changes(put={"r1": (_waiting("r1", 1.0), 61.0, 1e300)}))
    assert store.load(["r1"], TASKS).keys() == {"r1"}


@pytest.mark.parametrize(
    "blob",
    [
        b"\xc1 not msgpack",
        b"\x93\x01",  # cut short
        msgpack.packb([1, 2]),
        msgpack.packb({"ts": math.nan, "raw": b"\x80", "n": 1, "labels": {}, "emitted": b"\0", "closed": []}),
        msgpack.packb({"ts": 1.0, "raw": b"not a map", "n": 1, "labels": {}, "emitted": b"\0", "closed": []}),
        msgpack.packb(
            {"ts": 1.0, "raw": b"\x80", "n": 2, "labels": {"click": b"\0"}, "emitted": b"\0\0", "closed": []}
        ),
        # A raw impression that starts as a map but does not decode: read whole when it is stored back,
        # it would fail the step that closes its window, at every restart.
        msgpack.packb({"ts": 1.0, "raw": b"\x81", "n": 1, "labels": {}, "emitted": b"\0", "closed": []}),
        msgpack.packb({"ts": 1.0, "raw": b"\x80\x01", "n": 1, "labels": {}, "emitted": b"\0", "closed": []}),
    ],
    ids=["format", "truncated", "list", "nan-ts", "raw-not-a-map", "short-labels", "raw-cut-map", "raw-more"],
)
def test_a_corrupt_impression_is_quarantined_with_its_deadline(store: WaitingStore, blob: bytes) -> None:
    _put_raw(store, "bad", blob, 5.0)
    store.apply(Changes(put={"good": (_waiting("good", 1.0), 6.0, 600.0)}))
    assert store.load(["bad", "good"], TASKS).keys() == {"good"}
    assert store.take_corrupt() == {"impression": 1}
    assert store.due(100.0, 10) == ["good"] and store.load(["bad"], TASKS) == {}
    assert store.take_corrupt() == {}  # dropped: said once


def test_a_corrupt_early_action_list_is_quarantined_with_its_deadline(store: WaitingStore) -> None:
    _put_raw(store, "bad", msgpack.packb([["click", 60.0, "bad", 5, math.inf]]), 5.0, early=True)
    assert store.load_early(["bad"]) == {}
    assert store.take_corrupt() == {"early_actions": 1}
    assert store.early_due(100.0, 10) == [] and store.counts()[2] == 0


@pytest.mark.parametrize(
    "put", [lambda c, k: c.rpush(k, b"1.0"), lambda c, k: c.set(k, b"garbage")], ids=["a-list", "not-a-time"]
)
def test_a_stored_watermark_that_is_not_a_time_is_quarantined(redis_url: str, put: Any) -> None:
    """A key of another type answers GET with WRONGTYPE: dropped and counted like a value that is not
    a time, so the joiner starts (its inputs set the watermark again) instead of failing at every start."""
    client = redis.Redis.from_url(redis_url)
    store = RedisWaitingStore(client, "contract")
    put(client, "{kelp:contract:join}:wm")
    assert store.watermark() is None
    assert store.take_corrupt() == {"watermark": 1}
    assert client.exists("{kelp:contract:join}:wm") == 0
    store.apply(Changes(watermark=5.0))
    assert store.watermark() == 5.0 and store.take_corrupt() == {}


def test_a_forgotten_deadline_leaves_the_due_list(store: WaitingStore) -> None:
    store.apply(
        Changes(
            put={"gone": (_waiting("gone", 1.0), 5.0, 600.0), "kept": (_waiting("kept", 2.0), 6.0, 600.0)}
        )
    )
    store.apply(Changes(forget={"gone"}))
    assert store.due(100.0, 10) == ["kept"]


def test_the_deadline_of_an_impression_its_ttl_removed_is_dropped_by_the_next_close(redis_url: str) -> None:
    """An impression whose key expired while the watermark stood still leaves its deadline behind; the
    step that finds it gone drops it, so expired ids never fill a step's share of due deadlines."""
    from kelp.config import JoinConfig
    from kelp.join.joiner import Joiner

    client = redis.Redis.from_url(redis_url)
    store = RedisWaitingStore(client, "contract")
    store.apply(Changes(put={"gone": (_waiting("gone", 1.0), 5.0, 600.0)}))
    client.delete("{kelp:contract:join}:i:gone")  # what its TTL does
    config = JoinConfig(
        impressions_topic="imp",
        item_feature="item",
        allowed_lateness_s=0,
        actions=[{"topic": "clicks", "task": "click", "window_s": 60}],
    )
    joiner = Joiner(config, ["click"], store)
    for partition in (("imp", 0), ("clicks", 0)):
        joiner.watermark.observe(partition, 100.0)
    step = joiner.step([], 100.0, [("imp", 0), ("clicks", 0)], idle=set())
    assert step.changes.forget == {"gone"}
    store.apply(step.changes)
    assert store.due(1000.0, 10) == []
