"""The in-process backend (the embedded default): one :class:`~kelp.store.rows.slots.SlotTable` per table.

Each table keeps its rows in contiguous numpy columns (``rows[cap, dim]`` in
the table's storage dtype, ``state``, ``count`` of training reads, ``updated``
unix seconds) behind a vectorized id index; freed slots are reused. Admission
counters live in a second slot table per table (``count``, ``first`` sighting
time), dropped once ``counter_ttl_s`` old.

It enforces both eviction policies (:mod:`kelp.store.policy.eviction`):
:class:`~kelp.store.policy.eviction.TtlEviction` is checked lazily on every access and
by a vectorized sweep when a table runs out of freed slots;
:class:`~kelp.store.policy.eviction.LfuCapacity` evicts the rows with the lowest
access count (pulls with ``count=True``), oldest update first on ties.
Thread-safe (one lock per store); nothing is shared between processes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import TableSpec
from kelp.store.base import StoreStats, Table
from kelp.store.flow import FlowStore, InitRows, RowWrite, StoredRows
from kelp.store.policy.eviction import LfuCapacity, TtlEviction
from kelp.store.rows import stored as stored_rows
from kelp.store.rows.codec import finite_rows
from kelp.store.rows.slots import Column, SlotTable

__all__ = ["MemoryStore"]

log = logging.getLogger("kelp.store.memory")


def _row_table(t: Table) -> SlotTable:
    return SlotTable(
        {
            "rows": Column(np.dtype(t.spec.dtype), width=t.dim),
            "state": Column(np.float32),
            "count": Column(np.uint32),
            "updated": Column(np.float64),
        }
    )


def _counter_table() -> SlotTable:
    return SlotTable({"count": Column(np.uint32), "first": Column(np.float64)}, capacity=64)


def _last_of_each_id(ids: np.ndarray) -> np.ndarray:
    """Positions of ``ids``, the last of a repeated id kept: it wins, as it would in a Redis ``MSET``."""
    _, first_from_end = np.unique(ids[::-1], return_index=True)
    return np.sort(len(ids) - 1 - first_from_end)


class MemoryStore(FlowStore):
    """Embedded store: everything in this process's memory, lost on exit.

    >>> from kelp.config import TableSpec
    >>> store = MemoryStore([TableSpec(name="ads", dim=4)])
    >>> ids = np.array([1, 2], dtype=np.uint64)
    >>> store.push("ads", ids, np.ones((2, 4), np.float32), np.zeros(2, np.float32))  # its ticket
    1
    >>> store.durable_through()  # in memory, every acknowledged push is as durable as it gets
    1
    >>> store.pull("ads", ids).rows.sum()
    np.float32(8.0)
    """

    backend = "memory"
    enforces = frozenset({TtlEviction, LfuCapacity})

    def __init__(
        self,
        tables: list[TableSpec],
        registry: CollectorRegistry | None = None,
        *,
        initial_state: float = 0.0,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        super().__init__(tables, registry, initial_state=initial_state, seed=seed, clock=clock)
        self._op_lock = threading.Lock()
        self._rows = {name: _row_table(t) for name, t in self.tables.items()}
        self._counters = {name: _counter_table() for name in self.tables}

    # -- eviction -------------------------------------------------------------------------------

    def _evicted(self, t: Table, reason: str, n: int) -> None:
        if n:
            self.metrics.evictions.labels(table=t.name, reason=reason).inc(n)

    def _lookup_live(self, t: Table, ids: np.ndarray, now: float) -> np.ndarray:
        """Slots of ids (-1 absent), evicting rows whose TTL passed (lazy expiry)."""
        table = self._rows[t.name]
        slots = table.lookup(ids)
        if t.ttl is not None:
            hit = np.flatnonzero(slots >= 0)
            old = hit[t.ttl.expired(table["updated"][slots[hit]], now)]
            table.remove(slots[old])
            self._evicted(t, "ttl", len(old))
            slots[old] = -1
        return slots

    def _make_room(self, t: Table, k: int, now: float, protect: np.ndarray) -> None:
        """Evict so that ``k`` more rows fit: expired rows first, then LFU under ``max_rows``."""
        table = self._rows[t.name]
        if t.ttl is not None and table.n_free < k:
            live = table.live_slots()
            expired = live[t.ttl.expired(table["updated"][live], now)]
            table.remove(expired)
            self._evicted(t, "ttl", len(expired))
        excess = t.capacity.excess(len(table), k) if t.capacity is not None else 0
        if excess and t.capacity is not None:
            live = table.live_slots()
            victims = t.capacity.victims(live, table["count"][live], table["updated"][live], protect, excess)
            table.remove(victims)
            self._evicted(t, "lfu", len(victims))

    # -- the primitives -------------------------------------------------------------------------

    def _read_rows(
        self, ids_by_table: Mapping[str, np.ndarray], now: float, touch: bool
    ) -> dict[str, StoredRows]:
        out = {}
        for name, ids in ids_by_table.items():
            t, table = self.tables[name], self._rows[name]
            slots = self._lookup_live(t, ids, now)
            present = slots >= 0
            ps = slots[present]
            rows = np.empty((len(ids), t.dim), dtype=np.float32)
            state = np.empty(len(ids), dtype=np.float32)
            updated_s = np.zeros(len(ids), dtype=np.uint32)
            rows[present] = table["rows"][ps]
            state[present] = table["state"][ps]
            updated_s[present] = table["updated"][ps].astype(np.uint32)
            if touch:
                table["count"][ps] += 1
            out[name] = StoredRows(present, rows, state, updated_s, handle=ps)
        return out

    def _count_sightings(
        self, requests: Mapping[str, tuple[np.ndarray, np.ndarray, float]], now: float
    ) -> dict[str, np.ndarray]:
        return {
            name: self._sight(self._counters[name], ids, increments, ttl, now)
            for name, (ids, increments, ttl) in requests.items()
        }

    @staticmethod
    def _sight(
        counters: SlotTable, ids: np.ndarray, increments: np.ndarray, ttl: float, now: float
    ) -> np.ndarray:
        """``increments`` more sightings of each id; a counter first seen ``ttl`` ago starts again."""
        slots = counters.lookup(ids)
        new = slots < 0
        if int(new.sum()) > counters.room:  # would grow: drop expired counters first, then look again
            live = counters.live_slots()
            counters.remove(live[counters["first"][live] < now - ttl])
            slots = counters.lookup(ids)
            new = slots < 0
        if new.any():
            slots[new] = counters.insert(ids[new], count=0, first=now)
        count, first = counters["count"], counters["first"]
        stale = slots[first[slots] < now - ttl]
        count[stale] = 0
        first[stale] = now
        count[slots] += increments.astype(count.dtype)
        return count[slots].astype(np.int64)

    def _store_init_rows(self, admits: Mapping[str, InitRows], now: float) -> None:
        for name, a in admits.items():
            t = self.tables[name]
            self._make_room(t, len(a.ids), now, protect=a.read.handle)
            self._rows[name].insert(a.ids, rows=a.rows, state=a.state, count=1, updated=now)
            if a.drop_counters:
                self._counters[name].remove_ids(a.ids)

    def _write_rows(self, writes: Mapping[str, RowWrite], now: float) -> dict[str, int]:
        kept = {}
        for name, w in writes.items():
            t, table = self.tables[name], self._rows[name]
            slots = self._lookup_live(t, w.ids, now)
            present = slots >= 0
            ps = slots[present]
            table["rows"][ps] = w.rows[present]
            table["state"][ps] = w.state[present]
            table["updated"][ps] = now
            missing = ~present
            if w.create and missing.any():
                self._make_room(t, int(missing.sum()), now, protect=ps)
                table.insert(
                    w.ids[missing], rows=w.rows[missing], state=w.state[missing], count=1, updated=now
                )
                kept[name] = len(w.ids)
            else:
                kept[name] = len(ps)
        return kept

    # -- delete / stats -------------------------------------------------------------------------

    def delete(self, table: str, ids: np.ndarray) -> int:
        ids = self.table(table).check_ids(ids)
        with self._op_lock:
            self._counters[table].remove_ids(ids)
            return self._rows[table].remove_ids(ids)

    # -- listing and loading rows exactly -------------------------------------------------------

    def row_scan_parts(self) -> int:
        return 1

    def scan_rows(
        self, table: str, part: int, *, batch: int = 4096, updated_since_s: int | None = None
    ) -> Iterator[stored_rows.StoredRows]:
        t = self._check_scan(table, part, batch, updated_since_s)
        return self._scan_slots(t, batch, updated_since_s)

    def _scan_slots(
        self, t: Table, batch: int, updated_since_s: int | None
    ) -> Iterator[stored_rows.StoredRows]:
        """Slot ranges of ``batch``, each copied under the lock: pushes go on between blocks, and a row
        never moves slot, so one present for the whole scan is met once."""
        start, nonfinite = 0, 0
        while True:
            with self._op_lock:
                table = self._rows[t.name]  # drop_rows replaces it: read again every block
                if start >= table.high:
                    break
                end = min(start + batch, table.high)
                slots = start + np.flatnonzero(table.live[start:end])
                ids, rows, state, count, updated = (
                    table.ids[slots],
                    *table.read(slots, "rows", "state", "count", "updated"),
                )
            start = end
            keep = finite_rows(rows, state)
            nonfinite += len(keep) - int(keep.sum())
            if t.ttl is not None:
                keep &= ~t.ttl.expired(updated, self._clock())
            stamps = np.floor(updated).astype(np.uint32)
            if updated_since_s is not None:
                keep &= stamps >= updated_since_s
            if keep.any():
                yield stored_rows.StoredRows(ids[keep], rows[keep], state[keep], count[keep], stamps[keep])
        if nonfinite:
            log.warning("store table %r: left out %d rows holding a NaN or an infinity", t.name, nonfinite)

    def load_rows(self, table: str, rows: stored_rows.StoredRows) -> int:
        t = self.table(table)
        block = t.check_stored(rows)
        with self._op_lock:
            now = self._clock()
            keep = _last_of_each_id(block.ids)
            if t.ttl is not None:
                keep = keep[~t.ttl.expired(block.updated_s[keep].astype(np.float64), now)]
            ids = block.ids[keep]
            values = {
                "rows": block.rows[keep],
                "state": block.state[keep],
                "count": block.access_count[keep],
                "updated": block.updated_s[keep].astype(np.float64),
            }
            table = self._rows[table]
            slots = table.lookup(ids)
            present = slots >= 0
            table.write(slots[present], **{k: v[present] for k, v in values.items()})
            missing = ~present
            if missing.any():
                self._make_room(t, int(missing.sum()), now, protect=slots[present])
                table.insert(ids[missing], **{k: v[missing] for k, v in values.items()})
            return len(ids)

    def drop_rows(self, table: str) -> int:
        t = self.table(table)
        with self._op_lock:
            dropped = len(self._rows[table])
            self._rows[table] = _row_table(t)
            self._counters[table] = _counter_table()
            return dropped

    def stats(self) -> StoreStats:
        with self._op_lock:
            return StoreStats(
                backend=self.backend,
                rows={name: self._live_rows(name) for name in self._rows},
                bytes=sum(table.nbytes() for table in self._rows.values()),
                counters=self.metrics.totals(),
                admission_counters=self._live_counters(),
            )

    def _live_rows(self, name: str) -> int:
        """Rows not past their TTL (expired ones are only dropped lazily), as Redis would count them."""
        table, ttl = self._rows[name], self.tables[name].ttl
        if ttl is None:
            return len(table)
        live = table.live_slots()
        return int((~ttl.expired(table["updated"][live], self._clock())).sum())

    def _live_counters(self) -> dict[str, int]:
        """Counters not yet past their ``counter_ttl_s`` (expired ones are only dropped lazily)."""
        now = self._clock()
        out: dict[str, int] = {}
        for name, counters in self._counters.items():
            ttl = self.tables[name].admission.counter_ttl_s
            if ttl is None:
                continue
            live = counters.live_slots()
            out[name] = int((counters["first"][live] >= now - ttl).sum())
        return out
