"""``backend: redis-cluster``: Redis Cluster from seed nodes, ids grouped into hash-tag buckets.

Keys carry a hash tag naming one of ``cluster_buckets_per_table`` buckets per
table (:mod:`kelp.store.redis.keys`), so each bucket's rows travel in one MGET/MSET
to one slot. The store knows which primary serves each bucket
(:mod:`kelp.store.redis.cluster_routes`) and sends every node one packed pipeline, in
parallel, as the client-sharded topology does: all of a node's ``MGET`` s (or
``MSET`` s) for a table are packed by numpy at once.

When the slot map changes under it (a node answers ``MOVED``/``ASK``, or a
planned node is no longer a primary), the store reads the map again and runs
that one call through redis-py's cluster pipeline, which follows redirections
itself; the next call is routed by the new map. A call re-run this way repeats
the commands that had already succeeded: row writes and ``SET NX`` admissions
are idempotent, but a sighting counted before the redirection is counted twice.
A write that must wait for replicas (``store.durability.replicas_ack``) is re-run
on the refreshed node routes instead, because only a node's own pipeline can end
with the ``WAIT`` that covers its writes; if the map moves again (a slot
migration in progress) the push fails retriably and is sent again later.
Everything else is shared with :mod:`kelp.store.redis.shared`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from redis.crc import key_slot

from kelp.config import StoreConfig
from kelp.errors import StoreUnavailableError
from kelp.store.base import Table
from kelp.store.errors import ShardUnavailableError
from kelp.store.flow import InitRows, RowWrite, StoredRows
from kelp.store.redis._wire.packing import cut_runs
from kelp.store.redis.cluster_routes import ClusterRoutes, NodePipeline, SlotMapChangedError
from kelp.store.redis.connection import cluster_name, connect_cluster, translate_redis_errors
from kelp.store.redis.plan import Group, PlanRunner
from kelp.store.redis.row_scan import Node
from kelp.store.redis.shared import RedisStoreBase
from kelp.store.rows.stored import StoredRows as RowsToLoad

__all__ = ["RedisClusterStore"]

T = TypeVar("T")


class RedisClusterStore(RedisStoreBase):
    """``backend: redis-cluster``: ids bucketed by hash tag, each node one packed pipeline per call."""

    backend = "redis-cluster"
    packs_commands = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast_runner.shard_names = self.shard_names  # one list: nodes met later get names in both
        self._slow_runner = PlanRunner(
            self.shard_names,
            lambda _shard, _ro: self._client.pipeline(),
            self.retry,
            self.metrics,
            parallel=False,
        )
        """Runs a re-routed call in the calling thread, every shard's commands through redis-py."""
        self._slow_runner.shard_names = self.shard_names  # one list: a promoted replica is named here too

    @property
    def _runner(self) -> PlanRunner:
        """The node-routed runner, or, while this thread re-runs a call after a redirection, redis-py's."""
        return self._slow_runner if self._falling_back() else self._fast_runner

    @_runner.setter
    def _runner(self, runner: PlanRunner) -> None:
        self._fast_runner = runner

    @staticmethod
    def _cluster_buckets(cfg: StoreConfig) -> int | None:
        return cfg.cluster_buckets_per_table

    def _connect(self, cfg: StoreConfig, options: dict[str, Any]) -> list[str]:
        self._client = connect_cluster(cfg.urls, options)
        self._cluster = cluster_name(cfg.urls)
        with translate_redis_errors(self._cluster):
            self._routes = ClusterRoutes(self._client, self.layouts)
        self._fallback = threading.local()
        return self._routes.names

    # -- routing ---------------------------------------------------------------------------------

    def groups(self, table: str, ids: np.ndarray) -> list[Group]:
        bucket = self.layouts[table].bucket_of(ids)
        order = np.argsort(bucket, kind="stable")
        nb = self.layouts[table].buckets or 1
        bounds = np.searchsorted(bucket[order], np.arange(nb + 1))
        shard = self._routes.shards(table)
        return [
            Group(int(shard[b]), b, order[bounds[b] : bounds[b + 1]])
            for b in range(nb)
            if bounds[b + 1] > bounds[b]
        ]

    def _runs(self, table: str, ids: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """:meth:`groups` cut into commands without a Python object per bucket: one sort of the ids by
        (shard, bucket), runs cut where either changes or a run reaches ``max_rows_per_command``. A
        pull reads 26 tables x 64 buckets; per bucket, the planning cost as much as Redis's work."""
        n = len(ids)
        if not n:
            return
        layout = self.layouts[table]
        bucket = layout.bucket_of(ids)
        shard = self._routes.shards(table)[bucket]
        key = shard * (layout.buckets or 1) + bucket  # one value per (shard, bucket)
        order = np.argsort(key, kind="stable")
        bucket, shard = bucket[order], shard[order]
        cuts = cut_runs(key[order], self.chunk)
        lengths = np.diff(np.r_[cuts, n])
        for s in np.unique(shard).tolist():
            lo, hi = np.searchsorted(shard, [s, s + 1]).tolist()
            at = slice(*np.searchsorted(cuts, [lo, hi]).tolist())
            yield s, order[lo:hi], lengths[at], bucket[lo:hi]

    def _pipeline(self, shard: int, readonly: bool) -> Any:
        return NodePipeline(self._routes.node(shard).redis_connection)

    def _packs_commands(self) -> bool:
        return not self._falling_back()

    def _falling_back(self) -> bool:
        return bool(getattr(self._fallback, "on", False))

    def _rerouted(self, call: Callable[[], T], *, writes: bool = False) -> T:
        """Run ``call`` on the node routes; after a redirection, refresh them and run it once more
        through redis-py's cluster pipeline (``writes`` waited for by replicas: on the new node
        routes). A node that stopped answering also refreshes them, so the next call finds a
        promoted replica."""
        try:
            return call()
        except SlotMapChangedError:
            with translate_redis_errors(self._cluster):
                self._routes.refresh()
            self.metrics.retries.labels(op="reroute").inc()
            if writes and self._fast_runner.wait is not None:
                return self._on_new_routes(call)
            self._fallback.on = True
            try:
                return call()
            finally:
                self._fallback.on = False
        except StoreUnavailableError:
            try:
                with translate_redis_errors(self._cluster):
                    self._routes.refresh()
            except StoreUnavailableError:
                pass  # the cluster itself is down: the original error says so
            raise

    def _on_new_routes(self, call: Callable[[], T]) -> T:
        """``call`` once more on the refreshed node routes; a second redirection fails it retriably."""
        try:
            return call()
        except SlotMapChangedError as exc:
            with translate_redis_errors(self._cluster):
                self._routes.refresh()
            raise ShardUnavailableError(self._cluster, f"slot map still moving: {exc}") from exc

    # -- the flow's primitives, each re-run on a redirection ----------------------------------------

    def _read_rows(
        self, ids_by_table: Mapping[str, np.ndarray], now: float, touch: bool
    ) -> dict[str, StoredRows]:
        return self._rerouted(lambda: super(RedisClusterStore, self)._read_rows(ids_by_table, now, touch))

    def _count_sightings(
        self, requests: Mapping[str, tuple[np.ndarray, np.ndarray, float]], now: float
    ) -> dict[str, np.ndarray]:
        return self._rerouted(lambda: super(RedisClusterStore, self)._count_sightings(requests, now))

    def _store_init_rows(self, admits: Mapping[str, InitRows], now: float) -> None:
        self._rerouted(lambda: super(RedisClusterStore, self)._store_init_rows(admits, now))

    def _write_rows(self, writes: Mapping[str, RowWrite], now: float) -> dict[str, int]:
        return self._rerouted(lambda: super(RedisClusterStore, self)._write_rows(writes, now), writes=True)

    def _apply_adagrad(
        self, writes: Mapping[str, RowWrite], lr: float, eps: float, now: float
    ) -> dict[str, int]:
        return self._rerouted(
            lambda: super(RedisClusterStore, self)._apply_adagrad(writes, lr, eps, now), writes=True
        )

    def delete(self, table: str, ids: np.ndarray) -> int:
        return self._rerouted(lambda: super(RedisClusterStore, self).delete(table, ids))

    def raw_values(self, table: str, ids: np.ndarray) -> list[bytes | None]:
        return self._rerouted(lambda: super(RedisClusterStore, self).raw_values(table, ids))

    def _load(self, t: Table, block: RowsToLoad) -> int:
        return self._rerouted(lambda: super(RedisClusterStore, self)._load(t, block), writes=True)

    # -- listing rows: node by node --------------------------------------------------------------

    def _scan_nodes(self) -> list[Node]:
        """Every primary, by name: a scan's parts are the nodes, each with its own connections."""
        with translate_redis_errors(self._cluster):
            primaries = sorted(self._client.get_primaries(), key=lambda n: n.name)
        return [(n.name, n.redis_connection) for n in primaries]

    def _slot_groups(self, keys: list[bytes]) -> list[list[bytes]]:
        """Keys by slot: a node refuses a multi-key command across slots (``CROSSSLOT``). A table's
        keys fall in its buckets' slots, so a page of keys makes few groups."""
        by_slot: dict[int, list[bytes]] = {}
        for key in keys:
            by_slot.setdefault(key_slot(key), []).append(key)
        return list(by_slot.values())

    # -- the rest --------------------------------------------------------------------------------

    def _scan_count(self, pattern: str) -> int:
        with translate_redis_errors(self._cluster):
            return sum(1 for _ in self._client.scan_iter(match=pattern, count=1000))

    def node_of_keys(self, keys: Sequence[bytes]) -> list[str]:
        """host:port of the node serving each key (for tests and inspect)."""
        out = []
        for k in keys:
            node = self._client.get_node_from_key(k)
            out.append(f"{node.host}:{node.port}")
        return out

    def _shard_info(self, shard: int) -> dict[str, Any]:
        name = self.shard_names[shard]

        def fetch() -> dict[str, Any]:
            with translate_redis_errors(name):
                try:
                    client = self._routes.node(shard).redis_connection
                except SlotMapChangedError:  # a node that left the primaries holds none of this store's rows
                    return {"shard": name, "keys": 0, "used_memory": 0, "evicted_keys": 0, "expired_keys": 0}
                info = {**client.info("memory"), **client.info("stats")}
                return {
                    "shard": name,
                    "keys": client.dbsize(),
                    "used_memory": int(info.get("used_memory", 0)),
                    "evicted_keys": int(info.get("evicted_keys", 0)),
                    "expired_keys": int(info.get("expired_keys", 0)),
                }

        return self.retry.call(fetch)

    def _close_clients(self) -> None:
        self._client.close()
