"""Redis-specific behaviour on real redis-server: TTL, maxmemory + allkeys-lfu, cluster slot
grouping, AUTH, a shard killed mid-run, and two concurrent writers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis
import torch
from prometheus_client import CollectorRegistry

from kelp.config import StoreConfig, TableSpec
from kelp.errors import StoreUnavailableError, UserError
from kelp.harness import RedisCluster, RedisServer
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.errors import ShardUnavailableError, StoreAuthError
from kelp.store.redis.standalone import RedisClusterStore, RedisStore

pytestmark = pytest.mark.integration

NO_SLEEP = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)


def _rows(n: int, dim: int, value: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, dim), value, np.float32), np.full(n, value, np.float32)


def _store(urls: list[str], tables: list[TableSpec], **cfg: object) -> RedisStore:
    return RedisStore(StoreConfig(backend="redis", urls=urls, **cfg), tables, "test", retry=NO_SLEEP)


def test_ttl_expires_rows_and_counters(redis_url: str, redis_server: RedisServer) -> None:
    spec = TableSpec(name="t", dim=4, admission={"min_count": 2, "counter_ttl_s": 1}, eviction={"ttl_s": 1})
    with _store([redis_url], [spec]) as store:
        ids = np.arange(20, dtype=np.uint64)
        store.pull("t", ids)
        client = redis_server.client()
        counter_key = store.layouts["t"].counter_keys(ids[:1])[0]
        assert 0 < client.pttl(counter_key) <= 1000  # counters carry their own TTL
        assert store.pull("t", ids).admitted.all()
        assert client.exists(counter_key) == 0  # dropped on admission
        store.push("t", ids, *_rows(20, 4))
        row_key = store.layouts["t"].row_keys(ids[:1])[0]
        assert 0 < client.pttl(row_key) <= 1000  # PX set on every write
        assert store.pull("t", ids, count=False).admitted.all()
        time.sleep(1.5)
        assert not store.pull("t", ids, count=False).admitted.any()  # evicted reads as not admitted
        store.push("t", ids, *_rows(20, 4))  # discarded: not admitted any more
        assert not store.pull("t", ids, count=False).admitted.any()
        assert store.metrics.push_discarded.labels(table="t")._value.get() == 20


def test_maxmemory_allkeys_lfu_bounds_memory() -> None:
    limit = 3 * 1024 * 1024
    with RedisServer(extra_args=["--maxmemory", str(limit), "--maxmemory-policy", "allkeys-lfu"]) as server:
        spec = TableSpec(name="t", dim=16)
        with _store([server.url], [spec]) as store:
            hot = np.arange(1_000, dtype=np.uint64)
            store.push("t", hot, *_rows(1000, 16, 2.0))
            for start in range(100_000, 160_000, 5_000):
                store.pull("t", hot, count=False)  # keeps the hot rows' LFU counters high
                cold = np.arange(start, start + 5_000, dtype=np.uint64)
                store.push("t", cold, *_rows(5000, 16))
            info = server.client().info()
            assert info["used_memory"] <= limit * 1.05
            assert info["evicted_keys"] > 0
            cold_all = np.arange(100_000, 160_000, dtype=np.uint64)
            cold_kept = store.pull("t", cold_all, count=False)
            assert not cold_kept.admitted.all()
            # Evicted rows read as not admitted (zeros); kept ones read back intact.
            assert (cold_kept.rows[~cold_kept.admitted] == 0).all()
            assert (cold_kept.rows[cold_kept.admitted] == 1.0).all()
            hot_kept = store.pull("t", hot, count=False).admitted.mean()
            assert hot_kept > cold_kept.admitted.mean()
            assert store.stats().shards[0]["maxmemory_policy"] == "allkeys-lfu"


def test_cluster_groups_rows_by_bucket_and_spreads_over_all_nodes(clean_redis_cluster: RedisCluster) -> None:
    cfg = StoreConfig(backend="redis-cluster", urls=clean_redis_cluster.urls, cluster_buckets_per_table=16)
    spec = TableSpec(name="t", dim=4)
    with RedisClusterStore(cfg, [spec], "test", retry=NO_SLEEP) as store:
        ids = np.arange(3000, dtype=np.uint64)
        store.push("t", ids, *_rows(3000, 4))
        assert all(s.client().dbsize() > 0 for s in clean_redis_cluster.servers)  # keys on all 3 nodes
        groups = store.groups("t", ids)
        assert len(groups) == 16  # 16 commands carry 3000 rows
        for g in groups:
            keys = store.layouts["t"].row_keys(ids[g.pos], np.full(len(g.pos), g.bucket))
            assert len(set(store.node_of_keys(keys))) == 1
        assert store.pull("t", ids, count=False).admitted.all()


def test_password_protected_redis() -> None:
    with RedisServer(password="s3cret-pw") as server:
        spec = TableSpec(name="t", dim=2)
        good = StoreConfig(backend="redis", urls=[server.url_without_auth], password="s3cret-pw")
        with RedisStore(good, [spec], "test", retry=NO_SLEEP) as store:
            store.push("t", np.arange(3, dtype=np.uint64), *_rows(3, 2))
            assert store.pull("t", np.arange(3, dtype=np.uint64), count=False).admitted.all()
        for password in ("wrong", None):
            bad = StoreConfig(backend="redis", urls=[server.url_without_auth], password=password)
            with (
                RedisStore(bad, [spec], "test", retry=NO_SLEEP) as store,
                pytest.raises(StoreAuthError) as err,
            ):
                store.pull("t", np.arange(3, dtype=np.uint64))
            assert isinstance(err.value, UserError) and not err.value.retriable
            assert "authentication" in str(err.value).lower()


def test_shard_killed_mid_run_raises_typed_error_then_recovers() -> None:
    servers = [RedisServer() for _ in range(3)]
    for s in servers:
        s.start()
    try:
        spec = TableSpec(name="t", dim=4)
        with _store([s.url for s in servers], [spec]) as store:
            ids = np.arange(3000, dtype=np.uint64)
            store.push("t", ids, *_rows(3000, 4, 1.0))
            victim = servers[1]
            victim.kill()
            with pytest.raises(ShardUnavailableError) as err:
                store.push("t", ids, *_rows(3000, 4, 2.0))
            assert err.value.shard == f"127.0.0.1:{victim.port}" and err.value.retriable
            assert isinstance(err.value, StoreUnavailableError)
            assert store.metrics.retries.labels(op="push")._value.get() == NO_SLEEP.attempts - 1
            with pytest.raises(ShardUnavailableError):
                store.pull("t", ids)  # never a half-filled result
            victim.start()
            on_victim = store.shard_of("t", ids) == 1
            got = store.pull("t", ids, count=False)
            # The restarted shard lost its rows (no persistence) and says so; the others are intact.
            assert not got.admitted[on_victim].any() and got.admitted[~on_victim].all()
            store.push("t", ids, *_rows(3000, 4, 3.0))  # works again
            assert (store.pull("t", ids, count=False).rows == 3.0).all()
    finally:
        for s in servers:
            s.cleanup()


def test_concurrent_writers_last_writer_wins_whole_rows(redis_url: str) -> None:
    """Two writers hammer the same rows: every row read is one writer's complete row (never torn)."""
    spec = TableSpec(name="t", dim=16)
    ids = np.arange(500, dtype=np.uint64)
    errors: list[BaseException] = []

    def writer(tag: float) -> None:
        try:
            with _store([redis_url], [spec]) as store:
                for it in range(30):
                    value = tag + it
                    store.push(
                        "t", ids, np.full((500, 16), value, np.float32), np.full(500, value, np.float32)
                    )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in (1000.0, 2000.0)]
    with _store([redis_url], [spec]) as reader:
        for t in threads:
            t.start()
        seen = []
        while any(t.is_alive() for t in threads):
            seen.append(reader.pull("t", ids, count=False))
        for t in threads:
            t.join()
        seen.append(reader.pull("t", ids, count=False))
    assert not errors
    for got in seen:
        rows = got.rows[got.admitted]
        assert (rows == rows[:, :1]).all()  # whole rows from one write
        assert (got.state[got.admitted] == rows[:, 0]).all()  # state travels with its row
    final = seen[-1].rows[:, 0]
    assert set(np.unique(final)) <= {1029.0, 2029.0}  # each row holds one writer's last value


