"""``backend: redis-cluster``: Redis Cluster from seed nodes, ids grouped into hash-tag buckets.

Keys carry a hash tag naming one of ``cluster_buckets_per_table`` buckets per
table (:mod:`kelp.store.keys`), so each bucket's rows travel in one MGET/MSET
to one slot, and redis-py's cluster pipeline routes the buckets to their
nodes. Everything else is shared with the client-sharded topology in
:mod:`kelp.store.redis_backend`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from redis.cluster import RedisCluster

from kelp.config import StoreConfig
from kelp.store.connection import cluster_name, connect_cluster, translate_redis_errors
from kelp.store.redis_backend import RedisBackend
from kelp.store.redis_plan import Group

__all__ = ["RedisClusterStore"]


class RedisClusterStore(RedisBackend):
    """``backend: redis-cluster``: ids bucketed by hash tag, each bucket one MGET/MSET routed by slot."""

    backend = "redis-cluster"

    @staticmethod
    def _cluster_buckets(cfg: StoreConfig) -> int | None:
        return cfg.cluster_buckets_per_table

    def _connect(self, cfg: StoreConfig, options: dict[str, Any]) -> list[str]:
        self._client = connect_cluster(cfg.urls, options)
        return [cluster_name(cfg.urls)]

    def groups(self, table: str, ids: np.ndarray) -> list[Group]:
        bucket = self.layouts[table].bucket_of(ids)
        order = np.argsort(bucket, kind="stable")
        nb = self.layouts[table].buckets or 1
        bounds = np.searchsorted(bucket[order], np.arange(nb + 1))
        return [Group(0, b, order[bounds[b] : bounds[b + 1]]) for b in range(nb) if bounds[b + 1] > bounds[b]]

    def _scan_count(self, pattern: str) -> int:
        with translate_redis_errors(self.shard_names[0]):
            return sum(1 for _ in self._client.scan_iter(match=pattern, count=1000))

    def _pipeline(self, shard: int, readonly: bool) -> Any:
        return self._client.pipeline()

    def node_of_keys(self, keys: Sequence[bytes]) -> list[str]:
        """host:port of the node serving each key (for tests and inspect)."""
        out = []
        for k in keys:
            node = self._client.get_node_from_key(k)
            out.append(f"{node.host}:{node.port}")
        return out

    def _shard_info(self, shard: int) -> dict[str, Any]:
        name = self.shard_names[0]

        def fetch() -> dict[str, Any]:
            with translate_redis_errors(name):
                mem = self._client.info("memory", target_nodes=RedisCluster.PRIMARIES)
                stats = self._client.info("stats", target_nodes=RedisCluster.PRIMARIES)
                sizes = self._client.dbsize(target_nodes=RedisCluster.PRIMARIES)
                return {
                    "shard": name,
                    "keys": sizes,
                    "used_memory": _sum_info(mem, "used_memory"),
                    "evicted_keys": _sum_info(stats, "evicted_keys"),
                    "expired_keys": _sum_info(stats, "expired_keys"),
                }

        return self.retry.call(fetch)

    def _close_clients(self) -> None:
        self._client.close()


def _sum_info(info: Any, key: str) -> int:
    if isinstance(info, dict) and key in info:
        return int(info[key])
    if isinstance(info, dict):
        return sum(int(v.get(key, 0)) for v in info.values() if isinstance(v, dict))
    return 0
