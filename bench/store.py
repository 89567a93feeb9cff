"""``kelp bench store``: batched pull/push through Kelp's Redis store vs raw MGET/MSET and a naive loop.

Workload: criteo-synth batches of 4096 samples, 26 tables of dim 16, deduplicated
per table (unique ids only), admission off, no TTL. Every measurement runs on
the same redis-server(s) started here, on the same keys, 1 shard and 3 shards:

* Kelp push: ``push_many`` over all 26 tables per step (encode + MSET per shard,
  one pipelined round trip per shard, shards in parallel).
* raw MSET: the same keys (prebuilt, untimed) and the same rows turned into
  bytes by a numpy view, MSET in the same chunking packed by numpy (as Kelp
  packs them), one pipeline per shard, shards in parallel threads: the floor
  Kelp's encoding and routing sit on.
* Kelp push with a TTL (every table ``ttl_s: 3600``, so each write also sets
  the key's expiry) against the same raw MSET: ``push_ratio_ttl``.
* Kelp pull: ``pull_many(count=True)``; raw MGET: the same keys and chunking,
  decoded with one ``numpy.frombuffer``.
* naive: a per-id GET loop (and SET loop) with redis-py, on a sample of ids.
* ``redis_bytes_per_row``: ``used_memory`` growth / rows on a flushed server
  (state, header and key included); ``redis_bytes_per_row_ttl`` with a TTL.
  The headline keys (pull, push, bytes) measure one key per row, as they always
  have; ``default_layout`` says which layout a standalone config gets now
  (``buckets``), measured by the ``buckets_*`` keys.
* ``cluster_*``: the same on a 3-node Redis Cluster (``backend: redis-cluster``,
  the key layout with 64 hash-tag buckets per table): Kelp against raw
  ``MGET``/``MSET`` of the same keys, one command per bucket, sent to the node
  holding it.
* ``buckets_*``: the same for ``store.layout.kind: buckets`` (one shard): pull and
  push against their own raw floor (per-row ``HGET``/``HSET`` on the same
  buckets, packed the same way), ``buckets_pull_vs_keys`` / ``_push_vs_keys``
  against the key layout's Kelp figures, and bytes per row with
  ``buckets_per_table`` sized as docs/store.md advises (about 48 rows each).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import redis

from kelp.bench.runner import progress
from kelp.config import EvictionSpec, RowLayoutSpec, StoreConfig, TableSpec
from kelp.harness import RedisCluster, RedisServer
from kelp.store import build_store
from kelp.store.redis import PackedPipeline, pack_commands, pack_runs
from kelp.store.redis.buckets import RedisBucketStore
from kelp.store.redis.shared import RedisStoreBase
from kelp.store.redis.standalone import RedisStore

__all__ = ["run"]

DIM = 16
N_TABLES = 26
BATCH = 4096


def _batches(steps: int) -> list[dict[str, np.ndarray]]:
    try:
        from kelp.bench.synth import CriteoSynth

        gen = CriteoSynth(seed=0)
        out = []
        for _ in range(steps):
            sparse = gen.batch(BATCH).sparse
            out.append({f"C{j + 1}": np.unique(sparse[:, j]) for j in range(N_TABLES)})
        return out
    except ImportError:  # the consumers package is optional for this suite
        rng = np.random.default_rng(0)
        ranks = np.arange(1, 1_000_001, dtype=np.float64)
        cdf = np.cumsum(ranks**-1.1)
        cdf /= cdf[-1]
        return [
            {
                f"C{j + 1}": np.unique(np.searchsorted(cdf, rng.random(BATCH)).astype(np.uint64) * 131 + j)
                for j in range(N_TABLES)
            }
            for _ in range(steps)
        ]


class _Raw:
    """The baseline client: the same keys, chunking and parallelism, sent the fastest plain way.

    Commands go out through the transport Kelp's stores use
    (:class:`~kelp.store.redis._wire.packed_pipeline.PackedPipeline`); with redis-py's own pipeline
    the floor was slower than Kelp (``push_ratio`` above 1). ``MGET`` commands are built
    before the clock starts, and ``MSET`` s are packed by numpy inside it, as Kelp packs
    both: packing by hiredis inside the clock would have made the floor slower than Kelp.
    """

    def __init__(self, store: RedisStoreBase, servers: list[RedisServer]) -> None:
        """``servers`` in ``store``'s shard order (a cluster store's shards are its primaries)."""
        self.store = store
        self.clients = [redis.Redis(host=s.host, port=s.port) for s in servers]
        self.pool = ThreadPoolExecutor(len(servers)) if len(servers) > 1 else None
        self.chunk = store.chunk

    def keys(self, batch: dict[str, np.ndarray]) -> list[list[list[bytes]]]:
        """Per shard, per chunk, the keys (built untimed; order = table order, shard-major)."""
        per_shard: list[list[list[bytes]]] = [[] for _ in self.clients]
        for name, ids in batch.items():
            for g in self.store.groups(name, ids):
                for i in range(0, len(g.pos), self.chunk):
                    pos = g.pos[i : i + self.chunk]
                    per_shard[g.shard].append(
                        self.store.layouts[name].row_keys(ids[pos], np.full(len(pos), g.bucket))
                    )
        return per_shard

    def _run(self, fn: Any, work: list[Any]) -> list[Any]:
        if self.pool is None:
            return [fn(0, work[0])]
        return list(self.pool.map(fn, range(len(work)), work))

    @staticmethod
    def mgets(per_shard: list[list[list[bytes]]]) -> list[list[bytes]]:
        """Per shard, :meth:`keys`' ``MGET`` commands already on the wire form (built untimed)."""

        def mget(keys: list[bytes]) -> bytes:  # every key of a table has one width
            return pack_runs(
                ("MGET",), np.array([len(keys)]), np.frombuffer(b"".join(keys), dtype=f"V{len(keys[0])}")
            )

        return [[mget(keys) for keys in chunks] for chunks in per_shard]

    def mget(self, per_shard: list[list[bytes]]) -> int:
        def one(s: int, commands: list[bytes]) -> np.ndarray:
            pipe = PackedPipeline(self.clients[s])
            for command in commands:
                pipe.add_packed(command, 1)
            values = [v for (reply,) in pipe.execute() for v in reply]
            return np.frombuffer(b"".join(values), dtype=np.float32).reshape(len(values), -1)

        return sum(len(a) for a in self._run(one, per_shard))

    @staticmethod
    def msets(
        per_shard: list[list[list[bytes]]], rows_by_shard: list[list[np.ndarray]]
    ) -> list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """Per shard, per key width (tables' names differ in length): the keys as one fixed-width array,
        the keys per ``MSET`` and the rows (untimed)."""
        out = []
        for chunks, rows in zip(per_shard, rows_by_shard, strict=True):
            by_width: dict[int, list[tuple[list[bytes], np.ndarray]]] = {}
            for chunk, r in zip(chunks, rows, strict=True):
                by_width.setdefault(len(chunk[0]), []).append((chunk, r))
            out.append(
                [
                    (
                        np.frombuffer(b"".join(k for chunk, _ in runs for k in chunk), dtype=f"V{width}"),
                        np.array([len(chunk) for chunk, _ in runs], dtype=np.int64),
                        np.ascontiguousarray(np.concatenate([r for _, r in runs])),
                    )
                    for width, runs in by_width.items()
                ]
            )
        return out

    def mset(self, per_shard: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]) -> None:
        """The rows turned into bytes by a numpy view and packed into ``MSET`` s by numpy, as Kelp does."""

        def one(s: int, work: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
            pipe = PackedPipeline(self.clients[s])
            for keys, lengths, rows in work:
                values = rows.view(np.dtype(f"V{rows.shape[1] * 4}")).ravel()
                pipe.add_packed(pack_runs(("MSET",), lengths, keys, values), len(lengths))
            pipe.execute()

        self._run(one, per_shard)

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown()
        for c in self.clients:
            c.close()


def _workload(steps: int) -> tuple[list[dict[str, np.ndarray]], list[dict[str, Any]]]:
    """The steps' unique ids per table, and a push of random rows for each (the same in every run)."""
    batches = _batches(steps)
    rng = np.random.default_rng(1)
    updates = [
        {
            n: (ids, rng.normal(size=(len(ids), DIM)).astype(np.float32), np.ones(len(ids), np.float32))
            for n, ids in b.items()
        }
        for b in batches
    ]
    return batches, updates


def _interleaved(
    rows: int, steps: int, reps: int, sides: tuple[tuple[str, Callable[[int], Any]], ...]
) -> dict[str, float]:
    """Rows per second of each side: the best of ``reps`` passes over ``steps``, in two interleaved
    rounds, so warm-up order favours no side."""

    def timed(fn: Callable[[int], Any]) -> float:
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for i in range(steps):
                fn(i)
            best = min(best, time.perf_counter() - t0)
        return rows / best

    out: dict[str, float] = {}
    for _round in range(2):
        for key, fn in sides:
            out[key] = max(out.get(key, 0.0), timed(fn))
    return out


def _measure(servers: list[RedisServer], steps: int, reps: int) -> dict[str, float]:
    """The key layout on standalone shards (client-side sharding)."""
    cfg = StoreConfig(backend="redis", urls=[s.url for s in servers], layout=RowLayoutSpec(kind="keys"))
    return _compare(cfg, servers, steps, reps)


def _measure_cluster(cluster: RedisCluster, steps: int, reps: int) -> dict[str, float]:
    """The key layout on a Redis Cluster: each hash-tag bucket's rows in one command, per node."""
    return _compare(StoreConfig(backend="redis-cluster", urls=cluster.urls), cluster.servers, steps, reps)


def _compare(cfg: StoreConfig, servers: list[RedisServer], steps: int, reps: int) -> dict[str, float]:
    for s in servers:
        s.client().flushall()
    tables = [TableSpec(name=f"C{j + 1}", dim=DIM) for j in range(N_TABLES)]
    store = build_store(cfg, tables, "bench")
    assert isinstance(store, RedisStoreBase)
    ttl_tables = [t.model_copy(update={"eviction": EvictionSpec(ttl_s=3600.0)}) for t in tables]
    ttl_store = build_store(cfg, ttl_tables, "bench-ttl")
    by_name = {f"{s.host}:{s.port}": s for s in servers}
    raw = _Raw(store, [by_name[name] for name in store.shard_names])
    batches, updates = _workload(steps)
    rows_per_step = [sum(len(ids) for ids in b.values()) for b in batches]
    total = sum(rows_per_step) * reps
    progress(
        f"{len(servers)} shard(s): {steps} steps x {reps} reps, {total / (steps * reps):.0f} unique rows/step"
    )

    keys = [raw.keys(b) for b in batches]
    mgets = [raw.mgets(k) for k in keys]
    # Baseline rows arranged like the keys (Kelp's header is part of its value; the raw rows carry 16+dim
    # floats so both write the same bytes per row).
    raw_rows = []
    for b, u in zip(batches, updates, strict=True):
        per_shard: list[list[np.ndarray]] = [[] for _ in servers]
        for name, ids in b.items():
            full = np.concatenate([np.zeros((len(ids), 4), np.float32), u[name][1]], axis=1)
            for g in store.groups(name, ids):
                for i in range(0, len(g.pos), store.chunk):
                    per_shard[g.shard].append(np.ascontiguousarray(full[g.pos[i : i + store.chunk]]))
        raw_rows.append(per_shard)
    msets = [raw.msets(k, r) for k, r in zip(keys, raw_rows, strict=True)]

    out = _interleaved(
        sum(rows_per_step),
        steps,
        reps,
        (
            ("raw_mset_rows_per_s", lambda i: raw.mset(msets[i])),
            ("push_rows_per_s", lambda i: store.push_many(updates[i])),
            ("push_ttl_rows_per_s", lambda i: ttl_store.push_many(updates[i])),
            ("raw_mget_rows_per_s", lambda i: raw.mget(mgets[i])),
            ("pull_rows_per_s", lambda i: store.pull_many(batches[i])),
        ),
    )
    check = store.pull_many(batches[0], count=False)
    assert all(r.admitted.all() for r in check.values()), "bench rows missing after push"

    # naive: one GET / SET per id on a sample, same keys
    sample_keys = [k for chunk in keys[0][0] for k in chunk][:3000]
    client = raw.clients[0]
    t0 = time.perf_counter()
    for k in sample_keys:
        v = client.get(k)
        np.frombuffer(v, dtype=np.float32)
    out["naive_rows_per_s"] = len(sample_keys) / (time.perf_counter() - t0)
    value = b"\x00" * store.tables["C1"].codec.nbytes
    t0 = time.perf_counter()
    for k in sample_keys:
        client.set(k, value)
    out["naive_set_rows_per_s"] = len(sample_keys) / (time.perf_counter() - t0)
    raw.close()
    store.close()
    ttl_store.close()
    out["pull_ratio"] = out["pull_rows_per_s"] / out["raw_mget_rows_per_s"]
    out["push_ratio"] = out["push_rows_per_s"] / out["raw_mset_rows_per_s"]
    out["push_ratio_ttl"] = out["push_ttl_rows_per_s"] / out["raw_mset_rows_per_s"]
    out["speedup_vs_naive"] = out["pull_rows_per_s"] / out["naive_rows_per_s"]
    out["rows_per_step"] = sum(rows_per_step) / steps
    return out


def _measure_buckets(server: RedisServer, steps: int, reps: int) -> dict[str, float]:
    """``store.layout.kind: buckets`` on one shard, against its own raw floor and the keys layout's.

    Raw floor: the same per-row ``HGET``/``HSET`` commands on the same buckets, packed
    the same way (:func:`~kelp.store.redis._wire.packing.pack_commands`), replies read as Kelp reads them
    (``HGET``: :func:`~kelp.store.redis._wire.row_replies.read_rows`, values as one array, viewed as
    floats; ``HSET``: :func:`~kelp.store.redis._wire.int_replies.read_ints`): what Kelp's encoding,
    routing and decoding cost on top.
    """
    server.client().flushall()
    tables = [TableSpec(name=f"C{j + 1}", dim=DIM) for j in range(N_TABLES)]
    layout = RowLayoutSpec(kind="buckets")
    cfg = StoreConfig(backend="redis", urls=[server.url], layout=layout)
    store = build_store(cfg, tables, "bench-buckets")
    assert isinstance(store, RedisBucketStore)
    ttl_tables = [t.model_copy(update={"eviction": EvictionSpec(ttl_s=3600.0)}) for t in tables]
    ttl_store = build_store(cfg, ttl_tables, "bench-buckets-ttl")
    client = server.client()
    batches, updates = _workload(steps)
    width = store.tables["C1"].codec.nbytes

    def wire(i: int, command: str) -> tuple[bytes, int]:  # untimed: the floor's commands, prebuilt
        parts, n = [], 0
        for name, ids in batches[i].items():
            layout_t = store.buckets[name]
            keys = layout_t.bucket_keys(layout_t.bucket_of(ids))
            columns = [keys, layout_t.fields(ids)]
            if command == "HSET":
                full = np.concatenate([np.zeros((len(ids), 4), np.float32), updates[i][name][1]], axis=1)
                columns.append(np.ascontiguousarray(full).view(f"V{width}").ravel())
            parts.append(pack_commands((command,), *columns))
            n += len(ids)
        return b"".join(parts), n

    hgets = [wire(i, "HGET") for i in range(steps)]
    hsets = [wire(i, "HSET") for i in range(steps)]

    def raw(payload: tuple[bytes, int], decode: bool) -> None:
        pipe = PackedPipeline(client)
        pipe.add_packed(*payload, width if decode else None, integers=not decode)
        (replies,) = pipe.execute()
        if decode:  # the replies parsed off the socket as rows, as Kelp's pull reads them
            replies.values.view(np.float32).reshape(len(replies.values), -1)

    rows_per_step = [sum(len(ids) for ids in b.values()) for b in batches]

    out = _interleaved(
        sum(rows_per_step),
        steps,
        reps,
        (
            ("raw_hset_rows_per_s", lambda i: raw(hsets[i], decode=False)),
            ("push_rows_per_s", lambda i: store.push_many(updates[i])),
            ("push_ttl_rows_per_s", lambda i: ttl_store.push_many(updates[i])),
            ("raw_hget_rows_per_s", lambda i: raw(hgets[i], decode=True)),
            ("pull_rows_per_s", lambda i: store.pull_many(batches[i])),
        ),
    )
    check = store.pull_many(batches[0], count=False)
    assert all(r.admitted.all() for r in check.values()), "bench rows missing after push"
    store.close()
    ttl_store.close()
    out["pull_ratio"] = out["pull_rows_per_s"] / out["raw_hget_rows_per_s"]
    out["push_ratio"] = out["push_rows_per_s"] / out["raw_hset_rows_per_s"]
    out["push_ratio_ttl"] = out["push_ttl_rows_per_s"] / out["raw_hset_rows_per_s"]
    return out


def _spread_ids(start: int, stop: int) -> np.ndarray:
    return (np.arange(start, stop, dtype=np.uint64) * np.uint64(2654435761)) + np.uint64(1)


def bytes_per_row(
    server: RedisServer, rows: int, ttl_s: float | None, dim: int = DIM, layout: RowLayoutSpec | None = None
) -> float:
    """``used_memory`` growth per stored row (key, row, optimizer state, timestamp, TTL), flushed server.

    ``layout`` defaults to one key per row (what ``redis_bytes_per_row`` has always measured).
    """
    client = server.client()
    client.flushall()
    time.sleep(0.05)
    table = TableSpec(name="C1", dim=dim, eviction={"ttl_s": ttl_s})
    cfg = StoreConfig(backend="redis", urls=[server.url], layout=layout or RowLayoutSpec(kind="keys"))
    store = build_store(cfg, [table], "bench")  # the buckets layout may raise listpack limits first
    before = int(client.info("memory")["used_memory"])
    rng = np.random.default_rng(2)
    for start in range(0, rows, 50_000):
        ids = _spread_ids(start, min(rows, start + 50_000))
        store.push(
            "C1", ids, rng.normal(size=(len(ids), dim)).astype(np.float32), np.ones(len(ids), np.float32)
        )
    after = int(client.info("memory")["used_memory"])
    store.close()
    client.flushall()
    return (after - before) / rows


def bytes_per_counter(server: RedisServer, counters: int) -> float:
    """``used_memory`` growth per admission counter (an id seen, not admitted yet; with its counter TTL)."""
    client = server.client()
    client.flushall()
    time.sleep(0.05)
    before = int(client.info("memory")["used_memory"])
    table = TableSpec(name="C1", dim=DIM, admission={"min_count": 1_000_000})
    store = RedisStore(StoreConfig(backend="redis", urls=[server.url]), [table], deployment="bench")
    for start in range(0, counters, 50_000):
        store.pull("C1", _spread_ids(start, min(counters, start + 50_000)))  # one sighting: a counter each
    after = int(client.info("memory")["used_memory"])
    store.close()
    client.flushall()
    return (after - before) / counters


def run(quick: bool) -> dict[str, Any]:
    steps, reps = (4, 2) if quick else (20, 3)
    mem_rows = 200_000 if quick else 1_000_000
    result: dict[str, Any] = {"dim": DIM, "tables": N_TABLES, "batch_samples": BATCH}
    servers = [RedisServer() for _ in range(3)]
    try:
        for s in servers:
            s.start()
        progress("1 shard")
        one = _measure(servers[:1], steps, reps)
        result.update({k: round(v, 3) for k, v in one.items()})
        progress("3 shards")
        three = _measure(servers, steps, reps)
        result.update({f"{k}_3shards": round(v, 3) for k, v in three.items()})
        progress("Redis Cluster, 3 nodes")
        with RedisCluster(3) as cluster:
            on_cluster = _measure_cluster(cluster, steps, reps)
        result.update({f"cluster_{k}": round(v, 3) for k, v in on_cluster.items()})
        progress(f"memory per row ({mem_rows} rows)")
        keys = RowLayoutSpec(kind="keys")  # the headline keys keep their meaning: one key per row
        result["redis_bytes_per_row"] = round(bytes_per_row(servers[0], mem_rows, None, layout=keys), 1)
        result["redis_bytes_per_row_ttl"] = round(bytes_per_row(servers[0], mem_rows, 3600.0, layout=keys), 1)
        result["default_layout"] = StoreConfig(backend="redis", urls=[servers[0].url]).row_layout
        progress("layout buckets, 1 shard")
        buckets = _measure_buckets(servers[0], steps, reps)
        result.update({f"buckets_{k}": round(v, 3) for k, v in buckets.items()})
        result["buckets_pull_vs_keys"] = round(buckets["pull_rows_per_s"] / one["pull_rows_per_s"], 3)
        result["buckets_push_vs_keys"] = round(buckets["push_rows_per_s"] / one["push_rows_per_s"], 3)
        # sized as docs/store.md advises: about 48 rows per bucket
        sized = RowLayoutSpec(kind="buckets", buckets_per_table=max(1, mem_rows // 48))
        result["buckets_per_table"] = sized.buckets_per_table
        result["buckets_redis_bytes_per_row"] = round(
            bytes_per_row(servers[0], mem_rows, None, layout=sized), 1
        )
        result["buckets_redis_bytes_per_row_ttl"] = round(
            bytes_per_row(servers[0], mem_rows, 3600.0, layout=sized), 1
        )
        result["redis_version"] = servers[0].client().info("server")["redis_version"]
    finally:
        for s in servers:
            s.cleanup()
    return result
