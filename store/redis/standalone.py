"""``backend: redis``: one or more standalone Redis nodes, client-sharded by rendezvous hashing on the id.

An id's shard is chosen by rendezvous hashing over the shard addresses, so
adding or removing a node moves only ~1/n of the ids. Reads with
``count=False`` go to a read replica of the shard when configured (round
robin). Everything else (plans, primitives, stats) is shared with Redis
Cluster in :mod:`kelp.store.redis.shared`; connections and error translation
come from :mod:`kelp.store.redis.connection`.

:class:`~kelp.store.redis.cluster.RedisClusterStore` is re-exported here for
code that imported both topologies from this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kelp.config import StoreConfig
from kelp.store.redis._wire.packed_pipeline import PackedPipeline
from kelp.store.redis.cluster import RedisClusterStore
from kelp.store.redis.connection import connect_node, node_name, translate_redis_errors
from kelp.store.redis.layout_marker import check_layout_marker
from kelp.store.redis.plan import Group
from kelp.store.redis.row_scan import Node
from kelp.store.redis.shared import RedisStoreBase
from kelp.store.rows.hashing import name_seed, rendezvous

__all__ = ["RedisClusterStore", "RedisStore"]


class RedisStore(RedisStoreBase):
    """``backend: redis``: standalone nodes (``store.urls``), optional read replicas per shard."""

    backend = "redis"
    packs_commands = True  # PackedPipeline

    def _connect(self, cfg: StoreConfig, options: dict[str, Any]) -> list[str]:
        names = [node_name(u) for u in cfg.urls]
        self._clients = [connect_node(u, options) for u in cfg.urls]
        self._replicas = [[connect_node(u, options) for u in group] for group in cfg.replicas]
        self._seeds = np.array([name_seed("shard", n) for n in names], dtype=np.uint64)
        self._table_seeds = {name: name_seed("table", self.deployment, name) for name in self.tables}
        self._replica_turn = 0
        return names

    def _first_contact(self) -> None:
        self._check_layout()

    def _check_layout(self) -> None:
        """Refuse a layout other than the one this deployment's rows were written in.

        See :mod:`kelp.store.redis.layout_marker`."""
        with translate_redis_errors(self.shard_names[0]):
            mine = self._layout_description()
            check_layout_marker(self.deployment, mine, self._clients, self._foreign_patterns())

    def _layout_description(self) -> dict[str, Any]:
        return {"kind": "keys"}

    def _foreign_patterns(self) -> list[str]:
        """SCAN patterns of this deployment's rows in the other layout (``buckets``)."""
        return [f"k2:{self.deployment}:{name}:h:*" for name in self.tables]

    def shard_of(self, table: str, ids: np.ndarray) -> np.ndarray:
        """int64[n] shard index of each id (stable across processes)."""
        return rendezvous(np.asarray(ids, np.uint64) ^ self._table_seeds[table], self._seeds)

    def groups(self, table: str, ids: np.ndarray) -> list[Group]:
        if len(self._clients) == 1:
            return [Group(0, 0, np.arange(len(ids)))] if len(ids) else []
        shard = self.shard_of(table, ids)
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(len(self._clients) + 1))
        return [
            Group(s, 0, order[bounds[s] : bounds[s + 1]])
            for s in range(len(self._clients))
            if bounds[s + 1] > bounds[s]
        ]

    def _scan_count(self, pattern: str) -> int:
        total = 0
        for name, client in zip(self.shard_names, self._clients, strict=True):
            with translate_redis_errors(name):
                total += sum(1 for _ in client.scan_iter(match=pattern, count=1000))
        return total

    def _scan_nodes(self) -> list[Node]:
        return list(zip(self.shard_names, self._clients, strict=True))

    def _pipeline(self, shard: int, readonly: bool) -> Any:
        client = self._clients[shard]
        if readonly and self._replicas and self._replicas[shard]:
            group = self._replicas[shard]
            self._replica_turn += 1
            client = group[self._replica_turn % len(group)]
        return PackedPipeline(client)

    def _shard_info(self, shard: int) -> dict[str, Any]:
        name = self.shard_names[shard]

        def fetch() -> dict[str, Any]:
            with translate_redis_errors(name):
                client = self._clients[shard]
                info = {**client.info("memory"), **client.info("stats")}
                return {
                    "shard": name,
                    "keys": client.dbsize(),
                    "used_memory": info.get("used_memory"),
                    "maxmemory": info.get("maxmemory"),
                    "maxmemory_policy": info.get("maxmemory_policy"),
                    "evicted_keys": info.get("evicted_keys"),
                    "expired_keys": info.get("expired_keys"),
                }

        return self.retry.call(fetch)

    def _close_clients(self) -> None:
        for c in self._clients + [r for g in self._replicas for r in g]:
            c.close()
