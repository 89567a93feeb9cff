"""Which Redis Cluster primary holds each hash-tag bucket, as the store's shard index.

A cluster store's keys carry one of ``cluster_buckets_per_table`` hash tags per
table (:mod:`kelp.store.redis.keys`), so a bucket is one slot and one node. Knowing
the node of every bucket lets the store send each node one pipeline of commands
packed by hiredis or numpy (:class:`~kelp.store.redis._wire.packed_pipeline.PackedPipeline`),
as it does for standalone shards, instead of redis-py's cluster pipeline, which
computes the slot of every key of every command in Python (a cluster pull through it
ran at a fraction of the rows per second of three standalone shards, docs/performance.md).

Shard indices name nodes (``host:port``) and only grow: a node that appears
after a resharding or a failover gets the next index, so a plan built before a
:meth:`ClusterRoutes.refresh` still names real nodes. A redirection (``MOVED``,
``ASK``) comes back as :class:`SlotMapChangedError`; the store then refreshes the routes
and runs that one call through redis-py's cluster client, which follows
redirections itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from kelp.store.redis._wire.packed_pipeline import PackedPipeline
from kelp.store.redis.client_internals import node_name_of_slot, refresh_slot_map
from kelp.store.redis.keys import KeyLayout

__all__ = ["ClusterRoutes", "NodePipeline", "SlotMapChangedError"]


class SlotMapChangedError(Exception):
    """A node answered ``MOVED``/``ASK``, or a planned node is gone: the slot map has changed.

    Not a Kelp error, so the store's retry policy does not resend the same
    pipeline to the same node; the cluster store catches it and re-runs the call."""


class NodePipeline(PackedPipeline):
    """A packed pipeline to one cluster node; a redirection reply raises :class:`SlotMapChangedError`."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return super().execute(raise_on_error)
        except (redis.exceptions.MovedError, redis.exceptions.AskError) as exc:
            raise SlotMapChangedError(f"{type(exc).__name__}: {exc}") from exc


class ClusterRoutes:
    """Bucket -> shard index (a primary node) per table, from redis-py's slot map."""

    def __init__(self, client: RedisCluster, layouts: Mapping[str, KeyLayout]) -> None:
        self._client = client
        self._lock = threading.Lock()
        self.names: list[str] = sorted(node.name for node in client.get_primaries())
        """Shard index -> node ``host:port``; only appended to."""
        self._slots = {
            table: np.array([key_slot(layout.bucket_tag(b)) for b in range(layout.buckets or 1)], np.int64)
            for table, layout in layouts.items()
        }
        self._shards: dict[str, np.ndarray] = {}
        self._build()

    def shards(self, table: str) -> np.ndarray:
        """int64[buckets]: the shard index of each of ``table``'s buckets."""
        return self._shards[table]

    def node(self, shard: int) -> ClusterNode:
        """The node of ``shard``, or :class:`SlotMapChangedError` when it is no longer a primary."""
        node = self._client.get_node(node_name=self.names[shard])
        if node is None or node.server_type != "primary" or node.redis_connection is None:
            raise SlotMapChangedError(f"node {self.names[shard]} is no longer a primary")
        return node

    def refresh(self) -> None:
        """Read the slot map again (``CLUSTER SLOTS``) and rebuild the bucket routes."""
        with self._lock:
            refresh_slot_map(self._client)
            self._build()

    def _build(self) -> None:
        index = {name: i for i, name in enumerate(self.names)}
        shards = {}
        for table, slots in self._slots.items():
            of_slot = {}
            for slot in np.unique(slots).tolist():
                name = node_name_of_slot(self._client, slot)
                if name not in index:
                    index[name] = len(self.names)
                    self.names.append(name)
                of_slot[slot] = index[name]
            shards[table] = np.array([of_slot[s] for s in slots.tolist()], dtype=np.int64)
        self._shards = shards
