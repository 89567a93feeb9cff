"""Store fixtures: the contract suite's backend factory and dedicated redis-servers.

``make_store`` is parametrized over memory, redis (1 shard), redis (3 shards),
redis-cluster, and the ``buckets`` row layout on 1 and 3 shards; each call gets
a fresh deployment namespace on servers that were flushed for the test, so
checks never see each other's rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from kelp.config import StoreConfig, TableSpec
from kelp.harness import RedisCluster, RedisServer
from kelp.retry import RetryPolicy
from kelp.store import MemoryStore, build_store
from kelp.store.checks import MakeStore

NO_SLEEP = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)
_deployments = (f"t{i}" for i in itertools.count())


@pytest.fixture(scope="session")
def three_shards() -> Iterator[list[RedisServer]]:
    servers = [RedisServer() for _ in range(3)]
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.cleanup()


def _flush(servers: list[RedisServer]) -> None:
    for s in servers:
        s.client().flushall()


@pytest.fixture(params=["memory", "redis-1", "redis-3", "redis-cluster", "buckets-1", "buckets-3"])
def make_store(request: pytest.FixtureRequest) -> Iterator[MakeStore]:
    kind = request.param
    made = []
    if kind == "memory":

        def factory(tables: list[TableSpec]):  # type: ignore[no-untyped-def]
            store = MemoryStore(tables, seed=0)
            made.append(store)
            return store
    else:
        if kind == "redis-1":
            servers = [request.getfixturevalue("redis_server")]
            cfg = StoreConfig(backend="redis", urls=[servers[0].url])
        elif kind == "redis-3":
            servers = request.getfixturevalue("three_shards")
            cfg = StoreConfig(backend="redis", urls=[s.url for s in servers])
        elif kind.startswith("buckets-"):  # layout.kind buckets; few buckets, so buckets hold many rows
            servers = (
                [request.getfixturevalue("redis_server")]
                if kind == "buckets-1"
                else request.getfixturevalue("three_shards")
            )
            layout = {"kind": "buckets", "buckets_per_table": 7}
            cfg = StoreConfig(backend="redis", urls=[s.url for s in servers], layout=layout)
        else:
            cluster: RedisCluster = request.getfixturevalue("redis_cluster")
            servers = cluster.servers
            cfg = StoreConfig(backend="redis-cluster", urls=cluster.urls)
        _flush(servers)

        def factory(tables: list[TableSpec]):  # type: ignore[no-untyped-def]
            store = build_store(cfg, tables, next(_deployments), retry=NO_SLEEP, seed=0)
            made.append(store)
            return store

    yield factory
    for store in made:
        store.close()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A fresh standalone redis-server for tests that kill, restart or reconfigure it."""
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()