def test_replica_serves_count_false_reads(redis_url: str, redis_server: RedisServer) -> None:
    with RedisServer(extra_args=["--replicaof", "127.0.0.1", str(redis_server.port)]) as replica:
        cfg = StoreConfig(backend="redis", urls=[redis_url], replicas=[[replica.url]])
        spec = TableSpec(name="t", dim=2)
        with RedisStore(cfg, [spec], "test", retry=NO_SLEEP) as store:
            ids = np.arange(10, dtype=np.uint64)
            store.push("t", ids, *_rows(10, 2, 5.0))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and replica.client().dbsize() < 10:
                time.sleep(0.05)
            before = replica.client().info("commandstats").get("cmdstat_mget", {}).get("calls", 0)
            assert (store.pull("t", ids, count=False).rows == 5.0).all()
            after = replica.client().info("commandstats")["cmdstat_mget"]["calls"]
            assert after == before + 1


def test_build_store_rejects_unknown_backend_and_garbage_rows_are_quarantined(redis_url: str) -> None:
    with pytest.raises(ValueError, match="unknown store backend"):
        from kelp.store.factory import backend_class

        backend_class("cassandra")
    r = redis.Redis.from_url(redis_url)
    spec = TableSpec(name="t", dim=2)
    with _store([redis_url], [spec]) as store:
        r.set(store.layouts["t"].row_keys(np.array([1], np.uint64))[0], b"garbage")
        got = store.pull("t", np.array([1], np.uint64), count=False)  # tests/store/test_quarantine.py
        assert not got.admitted.any()
        assert store.metrics.rows_quarantined.labels(table="t", reason="wrong_length")._value.get() == 1
    with build_store(StoreConfig(backend="redis", urls=[redis_url]), [spec], "x") as store:
        assert store.backend == "redis"


