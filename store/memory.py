"""The in-process backend (the embedded default): numpy arenas, one per table.

Each table keeps its rows in contiguous arrays (``rows[cap, dim]`` in the table's
storage dtype, ``state``, ``count``, ``updated``) and maps ids to arena slots
with a vectorized :class:`~kelp.store.index.IdIndex`; freed slots are reused.
Admission counters live in a second index with a first-seen time
(``counter_ttl_s``). Eviction: TTL is checked lazily on every access and by a
vectorized sweep when the arena must grow; ``max_rows`` evicts the rows with the
lowest access count (pulls with ``count=True``), oldest update first on ties.
Thread-safe (one lock per store); nothing is shared between processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import numpy as np
from kelp.config import TableSpec
from kelp.store.base import EmbeddingStore, PullResult, StoreStats, Table
from kelp.store.index import IdIndex
from kelp.store.metrics import StoreMetrics
from prometheus_client import CollectorRegistry

__all__ = ["MemoryStore"]


class _Arena:
    """Rows of one table in growable numpy arrays."""

    def __init__(self, table: Table, capacity: int = 1024) -> None:
        self.t = table
        self.index = IdIndex(capacity)
        self.rows = np.zeros((capacity, table.dim), dtype=table.spec.dtype)
        self.state = np.zeros(capacity, dtype=np.float32)
        self.count = np.zeros(capacity, dtype=np.uint32)
        self.updated = np.zeros(capacity, dtype=np.float64)
        self.ids = np.zeros(capacity, dtype=np.uint64)
        self.live = np.zeros(capacity, dtype=bool)
        self.high = 0  # slots [0, high) have been handed out at least once
        self.free: list[np.ndarray] = []
        self.n_free = 0
        # admission counters
        self.cindex = IdIndex(64)
        self.ccount = np.zeros(64, dtype=np.uint32)
        self.cfirst = np.zeros(64, dtype=np.float64)
        self.chigh = 0

    def __len__(self) -> int:
        return len(self.index)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.rows, self.state, self.count, self.updated, self.ids, self.live))

    def alloc(self, k: int) -> np.ndarray:
        out: list[np.ndarray] = []
        need = k
        while need and self.free:
            chunk = self.free.pop()
            take, rest = chunk[:need], chunk[need:]
            if len(rest):
                self.free.append(rest)
            out.append(take)
            need -= len(take)
        self.n_free -= k - need
        if need:
            if self.high + need > len(self.rows):
                self._grow(self.high + need)
            out.append(np.arange(self.high, self.high + need, dtype=np.int64))
            self.high += need
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _grow(self, need: int) -> None:
        cap = len(self.rows)
        while cap < need:
            cap *= 2
        for name in ("rows", "state", "count", "updated", "ids", "live"):
            old = getattr(self, name)
            new = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def remove_slots(self, slots: np.ndarray) -> None:
        if len(slots) == 0:
            return
        self.index.delete(self.ids[slots])
        self.live[slots] = False
        self.free.append(slots.copy())
        self.n_free += len(slots)

    def insert(
        self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray, count: int, now: float
    ) -> np.ndarray:
        slots = self.alloc(len(ids))
        self.index.insert(ids, slots)
        self.ids[slots] = ids
        self.rows[slots] = rows
        self.state[slots] = state
        self.count[slots] = count
        self.updated[slots] = now
        self.live[slots] = True
        return slots

    def expired_slots(self, now: float) -> np.ndarray:
        if self.t.ttl_s is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.live[: self.high] & (self.updated[: self.high] < now - self.t.ttl_s))

    def lfu_victims(self, excess: int, protect: np.ndarray) -> np.ndarray:
        """``excess`` live slots with the lowest (count, updated); ``protect`` slots go last."""
        live = np.flatnonzero(self.live[: self.high])
        key_count = self.count[live].astype(np.float64)
        key_count[np.isin(live, protect)] = np.inf
        order = np.lexsort((self.updated[live], key_count))
        return live[order[:excess]]

    # -- admission counters -------------------------------------------------------------------

    def sight(self, ids: np.ndarray, now: float, ttl: float) -> np.ndarray:
        """Record one sighting of each id; returns the counts including this one."""
        slots = self.cindex.lookup(ids)
        new = slots < 0
        if new.any():
            k = int(new.sum())
            if self.chigh + k > len(self.ccount):
                self._sweep_counters(now, ttl, self.chigh + k)
            if self.chigh + k > len(self.ccount):
                cap = len(self.ccount)
                while cap < self.chigh + k:
                    cap *= 2
                self.ccount = np.resize(self.ccount, cap)
                self.cfirst = np.resize(self.cfirst, cap)
            fresh = np.arange(self.chigh, self.chigh + k, dtype=np.int64)
            self.chigh += k
            self.cindex.insert(ids[new], fresh)
            self.ccount[fresh] = 0
            self.cfirst[fresh] = now
            slots[new] = fresh
        stale = self.cfirst[slots] < now - ttl
        self.ccount[slots[stale]] = 0
        self.cfirst[slots[stale]] = now
        self.ccount[slots] += 1
        return self.ccount[slots].copy()

    def drop_counters(self, ids: np.ndarray) -> None:
        self.cindex.delete(ids)

    def _sweep_counters(self, now: float, ttl: float, need: int) -> None:
        """Compact the counter arena, dropping expired counters (no per-id work)."""
        keys, slots = self.cindex.items()
        keep = self.cfirst[slots] >= now - ttl
        keys, slots = keys[keep], slots[keep]
        counts, firsts = self.ccount[slots], self.cfirst[slots]
        self.cindex = IdIndex(max(64, need))
        self.chigh = len(keys)
        self.ccount[: self.chigh] = counts
        self.cfirst[: self.chigh] = firsts
        self.cindex.insert(keys, np.arange(self.chigh, dtype=np.int64))


class MemoryStore(EmbeddingStore):
    """Embedded store: everything in this process's memory, lost on exit.

    >>> from kelp.config import TableSpec
    >>> store = MemoryStore([TableSpec(name="ads", dim=4)])
    >>> ids = np.array([1, 2], dtype=np.uint64)
    >>> store.push("ads", ids, np.ones((2, 4), np.float32), np.zeros(2, np.float32))
    >>> store.pull("ads", ids).rows.sum()
    np.float32(8.0)
    """

    backend = "memory"

    def __init__(
        self,
        tables: list[TableSpec],
        registry: CollectorRegistry | None = None,
        *,
        initial_state: float = 0.0,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        super().__init__(tables, initial_state)
        self.metrics = StoreMetrics(registry)
        self._clock = clock
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._arenas = {name: _Arena(t) for name, t in self.tables.items()}

    # -- helpers --------------------------------------------------------------------------------

    def _lookup_live(self, arena: _Arena, ids: np.ndarray, now: float) -> np.ndarray:
        """Slots of ids (-1 absent), evicting rows whose TTL passed (lazy expiry)."""
        slots = arena.index.lookup(ids)
        t = arena.t
        if t.ttl_s is not None:
            hit = slots >= 0
            old = np.zeros(len(ids), dtype=bool)
            old[hit] = arena.updated[slots[hit]] < now - t.ttl_s
            if old.any():
                arena.remove_slots(slots[old])
                self.metrics.evictions.labels(table=t.name, reason="ttl").inc(int(old.sum()))
                slots[old] = -1
        return slots

    def _make_room(self, arena: _Arena, k: int, now: float, protect: np.ndarray) -> np.ndarray:
        """Evict so that ``k`` more rows fit under max_rows; returns evicted slots."""
        t = arena.t
        expired = arena.expired_slots(now) if arena.n_free < k else np.zeros(0, dtype=np.int64)
        if len(expired):
            arena.remove_slots(expired)
            self.metrics.evictions.labels(table=t.name, reason="ttl").inc(len(expired))
        if t.max_rows is None or len(arena) + k <= t.max_rows:
            return np.zeros(0, dtype=np.int64)
        victims = arena.lfu_victims(len(arena) + k - t.max_rows, protect)
        arena.remove_slots(victims)
        self.metrics.evictions.labels(table=t.name, reason="lfu").inc(len(victims))
        return victims

    # -- the verbs ------------------------------------------------------------------------------

    def pull_many(
        self, ids_by_table: Mapping[str, np.ndarray], *, count: bool = True
    ) -> dict[str, PullResult]:
        started = time.perf_counter()
        out: dict[str, PullResult] = {}
        with self._lock:
            now = self._clock()
            for name, raw_ids in ids_by_table.items():
                t = self.table(name)
                ids = t.check_ids(raw_ids)
                out[name] = self._pull_one(t, self._arenas[name], ids, count, now)
        self.metrics.latency.labels(op="pull").observe(time.perf_counter() - started)
        return out

    def _pull_one(self, t: Table, arena: _Arena, ids: np.ndarray, count: bool, now: float) -> PullResult:
        n = len(ids)
        slots = self._lookup_live(arena, ids, now)
        present = slots >= 0
        ps = slots[present]
        rows = np.empty((n, t.dim), dtype=np.float32)
        state = np.full(n, t.initial_state, dtype=np.float32)
        rows[present] = arena.rows[ps]
        state[present] = arena.state[ps]
        updated_s = np.zeros(n, dtype=np.uint32)
        updated_s[present] = arena.updated[ps].astype(np.uint32)
        admitted = present.copy()
        missing = np.flatnonzero(~present)
        if count:
            arena.count[ps] += 1
        if len(missing):
            mids = ids[missing]
            self.metrics.misses.labels(table=t.name).inc(len(missing))
            policy = t.admission
            if not count:
                qualify = np.zeros(len(missing), dtype=bool)
            elif policy.off:
                qualify = np.ones(len(missing), dtype=bool)
            elif policy.counts:
                qualify = policy.qualifies_by_count(arena.sight(mids, now, policy.counter_ttl_s))
            else:
                qualify = policy.qualifies_by_chance(len(missing), self._rng)
            init = t.init_rows(mids) if (qualify.any() or t.spec.default_row == "init") else None
            if qualify.any() and not policy.off:
                # Admission on: admitting stores the init row now, so a later push is kept.
                q = np.flatnonzero(qualify)
                self._make_room(arena, len(q), now, protect=ps)
                new_slots = arena.insert(mids[q], init[q], t.initial_state, 1, now)  # type: ignore[index]
                updated_s[missing[q]] = np.uint32(now)
                if policy.counts:
                    arena.drop_counters(mids[q])
                self.metrics.admissions.labels(table=t.name).inc(len(q))
                slots[missing[q]] = new_slots
            admitted[missing] = qualify
            if init is not None:
                rows[missing] = np.where(
                    qualify[:, None], init, t.default_rows(mids) if t.spec.default_row == "init" else 0.0
                )
            else:
                rows[missing] = 0.0
            if count:
                self.metrics.rejections.labels(table=t.name).inc(int((~qualify).sum()))
        self.metrics.rows_pulled.labels(table=t.name).inc(n)
        return PullResult(rows, state, admitted, updated_s)

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        started = time.perf_counter()
        with self._lock:
            now = self._clock()
            for name, (raw_ids, raw_rows, raw_state) in updates.items():
                t = self.table(name)
                ids, rows, state = t.check_push(raw_ids, raw_rows, raw_state)
                arena = self._arenas[name]
                slots = self._lookup_live(arena, ids, now)
                present = slots >= 0
                ps = slots[present]
                arena.rows[ps] = rows[present]
                arena.state[ps] = state[present]
                arena.updated[ps] = now
                missing = np.flatnonzero(~present)
                if len(missing):
                    if t.admission.off:
                        self._make_room(arena, len(missing), now, protect=ps)
                        arena.insert(ids[missing], rows[missing], state[missing], 1, now)
                    else:
                        self.metrics.push_discarded.labels(table=t.name).inc(len(missing))
                kept = len(ids) if t.admission.off else int(present.sum())
                self.metrics.rows_pushed.labels(table=t.name).inc(kept)
        self.metrics.latency.labels(op="push").observe(time.perf_counter() - started)

    def delete(self, table: str, ids: np.ndarray) -> int:
        t = self.table(table)
        ids = t.check_ids(ids)
        with self._lock:
            arena = self._arenas[table]
            slots = arena.index.lookup(ids)
            arena.remove_slots(slots[slots >= 0])
            arena.drop_counters(ids)
            return int((slots >= 0).sum())

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                backend=self.backend,
                rows={name: len(a) for name, a in self._arenas.items()},
                bytes=sum(a.nbytes() for a in self._arenas.values()),
                counters=_counter_totals(self.metrics),
            )


def _counter_totals(metrics: StoreMetrics) -> dict[str, float]:
    """Sum each store counter over its labels (for ``kelp store stats``)."""
    totals: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = sample.name.removeprefix("kelp_store_").removesuffix("_total")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals
