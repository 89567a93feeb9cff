"""The ``buckets`` row layout on a real redis-server: TTL from row stamps, the sweep, memory, server limits.

The store contract (tests/store/test_contract.py) also runs on this layout
(``buckets-1``, ``buckets-3``); these tests cover what only it does.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from kelp.config import StoreConfig, TableSpec
from kelp.errors import ConfigError
from kelp.harness import RedisServer
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.redis.buckets import BucketSweeper, RedisBucketStore, _spanned
from kelp.store.redis.layout_marker import marker_key

NO_SLEEP = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)


class Clock:
    """Unix seconds the test moves by hand (rows are stamped with it, TTLs judged by it)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _store(
    url: str, specs: list[TableSpec], clock: Clock | None = None, **layout: object
) -> RedisBucketStore:
    layout = {"kind": "buckets", "buckets_per_table": 16, **layout}
    cfg = StoreConfig(backend="redis", urls=[url], layout=layout)
    store = build_store(cfg, specs, "bk", retry=NO_SLEEP, **({"clock": clock} if clock else {}))
    assert isinstance(store, RedisBucketStore)
    return store


def _rows(n: int, dim: int, value: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, dim), value, np.float32), np.zeros(n, np.float32)


def _bucket_fields(server: RedisServer, store: RedisBucketStore, table: str) -> int:
    client = server.client()
    return sum(client.hlen(k) for k in client.scan_iter(match=store.buckets[table].pattern))


