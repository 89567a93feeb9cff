"""Redis backends: client-sharded standalone nodes (``redis``) and Redis Cluster (``redis-cluster``).

Both share one code path. A call is turned into a *plan* of pipelined commands
per shard (MGET / MSET / SET chunks of ``max_rows_per_command`` rows), the
shards run in parallel threads, and each shard's pipeline is one round trip,
retried as a whole by the store's :class:`~kelp.retry.RetryPolicy`. All tables
of a ``pull_many``/``push_many`` share that round trip.

* ``redis``: an id's shard is chosen by rendezvous hashing over the shard
  addresses, so adding or removing a node moves only ~1/n of the ids. Reads
  with ``count=False`` go to a read replica of the shard when configured.
* ``redis-cluster``: keys carry a hash tag naming one of
  ``cluster_buckets_per_table`` buckets; each bucket's rows go in one MGET/MSET
  and redis-py's cluster pipeline routes buckets to their nodes.

Rows are plain string keys (one per row) with ``PX`` set on every write when
the table has a TTL; see docs/store.md for the measured memory and why not
hashes. Pushes are whole-row last-writer-wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import redis
from kelp.config import StoreConfig, TableSpec
from kelp.store.base import EmbeddingStore, PullResult, StoreStats, Table
from kelp.store.errors import translate_redis_errors
from kelp.store.hashing import name_seed, rendezvous
from kelp.store.keys import KeyLayout
from kelp.store.memory import _counter_totals
from kelp.store.metrics import StoreMetrics
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from kelp.retry import RetryPolicy

__all__ = ["RedisClusterStore", "RedisStore"]


def _shard_name(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}" if parts.hostname else url.rsplit("@", maxsplit=1)[-1]


def client_kwargs(cfg: StoreConfig) -> dict[str, Any]:
    """Connection options from config. redis-py's own retry is off: Kelp's RetryPolicy is the one retry."""
    kw: dict[str, Any] = {
        "socket_timeout": cfg.socket_timeout_s,
        "socket_connect_timeout": cfg.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if cfg.username is not None:
        kw["username"] = cfg.username
    if cfg.password is not None:
        kw["password"] = cfg.password.get_secret_value()
    if cfg.tls.enabled:
        kw["ssl"] = True
        kw["ssl_check_hostname"] = cfg.tls.check_hostname
        if cfg.tls.ca_file is not None:
            kw["ssl_ca_certs"] = str(cfg.tls.ca_file)
        if cfg.tls.cert_file is not None:
            kw["ssl_certfile"] = str(cfg.tls.cert_file)
        if cfg.tls.key_file is not None:
            kw["ssl_keyfile"] = str(cfg.tls.key_file)
    return kw


def retry_policy(cfg: StoreConfig) -> RetryPolicy:
    return RetryPolicy(cfg.retry.attempts, cfg.retry.base_delay_s, cfg.retry.max_delay_s)


@dataclass
class _Cmd:
    """One pipelined command and where its reply goes."""

    args: tuple[Any, ...]
    on_reply: Callable[[Any], None] | None = None


@dataclass
class _Plan:
    """Commands per shard index, executed as one pipeline per shard."""

    cmds: dict[int, list[_Cmd]] = field(default_factory=dict)

    def add(self, shard: int, args: tuple[Any, ...], on_reply: Callable[[Any], None] | None = None) -> None:
        self.cmds.setdefault(shard, []).append(_Cmd(args, on_reply))


class _Group:
    """Ids of one table that go to one shard (and, in a cluster, one bucket); positions into the batch."""

    __slots__ = ("bucket", "pos", "shard")

    def __init__(self, shard: int, bucket: int, pos: np.ndarray) -> None:
        self.shard, self.bucket, self.pos = shard, bucket, pos


class _RedisBase(EmbeddingStore):
    backend = "redis"

    def __init__(
        self,
        cfg: StoreConfig,
        tables: list[TableSpec],
        deployment: str,
        registry: CollectorRegistry | None,
        *,
        retry: RetryPolicy | None,
        initial_state: float,
        seed: int | None,
        cluster_buckets: int | None,
    ) -> None:
        super().__init__(tables, initial_state)
        self.cfg = cfg
        self.deployment = deployment
        self.metrics = StoreMetrics(registry)
        self.retry = retry or retry_policy(cfg)
        self.chunk = cfg.max_rows_per_command
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()
        self.layouts = {name: KeyLayout(deployment, name, cluster_buckets) for name in self.tables}
        self.shard_names: list[str] = []
        self._pool: ThreadPoolExecutor | None = None

    # -- to implement per topology ---------------------------------------------------------------

    def _groups(self, table: str, ids: np.ndarray) -> list[_Group]:
        raise NotImplementedError

    def _pipeline(self, shard: int, readonly: bool) -> Any:
        raise NotImplementedError

    # -- execution ------------------------------------------------------------------------------

    def _run_shard(self, shard: int, cmds: list[_Cmd], op: str, readonly: bool) -> list[Any]:
        name = self.shard_names[shard]

        def attempt() -> list[Any]:
            with translate_redis_errors(name):
                pipe = self._pipeline(shard, readonly)
                for c in cmds:
                    pipe.execute_command(*c.args)
                return pipe.execute(raise_on_error=True)

        def on_retry(_n: int, _exc: BaseException) -> None:
            self.metrics.retries.labels(op=op).inc()

        replies = self.retry.call(attempt, on_retry)
        self.metrics.round_trips.labels(shard=name, op=op).inc()
        return replies

    def _execute(self, plan: _Plan, op: str, readonly: bool = False) -> None:
        """Run every shard's pipeline (in parallel), then hand replies to their callbacks.

        Callbacks run only after *all* shards succeeded, so a failed call never
        leaves half-decoded results behind.
        """
        items = list(plan.cmds.items())
        if not items:
            return
        try:
            if len(items) == 1 or self._pool is None:
                results = [self._run_shard(s, cmds, op, readonly) for s, cmds in items]
            else:
                futures = [self._pool.submit(self._run_shard, s, cmds, op, readonly) for s, cmds in items]
                results = [f.result() for f in futures]
        except Exception as exc:
            self.metrics.errors.labels(op=op, kind=type(exc).__name__).inc()
            raise
        for (_s, cmds), replies in zip(items, results, strict=True):
            for c, r in zip(cmds, replies, strict=True):
                if c.on_reply is not None:
                    c.on_reply(r)

    def _chunks(self, pos: np.ndarray) -> list[np.ndarray]:
        return [pos[i : i + self.chunk] for i in range(0, len(pos), self.chunk)] if len(pos) else []

    # -- pull -----------------------------------------------------------------------------------

    def pull_many(
        self, ids_by_table: Mapping[str, np.ndarray], *, count: bool = True
    ) -> dict[str, PullResult]:
        started = time.perf_counter()
        plan = _Plan()
        batches: dict[str, tuple[Table, np.ndarray, list[np.ndarray], list[bytes | None]]] = {}
        for name, raw in ids_by_table.items():
            t = self.table(name)
            ids = t.check_ids(raw)
            order: list[np.ndarray] = []
            values: list[bytes | None] = []
            batches[name] = (t, ids, order, values)
            layout = self.layouts[name]
            for g in self._groups(name, ids):
                for pos in self._chunks(g.pos):
                    keys = layout.row_keys(ids[pos], np.full(len(pos), g.bucket))
                    order.append(pos)
                    plan.add(g.shard, ("MGET", *keys), values.extend)
        self._execute(plan, "pull", readonly=not count)
        out: dict[str, PullResult] = {}
        admit_plan = _Plan()
        pending: list[Callable[[], None]] = []
        for name, (t, ids, order, values) in batches.items():
            # Replies arrive grouped by shard; decode them in that order, then put rows back in id order.
            decoded = t.codec.decode(values)
            n = len(ids)
            if len(order) > 1 or (order and not np.array_equal(order[0], np.arange(n))):
                where = np.concatenate(order)
                for field_name in ("present", "rows", "state", "updated_s"):
                    arr = getattr(decoded, field_name)
                    unsorted = np.empty_like(arr)
                    unsorted[where] = arr
                    setattr(decoded, field_name, unsorted)
            present = decoded.present
            rows, state = decoded.rows, decoded.state
            state[~present] = t.initial_state
            admitted = present.copy()
            missing = np.flatnonzero(~present)
            self._account_pull(t, n, len(missing))
            result = PullResult(rows, state, admitted, decoded.updated_s)
            out[name] = result
            if len(missing) == 0:
                continue
            policy = t.admission
            mids = ids[missing]
            if count and policy.off:
                rows[missing] = t.init_rows(mids)
                admitted[missing] = True
            elif count and policy.counts:
                pending.append(self._plan_counting(admit_plan, t, ids, missing, result))
                rows[missing] = t.default_rows(mids) if t.spec.default_row == "init" else 0.0
            elif count:
                with self._rng_lock:
                    lucky = policy.qualifies_by_chance(len(missing), self._rng)
                rows[missing] = t.default_rows(mids) if t.spec.default_row == "init" else 0.0
                if lucky.any():
                    pending.append(lambda t=t, m=missing[lucky], r=result, i=ids: self._admit(t, i, m, r))
                self.metrics.rejections.labels(table=t.name).inc(int((~lucky).sum()))
            else:
                rows[missing] = t.default_rows(mids) if t.spec.default_row == "init" else 0.0
        if admit_plan.cmds:
            self._execute(admit_plan, "admit")
        for step in pending:
            step()
        self.metrics.latency.labels(op="pull").observe(time.perf_counter() - started)
        return out

    def _account_pull(self, t: Table, n: int, misses: int) -> None:
        self.metrics.rows_pulled.labels(table=t.name).inc(n)
        self.metrics.bytes_received.labels(table=t.name).inc((n - misses) * t.codec.nbytes)
        if misses:
            self.metrics.misses.labels(table=t.name).inc(misses)

    def _plan_counting(
        self, plan: _Plan, t: Table, ids: np.ndarray, missing: np.ndarray, result: PullResult
    ) -> Callable[[], None]:
        """INCR each missing id's counter (with its own TTL); returns the step that admits qualifiers."""
        counts = np.zeros(len(ids), dtype=np.int64)
        layout = self.layouts[t.name]
        ttl_ms = max(1, int(t.admission.counter_ttl_s * 1000))
        mids = ids[missing]
        for g in self._groups(t.name, mids):
            keys = layout.counter_keys(mids[g.pos], np.full(len(g.pos), g.bucket))
            for k, p in zip(keys, missing[g.pos].tolist(), strict=True):
                plan.add(g.shard, ("INCR", k), _setter(counts, p))
                plan.add(g.shard, ("PEXPIRE", k, ttl_ms, "NX"))

        def admit() -> None:
            qualify = t.admission.qualifies_by_count(counts[missing])
            self.metrics.rejections.labels(table=t.name).inc(int((~qualify).sum()))
            if qualify.any():
                self._admit(t, ids, missing[qualify], result, drop_counters=True)

        return admit

    def _admit(
        self, t: Table, ids: np.ndarray, pos: np.ndarray, result: PullResult, drop_counters: bool = False
    ) -> None:
        """Store init rows for newly admitted ids (SET NX: a concurrent admission or a newer row wins)."""
        aids = ids[pos]
        init = t.init_rows(aids)
        now = int(time.time())
        values = t.codec.encode(init, np.full(len(aids), t.initial_state, np.float32), 0, now)
        layout = self.layouts[t.name]
        plan = _Plan()
        px = self._px(t)
        for g in self._groups(t.name, aids):
            bucket = np.full(len(g.pos), g.bucket)
            keys = layout.row_keys(aids[g.pos], bucket)
            for k, i in zip(keys, g.pos.tolist(), strict=True):
                plan.add(g.shard, ("SET", k, values[i], "NX", *px))
            if drop_counters:
                for chunk in self._chunks(np.arange(len(g.pos))):
                    plan.add(g.shard, ("DEL", *layout.counter_keys(aids[g.pos][chunk], bucket[chunk])))
        self._execute(plan, "admit")
        result.rows[pos] = init
        result.state[pos] = t.initial_state
        result.admitted[pos] = True
        if result.updated_s is not None:
            result.updated_s[pos] = now
        self.metrics.admissions.labels(table=t.name).inc(len(pos))

    @staticmethod
    def _px(t: Table) -> tuple[Any, ...]:
        return ("PX", max(1, int(t.ttl_s * 1000))) if t.ttl_s is not None else ()

    # -- push -----------------------------------------------------------------------------------

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        started = time.perf_counter()
        plan = _Plan()
        now = int(time.time())
        discards: list[tuple[Table, list[int]]] = []
        for name, (raw_ids, raw_rows, raw_state) in updates.items():
            t = self.table(name)
            ids, rows, state = t.check_push(raw_ids, raw_rows, raw_state)
            values = t.codec.encode(rows, state, 0, now)
            layout = self.layouts[name]
            px = self._px(t)
            dropped = [0]
            discards.append((t, dropped))
            for g in self._groups(name, ids):
                for pos in self._chunks(g.pos):
                    keys = layout.row_keys(ids[pos], np.full(len(pos), g.bucket))
                    vals = [values[i] for i in pos.tolist()] if len(pos) != len(values) else values
                    self.metrics.bytes_sent.labels(table=name).inc(len(pos) * (t.codec.nbytes + len(keys[0])))
                    if t.admission.off and not px:
                        flat: list[bytes] = [b""] * (2 * len(keys))
                        flat[0::2] = keys
                        flat[1::2] = vals
                        plan.add(g.shard, ("MSET", *flat))
                    elif t.admission.off:
                        for k, v in zip(keys, vals, strict=True):
                            plan.add(g.shard, ("SET", k, v, *px))
                    else:
                        # Admission on: only ids that still have a row (XX) keep the update.
                        for k, v in zip(keys, vals, strict=True):
                            plan.add(g.shard, ("SET", k, v, "XX", *px), _count_none(dropped))
        self._execute(plan, "push")
        for t, dropped in discards:
            n = len(updates[t.name][0])
            self.metrics.rows_pushed.labels(table=t.name).inc(n - dropped[0])
            if dropped[0]:
                self.metrics.push_discarded.labels(table=t.name).inc(dropped[0])
        self.metrics.latency.labels(op="push").observe(time.perf_counter() - started)

    # -- delete / stats -------------------------------------------------------------------------

    def delete(self, table: str, ids: np.ndarray) -> int:
        t = self.table(table)
        ids = t.check_ids(ids)
        layout = self.layouts[table]
        deleted = [0]
        plan = _Plan()
        for g in self._groups(table, ids):
            for pos in self._chunks(g.pos):
                bucket = np.full(len(pos), g.bucket)
                plan.add(g.shard, ("DEL", *layout.row_keys(ids[pos], bucket)), _adder(deleted))
                plan.add(g.shard, ("DEL", *layout.counter_keys(ids[pos], bucket)))
        self._execute(plan, "delete")
        return deleted[0]

    def raw_values(self, table: str, ids: np.ndarray) -> list[bytes | None]:
        """Stored values as bytes (for ``kelp store inspect``); never counts or admits."""
        t = self.table(table)
        ids = t.check_ids(ids)
        values: list[bytes | None] = [None] * len(ids)
        plan = _Plan()
        for g in self._groups(table, ids):
            keys = self.layouts[table].row_keys(ids[g.pos], np.full(len(g.pos), g.bucket))
            plan.add(g.shard, ("MGET", *keys), _scatter(values, g.pos))
        self._execute(plan, "inspect", readonly=True)
        return values

    def _shard_info(self, shard: int) -> dict[str, Any]:
        raise NotImplementedError

    def stats(self) -> StoreStats:
        shards = [self._shard_info(i) for i in range(len(self.shard_names))]
        total = sum(int(s.get("used_memory", 0)) for s in shards)
        return StoreStats(
            backend=self.backend,
            rows=dict.fromkeys(self.tables),
            bytes=total,
            counters=_counter_totals(self.metrics),
            shards=shards,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _scatter(values: list[bytes | None], pos: np.ndarray) -> Callable[[list[bytes | None]], None]:
    def put(reply: list[bytes | None]) -> None:
        for p, v in zip(pos.tolist(), reply, strict=True):
            values[p] = v

    return put


def _setter(arr: np.ndarray, p: int) -> Callable[[Any], None]:
    def put(reply: Any) -> None:
        arr[p] = int(reply)

    return put


def _adder(acc: list[int]) -> Callable[[Any], None]:
    def put(reply: Any) -> None:
        acc[0] += int(reply)

    return put


def _count_none(acc: list[int]) -> Callable[[Any], None]:
    def put(reply: Any) -> None:
        if reply is None:
            acc[0] += 1

    return put


class RedisStore(_RedisBase):
    """``backend: redis``: one or more standalone Redis nodes, sharded by rendezvous hashing on the id."""

    backend = "redis"

    def __init__(
        self,
        cfg: StoreConfig,
        tables: list[TableSpec],
        deployment: str = "kelp",
        registry: CollectorRegistry | None = None,
        *,
        retry: RetryPolicy | None = None,
        initial_state: float = 0.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            cfg,
            tables,
            deployment,
            registry,
            retry=retry,
            initial_state=initial_state,
            seed=seed,
            cluster_buckets=None,
        )
        kw = client_kwargs(cfg)
        self.shard_names = [_shard_name(u) for u in cfg.urls]
        self._clients = [redis.Redis.from_url(u, **kw) for u in cfg.urls]
        self._replicas = [[redis.Redis.from_url(u, **kw) for u in group] for group in cfg.replicas]
        self._seeds = np.array([name_seed("shard", n) for n in self.shard_names], dtype=np.uint64)
        self._table_seeds = {name: name_seed("table", deployment, name) for name in self.tables}
        self._replica_turn = 0
        if len(self._clients) > 1:
            self._pool = ThreadPoolExecutor(max_workers=len(self._clients), thread_name_prefix="kelp-store")

    def shard_of(self, table: str, ids: np.ndarray) -> np.ndarray:
        """int64[n] shard index of each id (stable across processes)."""
        return rendezvous(np.asarray(ids, np.uint64) ^ self._table_seeds[table], self._seeds)

    def _groups(self, table: str, ids: np.ndarray) -> list[_Group]:
        if len(self._clients) == 1:
            return [_Group(0, 0, np.arange(len(ids)))] if len(ids) else []
        shard = self.shard_of(table, ids)
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(len(self._clients) + 1))
        return [
            _Group(s, 0, order[bounds[s] : bounds[s + 1]])
            for s in range(len(self._clients))
            if bounds[s + 1] > bounds[s]
        ]

    def _pipeline(self, shard: int, readonly: bool) -> Any:
        client = self._clients[shard]
        if readonly and self._replicas and self._replicas[shard]:
            group = self._replicas[shard]
            self._replica_turn += 1
            client = group[self._replica_turn % len(group)]
        return client.pipeline(transaction=False)

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

    def close(self) -> None:
        super().close()
        for c in self._clients + [r for g in self._replicas for r in g]:
            c.close()