def test_every_table_of_a_call_shares_one_round_trip_per_step(redis_url: str) -> None:
    """Per call and shard: one MGET round trip, one for sighting counters, one for admissions, one push."""
    tables = [TableSpec(name=f"c{i}", dim=2, admission={"min_count": 2}) for i in range(3)] + [
        TableSpec(name="chance", dim=2, admission={"probability": 0.5}),
        TableSpec(name="always", dim=2),
    ]
    with _store([redis_url], tables) as store:
        shard = store.shard_names[0]

        def trips(op: str) -> float:
            return store.metrics.round_trips.labels(shard=shard, op=op)._value.get()

        ids = np.arange(100, dtype=np.uint64)
        batch = {t.name: ids for t in tables}
        store.pull_many(batch)  # first sighting: counters (one trip), chance admissions (one trip)
        assert (trips("pull"), trips("admit")) == (1, 2)
        got = store.pull_many(batch)  # second sighting: counters, then every admission in one trip
        assert (trips("pull"), trips("admit")) == (2, 4)
        assert all(got[f"c{i}"].admitted.all() for i in range(3))
        store.pull_many(batch, count=False)  # serving: reads only
        assert (trips("pull"), trips("admit")) == (3, 4)
        store.push_many({name: (ids, *_rows(100, 2)) for name in batch})
        assert trips("push") == 1


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
def test_admission_counts_are_shared_between_trainer_ranks(
    topology: str, redis_url: str, clean_redis_cluster: RedisCluster
) -> None:
    """Two ranks of a trainer group are two store clients: an id each sees once reaches min_count=2."""
    spec = TableSpec(name="t", dim=4, admission={"min_count": 2})
    urls = [redis_url] if topology == "standalone" else clean_redis_cluster.urls
    cfg = StoreConfig(backend="redis" if topology == "standalone" else "redis-cluster", urls=urls)
    deployment = f"ranks{time.monotonic_ns()}"  # one deployment, two clients (two ranks' processes)
    with (
        build_store(cfg, [spec], deployment, CollectorRegistry()) as rank0,
        build_store(cfg, [spec], deployment, CollectorRegistry()) as rank1,
    ):
        ids = np.array([11, 12, 13], dtype=np.uint64)
        assert not rank0.pull("t", ids).admitted.any()  # first sighting, on rank 0
        assert rank1.pull("t", ids[:2]).admitted.all()  # second sighting, on rank 1: admitted
        rank1.push("t", ids[:2], *_rows(2, 4, 0.5))
        seen = rank0.pull("t", ids, count=False)
        assert seen.admitted.tolist() == [True, True, False]
        assert np.allclose(seen.rows[:2], 0.5)  # rank 0 reads what rank 1 wrote


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
def test_in_store_adagrad_composes_two_writers_updates(
    topology: str, redis_url: str, clean_redis_cluster: RedisCluster
) -> None:
    """Two ranks update the same rows from the same read: overwrite keeps one update, compose keeps both."""
    from kelp.trainer.optim import RowWiseAdagrad

    spec = TableSpec(name="t", dim=4, eviction={"ttl_s": 60})
    urls = [redis_url] if topology == "standalone" else clean_redis_cluster.urls
    cfg = StoreConfig(
        backend="redis" if topology == "standalone" else "redis-cluster", urls=urls, sparse_updates="compose"
    )
    opt = RowWiseAdagrad(lr=0.1, eps=1e-8)
    ids = np.arange(1, 301, dtype=np.uint64)
    start = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    g1, g2 = (np.random.default_rng(s).normal(size=(300, 4)).astype(np.float32) for s in (1, 2))
    deployment = f"compose{time.monotonic_ns()}"
    with (
        build_store(cfg, [spec], deployment, CollectorRegistry()) as rank0,
        build_store(cfg, [spec], deployment, CollectorRegistry()) as rank1,
    ):
        rank0.push("t", ids, start, np.zeros(300, np.float32))
        read = rank0.pull("t", ids, count=False)  # both ranks start from this read
        as_t = torch.from_numpy
        for store, g in ((rank0, g1), (rank1, g2)):
            rows, state = opt.step(as_t(read.rows), as_t(read.state), as_t(g))
            store.apply_adagrad_many({"t": (ids, rows.numpy(), state.numpy(), g)}, opt.lr, opt.eps)
        stored = rank1.pull("t", ids, count=False)
        # Both updates in order, as one trainer would apply them (double math in Redis, float32 stored).
        rows, state = opt.step(as_t(read.rows), as_t(read.state), as_t(g1))
        rows, state = opt.step(rows, state, as_t(g2))
        assert np.allclose(stored.rows, rows.numpy(), atol=1e-5)
        assert np.allclose(stored.state, state.numpy(), rtol=1e-5)
        if topology == "standalone":  # the TTL is re-armed by the script's SET ... PX
            key = rank0.layouts["t"].row_keys(ids[:1], np.zeros(1, np.int64))[0]
            assert 0 < redis.Redis.from_url(redis_url).pttl(key) <= 60_000

        # Absent rows: written from the trainer's own result (the table creates rows on push).
        fresh = np.array([10_001], dtype=np.uint64)
        one = np.ones((1, 4), np.float32)
        rank0.apply_adagrad_many({"t": (fresh, one, np.ones(1, np.float32), one)}, opt.lr, opt.eps)
        assert np.allclose(rank1.pull("t", fresh, count=False).rows, 1.0)


def test_compose_is_refused_where_it_cannot_work() -> None:
    from kelp.store import check_store_config

    with pytest.raises(ValueError, match="sparse_updates: compose needs backend redis"):
        StoreConfig(backend="memory", sparse_updates="compose")
    cfg = StoreConfig(backend="redis", urls=["redis://127.0.0.1:1"], sparse_updates="compose")
    problems = check_store_config(cfg, [TableSpec(name="t", dim=4, dtype="float16")])
    assert problems == [
        (
            "features.tables[0].dtype",
            "store.sparse_updates: compose applies updates to float32 rows only; "
            "use dtype float32 or sparse_updates: overwrite",
        )
    ]
