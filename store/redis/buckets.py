"""``store.layout.kind: buckets``: rows as fields of listpack-encoded hashes, little more than the value.

With one key per row (:mod:`kelp.store.redis.shared`), Redis spends more memory
of its own per row than the 80-byte dim-16 value itself (the key's dict entry,
key string, value object), and more again when the key has a TTL (the expires
table). Here each table's rows are spread over ``buckets`` hashes
(:class:`~kelp.store.redis.keys.BucketLayout`), and a small hash is
stored as one *listpack* (field and value back to back): the per-row cost is the
value plus a few bytes, with or without a TTL (docs/store.md and
docs/performance.md have the measurements).

What changes against the key layout, and how each rule is kept:

* **reads**: one ``HGET`` per row (a hash has no multi-key read), packed by numpy
  into one write per shard (:mod:`kelp.store.redis._wire.packing`), so the client does no
  per-row Python work; the replies of all tables of one row width come back as
  one run, parsed by numpy off the socket (:mod:`kelp.store.redis._wire.row_replies`). Redis
  spends more CPU per row than on ``MGET``.
* **pushes**: one ``HSET`` per row, packed the same way; where rows share
  buckets (a hot tier's flush) one ``HSET`` per bucket, which cuts Redis's
  CPU per row; pushes that must not create rows (admission) and admissions
  that must not overwrite a live row run
  :data:`~kelp.store.redis.bucket_scripts.SET_ROWS_IF`.
* **TTL**: a row whose update time is older than the table's TTL reads as
  absent at once; :class:`BucketSweeper` deletes such rows, a few buckets per
  push, so every bucket is swept once per ``layout.sweep_period_s``.
* **routing**: whole buckets go to shards (rendezvous hashing on the bucket).
* **server settings**: a listpack holds values up to ``hash-max-listpack-value``
  bytes (default 64, a dim-16 row is 80) and ``hash-max-listpack-entries``
  fields; above either the hash becomes a hashtable (still correct, but with
  Redis's per-entry overhead back on every row). The store raises them on
  connect (``layout.configure_server``) or logs the redis.conf lines.
* ``store.sparse_updates: compose`` and Redis Cluster keep the key layout (refused at load).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import StoreConfig, TableSpec
from kelp.store.base import Table
from kelp.store.flow import InitRows, RowWrite, StoredBlock, StoredRows
from kelp.store.redis._wire.packed_pipeline import PackedPipeline
from kelp.store.redis._wire.packing import pack_commands, pack_grouped
from kelp.store.redis._wire.row_replies import RowReplies
from kelp.store.redis.bucket_scripts import set_rows_if_args, sweep_args
from kelp.store.redis.connection import translate_redis_errors
from kelp.store.redis.keys import BucketLayout, quote_key
from kelp.store.redis.plan import Gathered, Plan, adder, chunks, scatter, split_replies
from kelp.store.redis.row_scan import (
    ID_BYTES,
    Node,
    Skipped,
    ids_of,
    live_rows,
    round_trip,
    scan_pages,
)
from kelp.store.redis.shared import TypedKeys
from kelp.store.redis.standalone import RedisStore
from kelp.store.rows import stored as stored_rows
from kelp.store.rows.hashing import rendezvous, splitmix64

__all__ = ["BucketSweeper", "RedisBucketStore"]

log = logging.getLogger("kelp.store.redis_buckets")  # the name users filter on, kept across moves

_LISTPACK_ENTRIES = 512  # fields per bucket before Redis converts it to a hashtable
_SWEEP_KEYS_PER_CALL = 64
_GROUP_AT_ROWS_PER_BUCKET = 1.0  # rows per bucket from which a write groups them (~37% fewer commands)


def _joined(writes: list[RowWrite]) -> tuple[np.ndarray, np.ndarray]:
    """Several tables' rows and state, one array each: no copy for one table, nor for tables whose
    rows are consecutive slices of one array (a hot-tier write-back hands each table a slice of the
    rows it read once per width), which are packed where they lie."""
    return _spanned([w.rows for w in writes]), _spanned([w.state for w in writes])


def _spanned(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` end to end: a view over them where they already lie so in one array, else a copy."""
    if len(parts) == 1:
        return parts[0]
    filled = [part for part in parts if len(part)]  # an empty slice's address says nothing
    if len(filled) < 2:
        return filled[0] if filled else np.concatenate(parts)
    parts = filled
    rows = sum(len(part) for part in parts)
    first = parts[0]
    base = first.base
    at = first.__array_interface__["data"][0]
    for part in parts:
        consecutive = (
            base is not None
            and part.base is base
            and part.flags.c_contiguous
            and part.dtype == first.dtype
            and part.shape[1:] == first.shape[1:]
            and part.__array_interface__["data"][0] == at
        )
        if not consecutive:
            return np.concatenate(parts)
        at += part.nbytes
    # Every part is a slice of ``base`` and each starts where the one before ends, so the span
    # lies inside ``base``'s memory: a read-only view over it reads nothing outside.
    return np.lib.stride_tricks.as_strided(first, (rows, *first.shape[1:]), first.strides, writeable=False)