class RedisClusterStore(_RedisBase):
    """``backend: redis-cluster``: ids bucketed by hash tag, each bucket one MGET/MSET routed by slot."""

    backend = "redis-cluster"

    def __init__(
        self,
        cfg: StoreConfig,
        tables: list[TableSpec],
        deployment: str = "kelp",
        registry: CollectorRegistry | None = None,
        *,
        retry: RetryPolicy | None = None,
        initial_state: float = 0.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            cfg,
            tables,
            deployment,
            registry,
            retry=retry,
            initial_state=initial_state,
            seed=seed,
            cluster_buckets=cfg.cluster_buckets_per_table,
        )
        kw = client_kwargs(cfg)
        nodes = []
        for u in cfg.urls:
            p = urlsplit(u)
            nodes.append(ClusterNode(p.hostname or "127.0.0.1", p.port or 6379))
        self.shard_names = ["cluster(" + ",".join(_shard_name(u) for u in cfg.urls) + ")"]
        with translate_redis_errors(self.shard_names[0]):
            self._client = RedisCluster(startup_nodes=nodes, **kw)

    def _groups(self, table: str, ids: np.ndarray) -> list[_Group]:
        bucket = self.layouts[table].bucket_of(ids)
        order = np.argsort(bucket, kind="stable")
        nb = self.layouts[table].buckets or 1
        bounds = np.searchsorted(bucket[order], np.arange(nb + 1))
        return [
            _Group(0, b, order[bounds[b] : bounds[b + 1]]) for b in range(nb) if bounds[b + 1] > bounds[b]
        ]

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
        def fetch() -> dict[str, Any]:
            with translate_redis_errors(self.shard_names[0]):
                mem = self._client.info("memory", target_nodes=RedisCluster.PRIMARIES)
                stats = self._client.info("stats", target_nodes=RedisCluster.PRIMARIES)
                sizes = self._client.dbsize(target_nodes=RedisCluster.PRIMARIES)
                return {
                    "shard": self.shard_names[0],
                    "keys": sizes,
                    "used_memory": _sum_info(mem, "used_memory"),
                    "evicted_keys": _sum_info(stats, "evicted_keys"),
                    "expired_keys": _sum_info(stats, "expired_keys"),
                }

        return self.retry.call(fetch)

    def close(self) -> None:
        super().close()
        self._client.close()


def _sum_info(info: Any, key: str) -> int:
    if isinstance(info, dict) and key in info:
        return int(info[key])
    if isinstance(info, dict):
        return sum(int(v.get(key, 0)) for v in info.values() if isinstance(v, dict))
    return 0
