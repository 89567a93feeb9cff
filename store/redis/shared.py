"""What both Redis backends share: the constructor, the four flow primitives as plans, delete, inspect, stats.

A topology (:class:`~kelp.store.redis.standalone.RedisStore`, client-sharded standalone
nodes; :class:`~kelp.store.redis.cluster.RedisClusterStore`, Redis Cluster)
only says how to connect, how ids split into shard/bucket groups, and how to
open a pipeline; see :class:`RedisStoreBase`.

Rows are plain string keys (one per row, :mod:`kelp.store.redis.keys`) with ``PX``
set on every write when the table has a TTL; see docs/store.md for the measured
memory and why not hashes. Pushes are whole-row last-writer-wins. Per call,
every table shares one round trip per shard for the reads (op ``pull``), one
for sighting counters and one for admissions (op ``admit``), one for pushes
(op ``push``); with ``store.durability.replicas_ack`` each shard's push pipeline
ends with ``WAIT`` (:mod:`kelp.store.redis.durability`).

A ``WRONGTYPE`` reply (a key of this deployment holding another Redis type)
fails the call with :class:`~kelp.store.errors.WrongTypeError` naming the key
and the table: after the error, the keys of the call are asked their ``TYPE``
(the error path only), and Kelp never deletes such a key itself.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import chain
from typing import Any, ClassVar

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import StoreConfig, TableSpec
from kelp.errors import KelpError
from kelp.retry import RetryPolicy
from kelp.store.base import PullResult, ReadRows, StoreStats, Table
from kelp.store.errors import StoreCommandError, WrongTypeError
from kelp.store.flow import FlowStore, InitRows, RowWrite, StoredRows
from kelp.store.policy.eviction import EvictionPolicy, LfuCapacity, TtlEviction
from kelp.store.redis._wire.packing import pack_runs
from kelp.store.redis.adagrad import ADAGRAD_SCRIPT, script_args
from kelp.store.redis.connection import connection_options
from kelp.store.redis.durability import replica_wait, report_durability
from kelp.store.redis.keys import KeyLayout, quote_key
from kelp.store.redis.plan import Gathered, Group, Plan, PlanRunner, adder, chunks, scatter, setter
from kelp.store.redis.row_scan import (
    Node,
    Skipped,
    batched,
    ids_of,
    live_rows,
    pieces,
    round_trip,
    scan_pages,
    unlink_matching,
)
from kelp.store.redis.set_rows import set_rows_args
from kelp.store.rows import stored as stored_rows
from kelp.store.rows.codec import DecodedRows

__all__ = ["RedisStoreBase", "TypedKeys", "retry_policy"]

TypedKeys = tuple[int, list[bytes], str, str]
"""Keys of one shard a call touches, the Redis type they must hold, and what they are:
``(shard, keys, "hash", "bucket")``."""

_TYPE_CHECKS_AT_MOST = 200_000
"""Keys asked their ``TYPE`` after a ``WRONGTYPE`` reply, at most (an error path, but not unbounded)."""
LOAD_ROWS_PER_CALL = 32_768
"""Rows of one :meth:`RedisStoreBase.load_rows` pipeline run: a restore's shard of rows is written in
runs of a few MB per node, not one pipeline of its whole size."""
_DROP_SCAN_COUNT = 1000


def retry_policy(cfg: StoreConfig) -> RetryPolicy:
    """The store's retry of one shard's pipeline, from ``store.retry``."""
    return RetryPolicy(cfg.retry.attempts, cfg.retry.base_delay_s, cfg.retry.max_delay_s)


def _flat(on_reply: Callable[[Any], None]) -> Callable[[list[Any]], None]:
    """A packed run of ``MGET`` s hands its replies over as a list of lists: pass them on as one list."""

    def put(replies: list[Any]) -> None:
        on_reply(list(chain.from_iterable(replies)))

    return put


def _runs_by_shard(
    groups: list[Group], chunk: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """Per shard, in group order: ``(shard, pos, lengths, bucket)``, its groups' positions cut into
    commands of at most ``chunk`` rows (``lengths``), and each row's bucket."""
    by_shard: dict[int, list[tuple[np.ndarray, int]]] = {}
    for g in groups:
        for pos in chunks(g.pos, chunk):
            by_shard.setdefault(g.shard, []).append((pos, g.bucket))
    for shard, runs in by_shard.items():
        lengths = np.array([len(p) for p, _ in runs], dtype=np.int64)
        pos = runs[0][0] if len(runs) == 1 else np.concatenate([p for p, _ in runs])
        yield shard, pos, lengths, np.repeat(np.array([b for _, b in runs], dtype=np.int64), lengths)