def _unlink_hashes(client: Any, keys: list[bytes]) -> int:
    """``UNLINK`` bucket hashes in one round trip; returns the rows (fields) they held."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hlen(key)
        pipe.unlink(key)
    replies = pipe.execute()
    return sum(int(rows) for rows, gone in zip(replies[0::2], replies[1::2], strict=True) if gone)


class BucketSweeper:
    """Which buckets of one TTL table to sweep now: all ``buckets`` once per ``period_s``, spread evenly.

    >>> t = [0.0]
    >>> s = BucketSweeper(buckets=100, period_s=10.0, clock=lambda: t[0])
    >>> t[0] = 1.0; s.due().tolist()[:3], len(s.due())
    ([0, 1, 2], 0)
    """

    def __init__(self, buckets: int, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.buckets = buckets
        self.period_s = period_s
        self._clock = clock
        self._last = clock()
        self._owed = 0.0
        self._cursor = 0

    def due(self) -> np.ndarray:
        """int64 buckets to sweep now (possibly none); the cursor wraps around the table."""
        now = self._clock()
        self._owed = min(float(self.buckets), self._owed + (now - self._last) / self.period_s * self.buckets)
        self._last = now
        n = int(self._owed)
        self._owed -= n
        out = (self._cursor + np.arange(n, dtype=np.int64)) % self.buckets
        self._cursor = (self._cursor + n) % self.buckets
        return out


@dataclass(frozen=True)
class _FuseGroup:
    """Tables fused into one run (same bucket-key width and row format) and their constants."""

    names: list[str]
    key_dtype: np.dtype
    seeds: np.ndarray  # uint64 per table: the bucket hash seed
    counts: np.ndarray  # uint64 per table: buckets
    prefixes: np.ndarray  # S<n> per table: the bucket keys' prefix
    table_seeds: np.ndarray  # uint64 per table: the shard hash seed


@dataclass
class _Fused:
    """Ids of tables that share a bucket-key width and a row format, concatenated in table order."""

    names: list[str]
    bounds: np.ndarray  # table i holds positions bounds[i]:bounds[i + 1]
    ids: np.ndarray  # uint64[n]
    keys: np.ndarray  # V<key width>[n]: each id's bucket key
    bucket: np.ndarray  # int64[n]: table index << 32 | bucket, one value per bucket key
    fields: np.ndarray  # V8[n]
    shard: np.ndarray  # int64[n]

    def per_shard(self) -> list[tuple[int, np.ndarray]]:
        if not len(self.shard):
            return []
        if not self.shard.any():
            return [(0, np.arange(len(self.shard)))]
        order = np.argsort(self.shard, kind="stable")
        cuts = np.flatnonzero(np.diff(self.shard[order])) + 1
        return [(int(self.shard[part[0]]), part) for part in np.split(order, cuts)]


class RedisBucketStore(RedisStore):
    """``backend: redis`` with ``layout.kind: buckets`` (see the module docstring)."""

    backend = "redis"
    composes_updates = False

    def __init__(
        self,
        cfg: StoreConfig,
        tables: list[TableSpec],
        deployment: str = "kelp",
        registry: CollectorRegistry | None = None,
        **kwargs: Any,
    ) -> None:
        self.buckets = {
            t.name: BucketLayout(deployment, t.name, cfg.layout.buckets_for(t.name)) for t in tables
        }
        super().__init__(cfg, tables, deployment, registry, **kwargs)
        self._sweepers = {
            name: BucketSweeper(self.buckets[name].buckets, cfg.layout.sweep_period_s, self._clock)
            for name, t in self.tables.items()
            if t.ttl is not None
        }
        self._configure_server = cfg.layout.configure_server
        self._fuse_cache: dict[tuple[str, ...], list[_FuseGroup]] = {}

    def _first_contact(self) -> None:
        super()._first_contact()
        if self.writer:  # listpack limits shape how rows are written; a reader need not touch them
            self._check_listpack_limits(self._configure_server)

    def _layout_description(self) -> dict[str, Any]:
        return {"kind": "buckets", "buckets": {name: b.buckets for name, b in self.buckets.items()}}

    def _foreign_patterns(self) -> list[str]:
        """SCAN patterns of this deployment's rows in the ``keys`` layout."""
        return [layout.pattern for layout in self.layouts.values()]

    # -- routing --------------------------------------------------------------------------------

    def shard_of(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Whole buckets live on one shard: rendezvous hashing on the bucket, not the id."""
        return self._shard_of_buckets(table, self.buckets[table].bucket_of(np.asarray(ids, np.uint64)))

    def _shard_of_buckets(self, table: str, buckets: np.ndarray) -> np.ndarray:
        return rendezvous(buckets.astype(np.uint64) ^ self._table_seeds[table], self._seeds)

    def _fuse(self, arrays: Mapping[str, np.ndarray]) -> list[_Fused]:
        """The ids of ``arrays``' tables, fused per (bucket-key width, row format): one packed run of
        commands per shard for all of them (a serving request reads ~50 rows from each of 26 tables;
        26 runs cost more in numpy's per-call overhead than the rows do)."""
        out = []
        for group in self._fuse_groups(tuple(arrays)):
            names = group.names
            parts = [np.asarray(arrays[n], dtype=np.uint64) for n in names]
            lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            table = np.repeat(np.arange(len(names)), lengths)
            ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
            bucket = (splitmix64(ids ^ group.seeds[table]) % group.counts[table]).astype(np.int64)
            keys = np.empty(len(ids), dtype=group.key_dtype)
            keys["p"] = group.prefixes[table]
            keys["b"] = bucket
            shard = rendezvous(bucket.astype(np.uint64) ^ group.table_seeds[table], self._seeds)
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            out.append(
                _Fused(
                    names,
                    bounds,
                    ids,
                    keys.view(f"V{group.key_dtype.itemsize}"),
                    (table.astype(np.int64) << 32) | bucket,
                    BucketLayout.fields(ids),
                    shard,
                )
            )
        return out

    def _fuse_groups(self, names: tuple[str, ...]) -> list[_FuseGroup]:
        """``names`` grouped per (bucket-key width, row format), with each group's per-table constants
        as arrays; worked out once per set of tables asked together (a replica asks the same one)."""
        groups = self._fuse_cache.get(names)
        if groups is not None:
            return groups
        by_kind: dict[tuple[int, int, str], list[str]] = {}
        for name in names:
            codec = self.tables[name].codec
            by_kind.setdefault((self.buckets[name].key_width, codec.dim, codec.dtype), []).append(name)
        groups = []
        for members in by_kind.values():
            layouts = [self.buckets[n] for n in members]
            groups.append(
                _FuseGroup(
                    members,
                    layouts[0].key_dtype,
                    np.array([lay.seed for lay in layouts], dtype=np.uint64),
                    np.array([lay.buckets for lay in layouts], dtype=np.uint64),
                    np.array([lay.prefix for lay in layouts]),
                    np.array([self._table_seeds[n] for n in members], dtype=np.uint64),
                )
            )
        if len(self._fuse_cache) < 256:  # the sets a process asks are few; never grows without bound
            self._fuse_cache[names] = groups
        return groups

    def _per_row(
        self, fused: _Fused, command: str, *values: np.ndarray
    ) -> list[tuple[int, np.ndarray, bytes]]:
        """(shard, positions, payload) per shard: one ``command bucket-key field [value]`` per id."""
        out = []
        for shard, pos in fused.per_shard():
            some = len(pos) < len(fused.shard)  # one shard: all rows in order, no positions
            payload = pack_commands((command,), fused.keys, fused.fields, *values, rows=pos if some else None)
            out.append((shard, pos, payload))
        return out

    # -- the flow's primitives ------------------------------------------------------------------

    def _read_rows(
        self, ids_by_table: Mapping[str, np.ndarray], now: float, touch: bool
    ) -> dict[str, StoredRows]:
        stored: dict[str, StoredRows] = {}
        for block in self._read_blocks(ids_by_table, now, touch=touch):
            for i, name in enumerate(block.names):
                stored[name] = block.stored.part(block.bounds[i], block.bounds[i + 1])
        return stored

    def _read_blocks(
        self, ids_by_table: Mapping[str, np.ndarray], now: float, *, touch: bool = False
    ) -> list[StoredBlock]:
        """Every table's rows in one run per shard and row width, decoded once per fused group (in id
        order within it), bytes counted and expired rows hidden: no split per table."""
        reads = []
        runs: dict[tuple[int, int], list[tuple[bytes, int, Callable[[Any], None]]]] = {}
        for fused in self._fuse(ids_by_table):
            gathered = Gathered()
            reads.append((fused, gathered))
            width = self.tables[fused.names[0]].codec.nbytes
            for shard, pos, payload in self._per_row(fused, "HGET"):
                runs.setdefault((shard, width), []).append((payload, len(pos), gathered.add(pos)))
        plan = Plan()
        for (shard, width), parts in runs.items():  # one run per shard and row width, parsed as rows
            counts = [(n, on_reply) for _, n, on_reply in parts]
            payload = [p for p, _, _ in parts]
            plan.add_packed(shard, payload, sum(n for n, _ in counts), split_replies(counts), width)
        self._runner.run(plan, "pull", readonly=not touch)
        blocks = []
        for fused, gathered in reads:
            codec = self.tables[fused.names[0]].codec  # every table of a fused group shares the row format
            values = gathered.values()
            if isinstance(values, RowReplies):
                decoded = codec.decode_present(values.present, values.values).in_order(gathered.order)
            else:
                decoded = codec.decode(values).in_order(gathered.order)
            rows = StoredRows(
                decoded.present, decoded.rows, decoded.state, decoded.updated_s, fault=decoded.fault
            )
            block = StoredBlock(fused.names, fused.bounds.tolist(), fused.ids, rows)
            for name, present in zip(fused.names, block.counts(decoded.present), strict=True):
                self.metrics.received.inc(present * codec.nbytes, name)
            self._hide_expired(block, now)
            blocks.append(block)
        return blocks

    def _hide_expired(self, block: StoredBlock, now: float) -> None:
        """Rows past their table's TTL read as absent (the sweep deletes them later): one comparison
        against each row's table cutoff. A value that is no valid row has no stamp to trust: it stays,
        to be quarantined (and overwritten) by the flow."""
        tables = [self.tables[n] for n in block.names]
        if all(t.ttl is None for t in tables):
            return
        lengths = np.diff(block.bounds)
        cutoff = np.repeat(np.array([self._cutoff(t, now) for t in tables], dtype=np.int64), lengths)
        rows = block.stored
        expired = rows.present & (rows.updated_s.astype(np.int64) < cutoff)
        if rows.fault is not None:
            expired &= rows.fault == 0
        if expired.any():
            rows.present[expired] = False
            rows.updated_s[expired] = 0

    @staticmethod
    def _cutoff(t: Table, now: float) -> int:
        """A row of ``t`` stamped before this unix second is expired (0: the table has no TTL).

        Stamps are whole seconds rounded down, so a row written at ``w`` is stamped
        in ``(w - 1, w]``; ``floor(now - ttl)`` expires it between ``ttl`` and
        ``ttl + 1`` seconds after ``w``: never early, at most a second late.
        """
        return max(1, int(np.floor(now - t.ttl.ttl_s))) if t.ttl is not None else 0

    def _store_init_rows(self, admits: Mapping[str, InitRows], now: float) -> None:
        """Admitted ids' init rows where no live row is stored (``nx``); DEL the sighting counters."""
        plan = Plan()
        for name, a in admits.items():
            t = self.tables[name]
            values = t.codec.encode(a.rows, a.state, 0, int(now))
            self._conditional(plan, name, a.ids, values, only_live=False, cutoff=self._cutoff(t, now))
            if a.drop_counters:
                layout = self.layouts[name]
                for g in self.groups(name, a.ids):
                    for pos in chunks(g.pos, self.chunk):
                        plan.add(g.shard, ("DEL", *layout.counter_keys(a.ids[pos])))
        self._runner.run(plan, "admit")

    def _conditional(
        self,
        plan: Plan,
        name: str,
        ids: np.ndarray,
        values: list[bytes],
        *,
        only_live: bool,
        cutoff: int,
        on_reply: Callable[[Any], None] | None = None,
    ) -> None:
        (fused,) = self._fuse({name: ids})
        for shard, pos in fused.per_shard():
            for part in chunks(pos, self.chunk):
                rows = [values[i] for i in part.tolist()]
                keys, fields = fused.keys[part].tolist(), fused.fields[part].tolist()
                plan.add(shard, set_rows_if_args(keys, fields, rows, only_live, cutoff), on_reply)

    def _write_rows(self, writes: Mapping[str, RowWrite], now: float) -> dict[str, int]:
        """``HSET`` per row, packed; ``create=False`` (admission) only over live rows, by script.
        Due TTL sweeps ride in the same round trip."""
        plan = Plan()
        kept: dict[str, list[int]] = {}
        plain: dict[str, np.ndarray] = {}
        for name, w in writes.items():
            t = self.tables[name]
            got = kept[name] = [0]
            self.metrics.sent.inc(len(w.ids) * (t.codec.nbytes + 8), name)
            if not w.create:
                values = t.codec.encode(w.rows, w.state, 0, int(now))
                cutoff = self._cutoff(t, now)
                on_reply = adder(got)
                self._conditional(plan, name, w.ids, values, only_live=True, cutoff=cutoff, on_reply=on_reply)
                continue
            plain[name] = w.ids
            got[0] = len(w.ids)
        for fused in self._fuse(plain):
            codec = self.tables[fused.names[0]].codec
            # One pack of the group's rows joined, not one per table: a write-back writes ~26
            # tables, and each pack is a round of column assignments whatever its size.
            rows, state = _joined([writes[n] for n in fused.names])
            packed = codec.pack(rows, state, 0, int(now)).view(f"V{codec.nbytes}")
            self._plan_hsets(plan, fused, packed)
        swept = self._plan_sweeps(plan, now)
        self._runner.run(plan, "push")
        for name, n in swept.items():
            if n[0]:
                self.metrics.evictions.labels(table=name, reason="ttl").inc(n[0])
        return {name: got[0] for name, got in kept.items()}

    def _plan_hsets(self, plan: Plan, fused: _Fused, packed: np.ndarray) -> None:
        """One ``HSET`` per row of ``fused`` (``packed``: its encoded values, in order), or one per
        bucket where rows share buckets, packed per shard."""
        group = self._rows_share_buckets(fused)
        for shard, pos in fused.per_shard():
            some = len(pos) < len(fused.shard)  # one shard: all rows in order, no positions
            if group:
                mine = pos if some else slice(None)
                keys, fields, values = fused.keys[mine], fused.fields[mine], packed[mine]
                grouped = pack_grouped(("HSET",), fused.bucket[mine], keys, fields, values)
                plan.add_packed(shard, grouped, grouped.count, integers=True)
            else:
                payload = pack_commands(
                    ("HSET",), fused.keys, fused.fields, packed, rows=pos if some else None
                )
                plan.add_packed(shard, payload, len(pos), integers=True)

    def _rows_share_buckets(self, fused: _Fused) -> bool:
        """Whether writing ``fused`` one command per bucket saves enough commands to pay for grouping.

        Grouping costs the client more than packing one command per row (a sort and
        more gathers); it pays where rows outnumber buckets, as in a hot tier's flush
        (several rows per bucket cut Redis's CPU per row), not in a step's write-through
        push (~0.3 rows per bucket, ~14% fewer commands; docs/performance.md)."""
        buckets = sum(self.buckets[name].buckets for name in fused.names)
        return len(fused.keys) >= _GROUP_AT_ROWS_PER_BUCKET * buckets

    def _plan_sweeps(self, plan: Plan, now: float) -> dict[str, list[int]]:
        """Add the due TTL sweeps (:class:`BucketSweeper`) to ``plan``; their removed counts land here."""
        removed: dict[str, list[int]] = {}
        for name, sweeper in self._sweepers.items():
            due = sweeper.due()
            if not len(due):
                continue
            got = removed[name] = [0]
            keys = self.buckets[name].bucket_keys(due)
            shard = self._shard_of_buckets(name, due)
            cutoff = self._cutoff(self.tables[name], now)
            for s in np.unique(shard).tolist():
                mine = keys[shard == s].tolist()
                for i in range(0, len(mine), _SWEEP_KEYS_PER_CALL):
                    plan.add(s, sweep_args(mine[i : i + _SWEEP_KEYS_PER_CALL], cutoff), adder(got))
        return removed

    # -- where rows live: quarantine log lines and WRONGTYPE errors --------------------------------

    def _where(self, table: str, ids: np.ndarray) -> list[str]:
        """Each id's bucket key and field (as redis-cli reads them) and its shard."""
        layout = self.buckets[table]
        keys = layout.bucket_keys(layout.bucket_of(ids)).tolist()
        fields = BucketLayout.fields(ids).tolist()
        shards = self.shard_of(table, ids).tolist()
        return [
            f"key {quote_key(k)} field {quote_key(f)} on {self.shard_names[s]}"
            for k, f, s in zip(keys, fields, shards, strict=True)
        ]

    def _typed_keys(self, table: str, ids: np.ndarray) -> Iterator[TypedKeys]:
        """Each bucket the ids fall in (once) must be a hash; their admission counters, strings."""
        layout = self.buckets[table]
        buckets = np.unique(layout.bucket_of(ids))
        shard = self._shard_of_buckets(table, buckets)
        keys = layout.bucket_keys(buckets)
        for s in np.unique(shard).tolist():
            yield s, keys[shard == s].tolist(), "hash", "bucket"
        for g in self.groups(table, ids):
            yield g.shard, self.layouts[table].counter_keys(ids[g.pos]), "string", "admission counter"

    # -- delete / inspect / stats ---------------------------------------------------------------

    def _delete(self, table: str, ids: np.ndarray) -> int:
        deleted = [0]
        plan = Plan()

        def count(replies: list[Any]) -> None:
            deleted[0] += sum(int(r) for r in replies)

        (fused,) = self._fuse({table: ids})
        for shard, pos, payload in self._per_row(fused, "HDEL"):
            plan.add_packed(shard, payload, len(pos), count)
            for part in chunks(pos, self.chunk):
                plan.add(shard, ("DEL", *self.layouts[table].counter_keys(ids[part])))
        self._runner.run(plan, "delete")
        return deleted[0]

    def raw_values(self, table: str, ids: np.ndarray) -> list[bytes | None]:
        """Stored values as bytes (for ``kelp store inspect``); never counts or admits."""
        self._ready()
        ids = self.table(table).check_ids(ids)
        values: list[bytes | None] = [None] * len(ids)
        plan = Plan()
        (fused,) = self._fuse({table: ids})
        for shard, pos, payload in self._per_row(fused, "HGET"):
            plan.add_packed(shard, payload, len(pos), scatter(values, pos))
        with self._naming_wrong_type({table: ids}):
            self._runner.run(plan, "inspect", readonly=True)
        return values

    def count_keys(self) -> dict[str, dict[str, int]]:
        """Per table, stored rows (``HLEN`` of every bucket found by SCAN) and admission counters."""
        out = {}
        for name, layout in self.buckets.items():
            rows = 0
            for shard_name, client in zip(self.shard_names, self._clients, strict=True):
                with translate_redis_errors(shard_name):
                    pipe = client.pipeline(transaction=False)
                    for key in client.scan_iter(match=layout.pattern, count=1000):
                        pipe.hlen(key)
                    rows += sum(pipe.execute())
            out[name] = {"rows": rows, "counters": self._scan_count(self.layouts[name].counter_pattern)}
        return out

    # -- listing and loading rows exactly -------------------------------------------------------

    def _scan_part(
        self, t: Table, node: Node, batch: int, updated_since_s: int | None
    ) -> Iterator[stored_rows.StoredRows]:
        """One shard's rows of ``t``: ``SCAN`` its bucket hashes, ``HGETALL`` about a batch of rows'
        buckets per round trip, rows past the TTL hidden by the rule a pull applies (:meth:`_cutoff`)."""
        skipped = Skipped(t.name, node[0])
        fields: list[bytes] = []
        values: list[bytes] = []
        try:
            for replies in self._bucket_trips(t, node, batch, skipped):
                for reply in replies:
                    if isinstance(reply, dict):  # a RESP3 connection answers a map
                        fields.extend(reply)
                        values.extend(reply.values())
                    else:
                        fields.extend(reply[0::2])
                        values.extend(reply[1::2])
                if len(fields) >= batch:
                    yield self._bucket_rows(t, fields, values, skipped, updated_since_s)
                    fields, values = [], []
            if fields:
                yield self._bucket_rows(t, fields, values, skipped, updated_since_s)
        finally:
            skipped.log()

    def _bucket_trips(self, t: Table, node: Node, batch: int, skipped: Skipped) -> Iterator[list[Any]]:
        """The table's bucket hashes on ``node``, read a round trip at a time: as many buckets as hold
        about ``batch`` rows by the buckets read so far (a first guess of full listpacks), so a trip
        neither carries a few rows nor the whole table.

        No ``SCAN``: a table's bucket keys are known (its bucket numbers on this shard), and a
        ``SCAN ... MATCH`` walks every key of the database once per table, every other table's too."""
        layout = self.buckets[t.name]
        everything = np.arange(layout.buckets, dtype=np.int64)
        shard = self._scan_nodes().index(node)
        keys = layout.bucket_keys(everything[self._shard_of_buckets(t.name, everything) == shard])
        trip = max(1, batch // _LISTPACK_ENTRIES)
        start = buckets_read = rows_read = 0
        while start < len(keys):
            chunk = keys[start : start + trip]
            start += len(chunk)
            replies = self._hgetall(node, chunk)
            yield replies
            buckets_read += len(chunk)
            rows_read += sum(len(r) if isinstance(r, dict) else len(r) // 2 for r in replies)
            trip = max(1, min(batch, batch * buckets_read // max(1, rows_read)))

    def _hgetall(self, node: Node, keys: np.ndarray) -> list[Any]:
        """Every bucket's ``[field, value, field, value, ...]`` (a map on RESP3), for bucket ``keys``
        (one fixed-width void array).

        The ``HGETALL`` commands are packed by numpy and their replies read off the socket in one
        pass: a scan reads tens of thousands of buckets, and redis-py's per-command packing and reply
        handling were most of its time."""
        where, client = node
        if not len(keys):
            return []
        payload = pack_commands(("HGETALL",), keys)

        def fetch() -> list[Any]:
            pipe = PackedPipeline(client)
            pipe.add_packed(payload, len(keys))
            return pipe.execute()[0]

        return round_trip(self.retry, where, fetch)

    def _bucket_rows(
        self,
        t: Table,
        fields: list[bytes],
        values: list[bytes],
        skipped: Skipped,
        updated_since_s: int | None,
    ) -> stored_rows.StoredRows:
        if any(len(f) != ID_BYTES for f in fields):  # a field another client added: no row id
            pairs = [(f, v) for f, v in zip(fields, values, strict=True) if len(f) == ID_BYTES]
            skipped.add("bad_key", len(fields) - len(pairs))
            fields, values = [f for f, _ in pairs], [v for _, v in pairs]
        _, ids = ids_of(fields, ID_BYTES, skipped)
        decoded = t.codec.decode(values)  # type: ignore[arg-type]
        cutoff = self._cutoff(t, self._clock())
        return live_rows(t, ids, decoded, skipped, cutoff=cutoff, updated_since_s=updated_since_s)

    def _load(self, t: Table, block: stored_rows.StoredRows) -> int:
        """``HSET`` into the rows' bucket hashes, packed per shard; rows a pull would already hide as
        past the TTL are not written."""
        if t.ttl is not None:
            cutoff = self._cutoff(t, self._clock())
            block = block.part(np.flatnonzero(block.updated_s.astype(np.int64) >= cutoff))
        packed = t.codec.pack(block.rows, block.state, block.access_count, block.updated_s)
        plan = Plan()
        (fused,) = self._fuse({t.name: block.ids})
        self._plan_hsets(plan, fused, packed.view(f"V{t.codec.nbytes}"))
        self._runner.run(plan, "push")
        self.metrics.sent.inc(len(block) * (t.codec.nbytes + ID_BYTES), t.name)
        return len(block)

    def drop_rows(self, table: str) -> int:
        self.table(table)
        self._ready()
        layout = self.buckets[table]
        dropped = 0
        for node in self._scan_nodes():
            where, client = node
            for keys in scan_pages(node, layout.pattern, _LISTPACK_ENTRIES, self.retry):
                dropped += round_trip(self.retry, where, lambda keys=keys, c=client: _unlink_hashes(c, keys))
            self._unlink(node, self.layouts[table].counter_pattern)
        return dropped

    # -- server settings ------------------------------------------------------------------------

    def _check_listpack_limits(self, configure: bool) -> None:
        """Make sure a bucket can stay a listpack; else say (once) what to set in redis.conf."""
        need_value = max(t.codec.nbytes for t in self.tables.values())
        wanted = {"hash-max-listpack-value": need_value, "hash-max-listpack-entries": _LISTPACK_ENTRIES}
        for name, client in zip(self.shard_names, self._clients, strict=True):
            try:
                with translate_redis_errors(name):
                    current = {k: int(client.config_get(k).get(k, 0)) for k in wanted}
                    low = {k: v for k, v in wanted.items() if current[k] < v}
                    if low and configure:
                        for k, v in low.items():
                            client.config_set(k, v)
                        log.info("raised %s on %s for the buckets layout", low, name)
                        continue
            except Exception as exc:  # no CONFIG rights (ACL), a renamed CONFIG: say what to set instead
                low = wanted
                log.debug("could not read or set listpack limits on %s: %s", name, exc)
            if low:
                lines = "; ".join(f"{k} {v}" for k, v in low.items())
                log.warning(
                    "store.layout buckets on %s: set %s in redis.conf, or rows cost ~160 bytes, not ~100",
                    name,
                    lines,
                )
