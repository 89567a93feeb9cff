"""The cluster store's own routing on a real 3-node Redis Cluster: buckets go to the node holding their
slot, and a slot moved under a live store (ASK while it migrates, MOVED after) costs one re-routed call,
never a wrong row."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry

from kelp.config import StoreConfig, TableSpec
from kelp.harness import RedisCluster, RedisServer
from kelp.store import build_store
from kelp.store.redis.shared import _runs_by_shard
from kelp.store.redis.standalone import RedisClusterStore

DIM = 4


@pytest.fixture
def store(clean_redis_cluster: RedisCluster) -> Iterator[RedisClusterStore]:
    cfg = StoreConfig(backend="redis-cluster", urls=clean_redis_cluster.urls, cluster_buckets_per_table=8)
    tables = [TableSpec(name="t", dim=DIM), TableSpec(name="u", dim=DIM)]
    s = build_store(cfg, tables, "routes", registry=CollectorRegistry())
    assert isinstance(s, RedisClusterStore)
    yield s
    s.close()


def _rows(ids: np.ndarray, value: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.full((len(ids), DIM), value, np.float32) + ids[:, None].astype(np.float32)
    return ids, rows, np.full(len(ids), value, np.float32)


def _reroutes(s: RedisClusterStore) -> float:
    return s.metrics.retries.labels(op="reroute")._value.get()


def test_every_bucket_is_routed_to_the_node_that_holds_its_keys(store: RedisClusterStore) -> None:
    ids = np.arange(400, dtype=np.uint64)
    for table in ("t", "u"):
        layout = store.layouts[table]
        for g in store.groups(table, ids):
            key = layout.row_keys(ids[g.pos[:1]], np.array([g.bucket]))[0]
            assert store.shard_names[g.shard] == store.node_of_keys([key])[0]
    assert len({g.shard for g in store.groups("t", ids)}) > 1  # 8 buckets spread over the nodes


def _node(cluster: RedisCluster, name: str) -> RedisServer:
    return next(s for s in cluster.servers if f"{s.host}:{s.port}" == name)


def _migrate(
    cluster: RedisCluster,
    slot: int,
    keys: list[bytes],
    *,
    source: RedisServer,
    target: RedisServer,
    finish: bool,
) -> None:
    """Move ``slot`` and its ``keys`` from ``source`` to ``target`` (ASK from then on); ``finish``: hand the
    slot over on every node (MOVED). The keys are passed in: ``CLUSTER GETKEYSINSLOT`` replies come back
    decoded as text, which mangles binary ids."""
    src, dst = source.client(), target.client()
    src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
    if not finish:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        assert src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys) in (
            b"OK",
            "OK",
        )
        assert src.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
        return
    for server in cluster.servers:
        server.client().execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


def test_a_slot_moved_under_a_live_store_costs_one_rerouted_call(
    store: RedisClusterStore, clean_redis_cluster: RedisCluster
) -> None:
    ids = np.arange(300, dtype=np.uint64)
    store.push_many({"t": _rows(ids, 1.0), "u": _rows(ids, 2.0)})
    moved = store.groups("t", ids)[0]
    slot = redis.crc.key_slot(store.layouts["t"].bucket_tag(moved.bucket))
    keys = store.layouts["t"].row_keys(ids[moved.pos], np.full(len(moved.pos), moved.bucket))
    source = _node(clean_redis_cluster, store.shard_names[moved.shard])
    target = next(s for s in clean_redis_cluster.servers if s is not source)

    # Mid-migration: the slot's keys are on the target, and the source answers ASK.
    _migrate(clean_redis_cluster, slot, keys, source=source, target=target, finish=False)
    got = store.pull_many({"t": ids, "u": ids}, count=False)
    assert np.array_equal(got["t"].rows, _rows(ids, 1.0)[1])
    assert np.array_equal(got["u"].rows, _rows(ids, 2.0)[1])
    assert _reroutes(store) == 1

    # Handed over: the old node answers MOVED.
    _migrate(clean_redis_cluster, slot, keys, source=source, target=target, finish=True)
    store.push_many({"t": _rows(ids, 3.0)})
    assert _reroutes(store) == 2
    assert store.shard_names[store.groups("t", ids)[0].shard] == f"{target.host}:{target.port}"
    got = store.pull_many({"t": ids}, count=False)  # the new routes: no redirection, the new rows
    assert np.array_equal(got["t"].rows, _rows(ids, 3.0)[1])
    assert _reroutes(store) == 2
    assert target.client().execute_command("CLUSTER COUNTKEYSINSLOT", slot) > 0


@pytest.mark.parametrize("max_rows", [2048, 5])
def test_vectorised_runs_are_the_per_bucket_groups_cut_into_commands(
    clean_redis_cluster: RedisCluster, max_rows: int
) -> None:
    cfg = StoreConfig(backend="redis-cluster", urls=clean_redis_cluster.urls, max_rows_per_command=max_rows)
    s = build_store(cfg, [TableSpec(name="t", dim=DIM)], "runs", registry=CollectorRegistry())
    assert isinstance(s, RedisClusterStore)
    rng = np.random.default_rng(0)
    try:
        for n in (0, 1, 7, 3000):
            ids = np.unique(rng.integers(0, 10**9, n)).astype(np.uint64)
            fast = {r[0]: r for r in s._runs("t", ids)}
            slow = {r[0]: r for r in _runs_by_shard(s.groups("t", ids), s.chunk)}
            assert fast.keys() == slow.keys()
            for shard, run in fast.items():
                assert all(np.array_equal(a, b) for a, b in zip(run[1:], slow[shard][1:], strict=True))
    finally:
        s.close()