def test_rows_past_the_ttl_read_as_absent_and_pushes_do_not_revive_them(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    clock = Clock()
    spec = TableSpec(name="t", dim=4, admission={"min_count": 2}, eviction={"ttl_s": 60})
    with _store(redis_server.url, [spec], clock) as store:
        ids = np.arange(10, dtype=np.uint64)
        store.pull("t", ids)
        assert store.pull("t", ids).admitted.all()  # second sighting: admitted, init rows stored
        store.push("t", ids, *_rows(10, 4, 2.0))
        clock.now += 59
        assert (store.pull("t", ids, count=False).rows == 2.0).all()
        clock.now += 2  # 61 s after the last update
        got = store.pull("t", ids, count=False)
        assert not got.admitted.any() and (got.updated_s == 0).all()
        store.push("t", ids, *_rows(10, 4, 3.0))  # discarded, as SET XX on an expired key
        assert store.metrics.push_discarded.labels(table="t")._value.get() == 10
        assert not store.pull("t", ids, count=False).admitted.any()
        assert _bucket_fields(redis_server, store, "t") == 0  # the script deleted what it found expired


def test_a_serving_read_of_several_tables_hides_only_the_expired_tables_rows(
    redis_server: RedisServer,
) -> None:
    """read_many judges each row against its own table's TTL, tables side by side in one block."""
    redis_server.client().flushall()
    clock = Clock()
    specs = [TableSpec(name="short", dim=4, eviction={"ttl_s": 60}), TableSpec(name="long", dim=4)]
    with _store(redis_server.url, specs, clock) as store:
        ids = np.arange(10, dtype=np.uint64)
        store.push_many({name: (ids, *_rows(10, 4, 2.0)) for name in ("short", "long")})
        clock.now += 61
        got = store.read_many({"short": ids, "long": ids})
        assert not got.admitted[got.span("short")].any()
        assert (got.rows["short"] == 0).all() and (got.updated_s[got.span("short")] == 0).all()  # type: ignore[index]
        assert got.admitted[got.span("long")].all() and (got.rows["long"] == 2.0).all()
        pulled = store.pull_many({"short": ids, "long": ids}, count=False)
        assert not pulled["short"].admitted.any() and pulled["long"].admitted.all()


def test_the_sweep_frees_expired_rows_a_few_buckets_per_push(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    clock = Clock()
    specs = [TableSpec(name="t", dim=4, eviction={"ttl_s": 100}), TableSpec(name="keep", dim=4)]
    with _store(redis_server.url, specs, clock, sweep_period_s=50) as store:
        old = np.arange(200, dtype=np.uint64)
        store.push_many({"t": (old, *_rows(200, 4)), "keep": (old, *_rows(200, 4))})
        clock.now += 120  # every row of t expired; nothing swept yet
        fresh = np.arange(1000, 1010, dtype=np.uint64)
        assert _bucket_fields(redis_server, store, "t") == 200
        for _ in range(4):  # 120 s owed over a 50 s period: every bucket is due at the first push
            store.push("t", fresh, *_rows(10, 4))
            clock.now += 1
        assert _bucket_fields(redis_server, store, "t") == 10  # only the fresh rows are left
        assert _bucket_fields(redis_server, store, "keep") == 200  # a table without a TTL is never swept
        assert store.metrics.evictions.labels(table="t", reason="ttl")._value.get() == 200


def test_sweeper_spreads_buckets_over_the_period() -> None:
    now = [0.0]
    sweeper = BucketSweeper(buckets=100, period_s=10.0, clock=lambda: now[0])
    seen: list[int] = []
    for _ in range(20):
        now[0] += 0.5
        seen += sweeper.due().tolist()
    assert sorted(seen) == list(range(100))  # 10 s: each bucket exactly once
    now[0] += 1000.0
    assert len(sweeper.due()) == 100  # a long pause owes at most one full sweep


def test_admission_overwrites_an_expired_row_but_not_a_live_one(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    clock = Clock()
    spec = TableSpec(name="t", dim=2, admission={"min_count": 2}, eviction={"ttl_s": 10})
    with _store(redis_server.url, [spec], clock) as store:
        ids = np.arange(3, dtype=np.uint64)
        store.pull("t", ids)
        assert store.pull("t", ids).admitted_now.all()  # second sighting: init rows stored
        store.push("t", ids, *_rows(3, 2, 5.0))
        assert (store.pull("t", ids).rows == 5.0).all()  # a live row is never replaced by an init row
        clock.now += 11
        assert not store.pull("t", ids).admitted.any()  # expired: counting starts again
        again = store.pull("t", ids)
        assert again.admitted_now.all() and (again.rows == store.tables["t"].init_rows(ids)).all()
        assert (store.pull("t", ids, count=False).rows == again.rows).all()


def test_rows_take_about_100_bytes_in_listpack_buckets_against_the_key_layout() -> None:
    """Memory of 20,000 dim-16 rows with a TTL, both layouts, on the same kind of server."""
    spec = TableSpec(name="t", dim=16, eviction={"ttl_s": 3600})
    ids = np.random.default_rng(0).integers(0, 2**63, 20_000, dtype=np.uint64)
    used = {}
    for kind in ("keys", "buckets"):
        with RedisServer() as server:
            client = server.client()
            before = client.info("memory")["used_memory"]
            layout = {"kind": kind, "buckets_per_table": 512}
            cfg = StoreConfig(backend="redis", urls=[server.url], layout=layout)
            with build_store(cfg, [spec], "mem", retry=NO_SLEEP) as store:
                store.push("t", ids, *_rows(len(ids), 16))
                used[kind] = (client.info("memory")["used_memory"] - before) / len(ids)
                if kind == "buckets":
                    key = store.buckets["t"].bucket_keys(np.array([0]))[0].tobytes()
                    assert client.object("encoding", key) == b"listpack"
    assert used["buckets"] < 0.6 * used["keys"], used


def test_low_listpack_limits_are_raised_or_reported(caplog: pytest.LogCaptureFixture) -> None:
    args = ["--hash-max-listpack-value", "64", "--hash-max-listpack-entries", "128"]
    spec = TableSpec(name="t", dim=16)
    with RedisServer(extra_args=args) as server:
        client = server.client()
        with caplog.at_level(logging.WARNING), _store(server.url, [spec], configure_server=False) as store:
            store.pull("t", np.arange(3, dtype=np.uint64))  # checked at the first contact
        assert "hash-max-listpack-value 80" in caplog.text
        assert client.config_get("hash-max-listpack-value")["hash-max-listpack-value"] == "64"
        with _store(server.url, [spec]) as store:
            store.pull("t", np.arange(3, dtype=np.uint64))
        assert client.config_get("hash-max-listpack-value")["hash-max-listpack-value"] == "80"
        assert client.config_get("hash-max-listpack-entries")["hash-max-listpack-entries"] == "512"


def test_count_keys_inspect_and_delete(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    with _store(redis_server.url, [TableSpec(name="t", dim=2, admission={"min_count": 3})]) as store:
        ids = np.arange(30, dtype=np.uint64)
        for _ in range(3):
            store.pull("t", ids)  # admitted on the third sighting
        store.pull("t", np.arange(100, 105, dtype=np.uint64))  # 5 ids waiting with a counter
        assert store.count_keys() == {"t": {"rows": 30, "counters": 5}}
        values = store.raw_values("t", np.array([0, 999], np.uint64))
        assert values[1] is None and len(values[0] or b"") == store.tables["t"].codec.nbytes
        assert store.delete("t", np.array([0, 1, 999], np.uint64)) == 2
        assert store.count_keys()["t"]["rows"] == 28


def test_buckets_layout_is_refused_where_it_does_not_apply() -> None:
    buckets = {"kind": "buckets"}
    with pytest.raises(ValueError, match=r"layout\.kind: buckets needs backend redis"):
        StoreConfig(backend="redis-cluster", urls=["redis://h:1"], layout=buckets)
    with pytest.raises(ValueError, match=r"compose needs layout\.kind: keys"):
        StoreConfig(backend="redis", urls=["redis://h:1"], layout=buckets, sparse_updates="compose")


def test_a_deployment_keeps_the_layout_its_rows_were_written_in(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    spec = TableSpec(name="t", dim=2)
    ids = np.arange(5, dtype=np.uint64)
    with _store(redis_server.url, [spec]) as store:
        store.push("t", ids, *_rows(5, 2))
    keys_cfg = StoreConfig(backend="redis", urls=[redis_server.url], layout={"kind": "keys"})
    with build_store(keys_cfg, [spec], "bk", retry=NO_SLEEP) as other, pytest.raises(ConfigError) as err:
        other.pull("t", ids)
    assert "store.layout.kind" in str(err.value) and "'buckets'" in str(err.value)
    with _store(redis_server.url, [spec], buckets_per_table=32) as other, pytest.raises(ConfigError) as err:
        other.pull("t", ids)
    assert "buckets_per_table" in str(err.value) and "16" in str(err.value)
    with _store(redis_server.url, [spec, TableSpec(name="new", dim=2)]) as same:  # a new table is fine
        assert same.pull("t", ids, count=False).admitted.all()


def test_rows_written_before_the_marker_existed_are_found(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    spec = TableSpec(name="t", dim=2)
    keys_cfg = StoreConfig(backend="redis", urls=[redis_server.url], layout={"kind": "keys"})
    with build_store(keys_cfg, [spec], "old", retry=NO_SLEEP) as old:
        old.push("t", np.arange(5, dtype=np.uint64), *_rows(5, 2))
    redis_server.client().delete(marker_key("old"))  # as an older Kelp left it
    cfg = StoreConfig(backend="redis", urls=[redis_server.url])  # layout auto: buckets on standalone
    with build_store(cfg, [spec], "old", retry=NO_SLEEP) as new, pytest.raises(ConfigError) as err:
        new.pull("t", np.arange(5, dtype=np.uint64))
    assert "already has rows in the 'keys' layout" in str(err.value)


def test_a_push_writes_each_bucket_with_grouped_commands_and_every_row_reads_back(
    redis_server: RedisServer,
) -> None:
    """Rows sharing a bucket go out as one HSET per bucket (split past 64 rows); none is lost or mixed."""
    redis_server.client().flushall()
    specs = [TableSpec(name="a", dim=3), TableSpec(name="b", dim=3)]
    with _store(redis_server.url, specs, buckets_per_table=2) as store:  # ~250 rows per bucket
        ids = np.arange(1, 1001, dtype=np.uint64)
        rows = {n: np.random.default_rng(i).random((1000, 3), dtype=np.float32) for i, n in enumerate("ab")}
        before = redis_server.client().info("commandstats").get("cmdstat_hset", {}).get("calls", 0)
        store.push_many({n: (ids, rows[n], np.full(1000, i + 1, np.float32)) for i, n in enumerate("ab")})
        calls = redis_server.client().info("commandstats")["cmdstat_hset"]["calls"] - before
        assert 2 * 1000 / 64 <= calls < 100  # 4 buckets of ~250 rows, 64 rows per command at most
        got = store.pull_many({"a": ids, "b": ids}, count=False)
        for i, n in enumerate("ab"):
            np.testing.assert_array_equal(got[n].rows, rows[n])
            np.testing.assert_array_equal(got[n].state, np.full(1000, i + 1, np.float32))
        assert _bucket_fields(redis_server, store, "a") == 1000


def test_consecutive_slices_of_one_array_are_packed_where_they_lie() -> None:
    """A write-back's per-table slices of one read are joined without a copy; anything else (slices
    out of order, apart, or of different arrays) is copied end to end, with the same values."""
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    parts = [rows[0:3], rows[3:3], rows[3:7], rows[7:10]]
    joined = _spanned(parts)
    assert np.shares_memory(joined, rows) and not joined.flags.writeable
    np.testing.assert_array_equal(joined, rows)
    for other in ([rows[3:7], rows[0:3]], [rows[0:3], rows[4:7]], [rows[0:3], rows.copy()[3:7]]):
        copied = _spanned(other)
        assert not np.shares_memory(copied, rows)
        np.testing.assert_array_equal(copied, np.concatenate(other))