class RedisStoreBase(FlowStore):
    """Base of the Redis topologies. Subclasses implement the four hooks at the end of the class.

    ``retry`` replaces the policy from ``store.retry`` (tests pass one that
    never sleeps); ``seed`` seeds chance admission; ``clock`` (unix seconds)
    stamps rows, and the ``buckets`` layout judges row TTLs by it.
    """

    backend = "redis"
    enforces = frozenset({TtlEviction})
    composes_updates = True
    packs_commands: ClassVar[bool] = False
    """Whether this topology's pipelines take commands packed by numpy (``add_packed``)."""
    eviction_hints: ClassVar[dict[type[EvictionPolicy], str]] = {
        LfuCapacity: "cap memory with Redis maxmemory + maxmemory-policy allkeys-lfu (docs/store.md), "
        "or use backend memory"
    }

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
        clock: Callable[[], float] = time.time,
        writer: bool = True,
    ) -> None:
        super().__init__(tables, registry, initial_state=initial_state, seed=seed, clock=clock)
        self.cfg = cfg
        self.writer = writer
        """False for a reader (a serving replica): no durability line at info, no server tuning for writes."""
        self.deployment = deployment
        self.retry = retry or retry_policy(cfg)
        self.chunk = cfg.max_rows_per_command
        self.layouts = {name: KeyLayout(deployment, name, self._cluster_buckets(cfg)) for name in self.tables}
        self.shard_names = self._connect(cfg, connection_options(cfg))
        self._runner = PlanRunner(
            self.shard_names,
            self._pipeline,
            self.retry,
            self.metrics,
            wait=replica_wait(cfg, self.metrics.registry),  # store.durability.replicas_ack
        )
        self._checked = False

    def _ready(self) -> None:
        """Before the first operation (not in the constructor, so a process can start while Redis is
        down and report it unready): the topology's one-time checks, until they pass once."""
        if not self._checked:
            self._first_contact()
            report_durability(self, writer=self.writer)  # what a Redis crash may lose, logged and exported
            self._checked = True

    def _first_contact(self) -> None:
        """A topology's one-time checks (standalone: the deployment's row layout marker)."""

    # -- the flow, with WRONGTYPE replies named -------------------------------------------------

    def pull_many(
        self,
        ids_by_table: Mapping[str, np.ndarray],
        *,
        count: bool = True,
        occurrences: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, PullResult]:
        with self._naming_wrong_type(ids_by_table):
            return super().pull_many(ids_by_table, count=count, occurrences=occurrences)

    def read_many(self, ids_by_table: Mapping[str, np.ndarray]) -> ReadRows:
        with self._naming_wrong_type(ids_by_table):
            return super().read_many(ids_by_table)

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> int:
        with self._naming_wrong_type({name: u[0] for name, u in updates.items()}):
            return super().push_many(updates)

    def apply_adagrad_many(
        self,
        updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        lr: float,
        eps: float,
    ) -> int:
        with self._naming_wrong_type({name: u[0] for name, u in updates.items()}):
            return super().apply_adagrad_many(updates, lr, eps)

    @contextmanager
    def _naming_wrong_type(self, ids_by_table: Mapping[str, np.ndarray]) -> Iterator[None]:
        """A ``WRONGTYPE`` reply inside the block becomes a :class:`WrongTypeError` naming the key
        and the table (found by asking the call's keys their ``TYPE``); other errors pass as they are."""
        try:
            yield
        except WrongTypeError:
            raise
        except StoreCommandError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            named = self._find_wrong_type(ids_by_table)
            if named is None:
                raise
            raise named from exc

    def _find_wrong_type(self, ids_by_table: Mapping[str, np.ndarray]) -> WrongTypeError | None:
        """The first key of the call (table order) that holds another type than Kelp puts there."""
        budget = _TYPE_CHECKS_AT_MOST
        try:
            for name, raw in ids_by_table.items():
                if name not in self.tables or budget <= 0:
                    continue
                ids = self.tables[name].check_ids(raw)
                for shard, all_keys, expected, what in self._typed_keys(name, ids):
                    keys = all_keys[: max(budget, 0)]
                    budget -= len(keys)
                    for key, kind in zip(keys, self._key_types(shard, keys), strict=True):
                        if kind not in ("none", expected):
                            return WrongTypeError(
                                f"store table {name!r}: key {quote_key(key)} on {self.shard_names[shard]} "
                                f"holds a {kind}, expected a {expected} ({what}); Kelp leaves it alone: "
                                "rename or delete it (redis-cli) if it is not someone's data"
                            )
        except KelpError:  # the shard went away, or TYPE is not allowed: the WRONGTYPE error itself is raised
            return None
        return None

    def _typed_keys(self, table: str, ids: np.ndarray) -> Iterator[TypedKeys]:
        """The keys a call on ``ids`` of ``table`` touches, per shard, with the type each must hold."""
        layout = self.layouts[table]
        for g in self.groups(table, ids):
            bucket = np.full(len(g.pos), g.bucket)
            yield g.shard, layout.row_keys(ids[g.pos], bucket), "string", "row"
            yield g.shard, layout.counter_keys(ids[g.pos], bucket), "string", "admission counter"

    def _key_types(self, shard: int, keys: list[bytes]) -> list[str]:
        """``TYPE`` of each key of one shard (``"none"`` where there is no such key)."""
        types: list[Any] = [None] * len(keys)
        plan = Plan()
        for i, key in enumerate(keys):
            plan.add(shard, ("TYPE", key), lambda reply, i=i: types.__setitem__(i, reply))
        self._runner.run(plan, "inspect")
        return [t.decode() if isinstance(t, bytes) else str(t) for t in types]

    def _where(self, table: str, ids: np.ndarray) -> list[str]:
        """Each id's row key (as redis-cli reads it) and its shard."""
        layout = self.layouts[table]
        out = [""] * len(ids)
        for g in self.groups(table, ids):
            keys = layout.row_keys(ids[g.pos], np.full(len(g.pos), g.bucket))
            for p, key in zip(g.pos.tolist(), keys, strict=True):
                out[p] = f"key {quote_key(key)} on {self.shard_names[g.shard]}"
        return out

    # -- the flow's primitives ------------------------------------------------------------------

    def _read_rows(
        self, ids_by_table: Mapping[str, np.ndarray], now: float, touch: bool
    ) -> dict[str, StoredRows]:
        plan = Plan()
        parts: dict[str, Gathered] = {}
        for name, ids in ids_by_table.items():
            gathered = parts[name] = Gathered()
            layout = self.layouts[name]
            if self._packs_commands():  # a shard's MGETs packed by numpy at once, no Python bytes per key
                for shard, pos, lengths, bucket in self._runs(name, ids):
                    mgets = pack_runs(("MGET",), lengths, layout.row_key_array(ids[pos], bucket))
                    plan.add_packed(shard, mgets, len(lengths), _flat(gathered.add(pos)))
                continue
            for g in self.groups(name, ids):
                for pos in chunks(g.pos, self.chunk):
                    bucket = np.full(len(pos), g.bucket)
                    plan.add(g.shard, ("MGET", *layout.row_keys(ids[pos], bucket)), gathered.add(pos))
        self._runner.run(plan, "pull", readonly=not touch)
        return self._decode_all(parts)

    def _decode_all(self, parts: Mapping[str, Gathered]) -> dict[str, StoredRows]:
        """Decode the replies of all tables that share a row format in one pass, then split per table.

        A serving request reads ~50 rows from each of 26 tables; one decode of
        1,300 values costs a fraction of 26 decodes of 50 (numpy's fixed cost per call).
        """
        by_format: dict[tuple[int, str], list[str]] = {}
        for name in parts:
            codec = self.tables[name].codec
            by_format.setdefault((codec.dim, codec.dtype), []).append(name)
        out: dict[str, StoredRows] = {}
        for names in by_format.values():
            codec = self.tables[names[0]].codec
            values = {name: parts[name].values() for name in names}
            decoded = codec.decode(list(chain.from_iterable(values.values())))
            start = 0
            for name in names:
                end = start + len(values[name])
                piece = decoded.part(start, end).in_order(parts[name].order)
                out[name] = self._stored(self.tables[name], piece)
                start = end
        return out

    def _stored(self, t: Table, decoded: DecodedRows) -> StoredRows:
        """One table's decoded rows (in id order) as the flow wants them; counts the bytes read."""
        self.metrics.received.inc(int(decoded.present.sum()) * t.codec.nbytes, t.name)
        return StoredRows(
            decoded.present, decoded.rows, decoded.state, decoded.updated_s, fault=decoded.fault
        )

    def _count_sightings(
        self, requests: Mapping[str, tuple[np.ndarray, np.ndarray, float]], now: float
    ) -> dict[str, np.ndarray]:
        """INCRBY each id's counter (one command per id, as INCR was); ``PEXPIRE ... NX`` sets new TTLs."""
        plan = Plan()
        counts: dict[str, np.ndarray] = {}
        for name, (ids, increments, ttl_s) in requests.items():
            got = counts[name] = np.zeros(len(ids), dtype=np.int64)
            layout = self.layouts[name]
            ttl_ms = max(1, int(ttl_s * 1000))
            for g in self.groups(name, ids):
                keys = layout.counter_keys(ids[g.pos], np.full(len(g.pos), g.bucket))
                for k, p in zip(keys, g.pos.tolist(), strict=True):
                    plan.add(g.shard, ("INCRBY", k, int(increments[p])), setter(got, p))
                    plan.add(g.shard, ("PEXPIRE", k, ttl_ms, "NX"))
        self._runner.run(plan, "admit")
        return counts

    def _store_init_rows(self, admits: Mapping[str, InitRows], now: float) -> None:
        """``SET NX`` (a concurrent admission or a newer row wins); DEL the counters of counting policies."""
        plan = Plan()
        for name, a in admits.items():
            t = self.tables[name]
            values = t.codec.encode(a.rows, a.state, 0, int(now))
            layout = self.layouts[name]
            px = self._px(t)
            for g in self.groups(name, a.ids):
                bucket = np.full(len(g.pos), g.bucket)
                for k, i in zip(layout.row_keys(a.ids[g.pos], bucket), g.pos.tolist(), strict=True):
                    plan.add(g.shard, ("SET", k, values[i], "NX", *px))
                if a.drop_counters:
                    for pos in chunks(np.arange(len(g.pos)), self.chunk):
                        plan.add(g.shard, ("DEL", *layout.counter_keys(a.ids[g.pos][pos], bucket[pos])))
        self._runner.run(plan, "admit")

    def _write_rows(self, writes: Mapping[str, RowWrite], now: float) -> dict[str, int]:
        """MSET (or SET ... PX with a TTL); ``create=False`` writes SET ... XX and counts the nil replies."""
        plan = Plan()
        kept: dict[str, list[int]] = {}
        for name, w in writes.items():
            t = self.tables[name]
            layout = self.layouts[name]
            px_ms = t.ttl.ttl_ms if t.ttl is not None else 0
            got = kept[name] = [0]
            if w.create and not px_ms and self._packs_commands():  # MSETs packed by numpy, as reads are
                packed = t.codec.pack(w.rows, w.state, 0, int(now)).view(f"V{t.codec.nbytes}")
                for shard, pos, lengths, bucket in self._runs(name, w.ids):
                    keys = layout.row_key_array(w.ids[pos], bucket)
                    plan.add_packed(shard, pack_runs(("MSET",), lengths, keys, packed[pos]), len(lengths))
                got[0] = len(w.ids)
                self.metrics.sent.inc(len(w.ids) * (t.codec.nbytes + layout.key_width), name)
                continue
            values = t.codec.encode(w.rows, w.state, 0, int(now))
            for g in self.groups(name, w.ids):
                for pos in chunks(g.pos, self.chunk):
                    keys = layout.row_keys(w.ids[pos], np.full(len(pos), g.bucket))
                    vals = [values[i] for i in pos.tolist()] if len(pos) != len(values) else values
                    self.metrics.sent.inc(len(pos) * (t.codec.nbytes + len(keys[0])), name)
                    if w.create and not px_ms:
                        flat: list[bytes] = [b""] * (2 * len(keys))
                        flat[0::2] = keys
                        flat[1::2] = vals
                        plan.add(g.shard, ("MSET", *flat))
                        got[0] += len(keys)
                    else:  # an expiry or XX: one script call per chunk (store/redis/set_rows.py)
                        plan.add(g.shard, set_rows_args(keys, vals, px_ms, not w.create), adder(got))
        self._runner.run(plan, "push")
        return {name: got[0] for name, got in kept.items()}

    def _apply_adagrad(
        self, writes: Mapping[str, RowWrite], lr: float, eps: float, now: float
    ) -> dict[str, int]:
        """One ``EVAL`` of :data:`~kelp.store.redis.adagrad.ADAGRAD_SCRIPT` per chunk of a shard group."""
        plan = Plan()
        kept: dict[str, list[int]] = {}
        for name, w in writes.items():
            t = self.tables[name]
            assert w.grads is not None
            values = t.codec.encode(w.rows, w.state, 0, int(now))
            layout = self.layouts[name]
            px_ms = t.ttl.ttl_ms if t.ttl is not None else 0
            got = kept[name] = [0]
            for g in self.groups(name, w.ids):
                for pos in chunks(g.pos, self.chunk):
                    keys = layout.row_keys(w.ids[pos], np.full(len(pos), g.bucket))
                    grads = [w.grads[i].tobytes() for i in pos.tolist()]
                    rows = [values[i] for i in pos.tolist()]
                    args = script_args(
                        lr=lr,
                        eps=eps,
                        dim=t.codec.dim,
                        now=int(now),
                        px_ms=px_ms,
                        create=w.create,
                        grads=grads,
                        rows=rows,
                    )
                    self.metrics.sent.inc(sum(map(len, grads)) + sum(map(len, rows)), name)
                    plan.add(g.shard, ("EVAL", ADAGRAD_SCRIPT, len(keys), *keys, *args), adder(got))
        self._runner.run(plan, "push")
        return {name: got[0] for name, got in kept.items()}

    @staticmethod
    def _px(t: Table) -> tuple[Any, ...]:
        return ("PX", t.ttl.ttl_ms) if t.ttl is not None else ()

    # -- delete / inspect / stats ---------------------------------------------------------------

    def delete(self, table: str, ids: np.ndarray) -> int:
        self._ready()
        ids = self.table(table).check_ids(ids)
        with self._naming_wrong_type({table: ids}):
            return self._delete(table, ids)

    def _delete(self, table: str, ids: np.ndarray) -> int:
        layout = self.layouts[table]
        deleted = [0]
        plan = Plan()
        for g in self.groups(table, ids):
            for pos in chunks(g.pos, self.chunk):
                bucket = np.full(len(pos), g.bucket)
                plan.add(g.shard, ("DEL", *layout.row_keys(ids[pos], bucket)), adder(deleted))
                plan.add(g.shard, ("DEL", *layout.counter_keys(ids[pos], bucket)))
        self._runner.run(plan, "delete")
        return deleted[0]

    def raw_values(self, table: str, ids: np.ndarray) -> list[bytes | None]:
        """Stored values as bytes (for ``kelp store inspect``); never counts or admits."""
        self._ready()
        ids = self.table(table).check_ids(ids)
        values: list[bytes | None] = [None] * len(ids)
        plan = Plan()
        for g in self.groups(table, ids):
            keys = self.layouts[table].row_keys(ids[g.pos], np.full(len(g.pos), g.bucket))
            plan.add(g.shard, ("MGET", *keys), scatter(values, g.pos))
        self._runner.run(plan, "inspect", readonly=True)
        return values

    def stats(self) -> StoreStats:
        shards = [self._shard_info(i) for i in range(len(self.shard_names))]
        return StoreStats(
            backend=self.backend,
            rows=dict.fromkeys(self.tables),
            bytes=sum(int(s.get("used_memory") or 0) for s in shards),
            counters=self.metrics.totals(),
            shards=shards,
        )

    def count_keys(self) -> dict[str, dict[str, int]]:
        """Per table, this deployment's stored rows and admission counters, by SCAN over every shard.

        Exact but O(keys in the database): for ``kelp store stats``, not a hot path.
        """
        out = {}
        for name, layout in self.layouts.items():
            out[name] = {
                "rows": self._scan_count(layout.pattern),
                "counters": self._scan_count(layout.counter_pattern),
            }
        return out

    @abc.abstractmethod
    def _scan_count(self, pattern: str) -> int:
        """Keys matching ``pattern`` over every shard (primaries)."""

    # -- listing and loading rows exactly -------------------------------------------------------

    def row_scan_parts(self) -> int:
        self._ready()
        return len(self._scan_nodes())

    def scan_rows(
        self, table: str, part: int, *, batch: int = 4096, updated_since_s: int | None = None
    ) -> Iterator[stored_rows.StoredRows]:
        t = self._check_scan(table, part, batch, updated_since_s)
        return self._scan_part(t, self._scan_nodes()[part], batch, updated_since_s)

    def _scan_part(
        self, t: Table, node: Node, batch: int, updated_since_s: int | None
    ) -> Iterator[stored_rows.StoredRows]:
        """One node's rows of ``t``: ``SCAN`` the row keys, ``MGET`` a batch of them per round trip.

        No TTL rule of its own: Redis expires a row key itself (``PX``), and ``SCAN``
        and ``MGET`` never return an expired one, as a pull never does."""
        layout = self.layouts[t.name]
        skipped = Skipped(t.name, node[0])
        try:
            for keys in batched(scan_pages(node, layout.pattern, batch, self.retry), batch):
                kept, _ = ids_of(keys, layout.key_width, skipped)
                groups = self._slot_groups(kept)
                flat = [k for g in groups for k in g]
                _, ids = ids_of(flat, layout.key_width, skipped)
                values = self._mget(node, groups)
                decoded = t.codec.decode(values)
                block = live_rows(t, ids, decoded, skipped, updated_since_s=updated_since_s)
                if len(block):
                    yield block
        finally:
            skipped.log()

    def _mget(self, node: Node, groups: list[list[bytes]]) -> list[bytes | None]:
        """The values of ``groups`` of keys, in order, in one pipelined round trip."""
        where, client = node

        def fetch() -> list[bytes | None]:
            pipe = client.pipeline(transaction=False)
            for group in groups:
                for i in range(0, len(group), self.chunk):
                    pipe.mget(group[i : i + self.chunk])
            return list(chain.from_iterable(pipe.execute()))

        return round_trip(self.retry, where, fetch)

    def load_rows(self, table: str, rows: stored_rows.StoredRows) -> int:
        t = self.table(table)
        block = t.check_stored(rows)
        self._ready()
        return sum(self._load(t, piece) for piece in pieces(block, LOAD_ROWS_PER_CALL))

    def _load(self, t: Table, block: stored_rows.StoredRows) -> int:
        """Write one piece: ``MSET`` per shard (bucket), or with a TTL one ``SET ... PXAT`` per row
        at the expiry its ``updated_s`` gives, so a loaded row expires when the original would."""
        layout = self.layouts[t.name]
        expire_ms = None
        if t.ttl is not None:
            ttl_ms = t.ttl.ttl_ms
            live = block.updated_s.astype(np.int64) * 1000 + ttl_ms > int(self._clock() * 1000)
            block = block.part(np.flatnonzero(live))
            expire_ms = block.updated_s.astype(np.int64) * 1000 + ttl_ms
        plan = Plan()
        if expire_ms is None and self._packs_commands():
            packed = t.codec.pack(block.rows, block.state, block.access_count, block.updated_s)
            values = packed.view(f"V{t.codec.nbytes}")
            for shard, pos, lengths, bucket in self._runs(t.name, block.ids):
                keys = layout.row_key_array(block.ids[pos], bucket)
                plan.add_packed(shard, pack_runs(("MSET",), lengths, keys, values[pos]), len(lengths))
        else:
            encoded = t.codec.encode(block.rows, block.state, block.access_count, block.updated_s)
            for g in self.groups(t.name, block.ids):
                for pos in chunks(g.pos, self.chunk):
                    keys = layout.row_keys(block.ids[pos], np.full(len(pos), g.bucket))
                    vals = [encoded[i] for i in pos.tolist()]
                    if expire_ms is None:
                        plan.add(g.shard, ("MSET", *chain.from_iterable(zip(keys, vals, strict=True))))
                        continue
                    for key, value, at in zip(keys, vals, expire_ms[pos].tolist(), strict=True):
                        plan.add(g.shard, ("SET", key, value, "PXAT", at))
        self._runner.run(plan, "push")
        self.metrics.sent.inc(len(block) * (t.codec.nbytes + layout.key_width), t.name)
        return len(block)

    def drop_rows(self, table: str) -> int:
        self.table(table)
        self._ready()
        layout = self.layouts[table]
        dropped = 0
        for node in self._scan_nodes():
            dropped += self._unlink(node, layout.pattern)
            self._unlink(node, layout.counter_pattern)
        return dropped

    def _unlink(self, node: Node, pattern: str) -> int:
        return unlink_matching(
            node, pattern, self.retry, self._slot_groups, count=_DROP_SCAN_COUNT, chunk=self.chunk
        )

    def _slot_groups(self, keys: list[bytes]) -> list[list[bytes]]:
        """Keys a multi-key command may carry together: every key of a standalone shard."""
        return [keys] if keys else []

    def close(self) -> None:
        self._runner.close()
        self._close_clients()

    # -- what a topology implements -------------------------------------------------------------

    def _runs(self, table: str, ids: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """Per shard: ``(shard, pos, lengths, bucket)``, the positions of its ids in command order, the
        rows of each command (one bucket each, at most ``max_rows_per_command``) and each row's bucket."""
        return _runs_by_shard(self.groups(table, ids), self.chunk)

    def _packs_commands(self) -> bool:
        """Whether this call's pipelines take packed commands (:attr:`packs_commands`, unless a topology
        falls back to a pipeline that does not for one call)."""
        return self.packs_commands

    @staticmethod
    def _cluster_buckets(cfg: StoreConfig) -> int | None:
        """Hash-tag buckets per table (Redis Cluster), or None (standalone keys)."""
        return None

    @abc.abstractmethod
    def _connect(self, cfg: StoreConfig, options: dict[str, Any]) -> list[str]:
        """Open the clients with ``options`` (from ``connection_options``); returns the shard names."""

    @abc.abstractmethod
    def groups(self, table: str, ids: np.ndarray) -> list[Group]:
        """Split a table's uint64 ids into groups, one shard (and bucket) each.

        Public because it is the routing contract: ``kelp bench store`` builds its
        raw MGET/MSET baseline on exactly these keys and shards.
        """

    @abc.abstractmethod
    def _scan_nodes(self) -> list[Node]:
        """The parts of a full scan, in a stable order: every shard's primary (name, client)."""

    @abc.abstractmethod
    def _pipeline(self, shard: int, readonly: bool) -> Any:
        """A fresh non-transactional pipeline to ``shard`` (``readonly``: a replica may serve it)."""

    @abc.abstractmethod
    def _shard_info(self, shard: int) -> dict[str, Any]:
        """Memory and key counts of one shard for :meth:`stats`."""

    @abc.abstractmethod
    def _close_clients(self) -> None:
        """Close every client :meth:`_connect` opened."""
