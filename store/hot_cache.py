"""The hot tier (FAE): the trainer's working copy of its most used rows, written back on a bounded schedule.

A trainer reads and writes every row it touches in every step. On a Zipf-like
stream a minority of ids appears in most batches; keeping *their* rows in the
trainer's memory saves a Redis round trip for each of them twice per step (the
pull and the push), and writes each of them to Redis once per write-back period
instead of once per step. This class wraps any store with the same interface::

    pull_many(ids)                                         push_many(updates)
      ├─ hits: rows from the tier (no round trip)            ├─ rows in the tier: written there (dirty)
      └─ misses: inner.pull_many ──> maybe enter the tier    └─ the rest: inner.push_many (write-through)
                                                           every writeback_every_steps pushes or
                                                           writeback_interval_s seconds: dirty rows ──>
                                                           inner.push_many, then trim to capacity

Rules it keeps:

* **hot by measured frequency, not recency.** Every training pull adds its ids'
  occurrences to a per-table count-min sketch (:mod:`kelp.store.sketch`, halved
  periodically so it follows the recent stream). While the tier has room every
  admitted row it fetches enters; once it holds ``capacity_rows``, a fetched row
  enters only if its estimated frequency beats the coldest row kept at the last
  trim. Trimming (after each write-back) drops the rows with the lowest
  estimates, over all tables at once, so a hot table gets more of the tier than
  a cold one. Between two trims the tier may hold up to ``capacity_rows`` plus
  one eighth.
* **bounded staleness of the store's copy.** A row written in the tier reaches
  the store at the next write-back: at most ``writeback_every_steps`` pushes or
  ``writeback_interval_s`` seconds later. Both bounds are exported as gauges,
  with the age of the oldest unwritten update and the dirty row count.
* **no lost updates, offsets committed only once durable.** Dirty rows leave
  the tier only after a successful write-back (trimming never drops a dirty
  row). :meth:`HotRowCache.flush` answers True only when no pushed row is still
  dirty, and the trainer commits Kafka offsets only then (daemon/pipeline.py),
  so a crash replays at most one write-back period from Kafka. A failed
  write-back leaves the rows dirty and raises.
* **bounded staleness of the tier's copy.** A clean row read from the store more
  than ``max_staleness_s`` ago is re-read before use, so another writer's
  updates (another trainer, ``kelp store delete``, a TTL expiry) are seen at most
  that late. A dirty row is kept until its own update was written back.
* only admitted rows enter the tier; pulls of other ids go to the store every
  time, so admission counting still sees them.

Rows live in host memory (numpy), one :class:`~kelp.store.slots.SlotTable` per
table; on a CUDA trainer the step copies each batch's rows to the device once,
as it does for rows from Redis. One lock serialises pulls, pushes and
write-backs; see docs/store.md for the sizing (about 100 bytes per dim-16 row).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from kelp.config import HotCacheConfig
from kelp.store.base import EmbeddingStore, PullResult, StoreStats
from kelp.store.metrics import StoreMetrics
from kelp.store.sketch import CountMinSketch
from kelp.store.slots import Column, SlotTable
from kelp.store.writeback import WritebackSchedule

__all__ = ["HotRowCache"]

_OVERFILL = 8  # a full tier takes hot-enough rows up to capacity / _OVERFILL beyond it until the next trim


def _slot_table(dim: int, capacity: int) -> SlotTable:
    return SlotTable(
        {
            "rows": Column(np.float32, width=dim),
            "state": Column(np.float32),
            "loaded": Column(np.float64),  # tier clock when read from the store (staleness)
            "updated_s": Column(np.uint32),  # unix seconds of the row's last update
            "dirty": Column(bool),
            "since": Column(np.int64),  # the push that dirtied the row first since its last write-back
        },
        capacity=capacity,
    )


class HotRowCache(EmbeddingStore):
    """Wraps ``inner``; same interface. One per trainer process (not shared between processes).

    ``clock`` is monotonic seconds (write-back interval and staleness); tests pass their own.
    """

    def __init__(
        self,
        inner: EmbeddingStore,
        cfg: HotCacheConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self.inner = inner
        self.tables = inner.tables
        self.backend = f"{inner.backend}+hot-tier"
        self.enforces = inner.enforces
        self.cfg = cfg
        self.capacity = cfg.capacity_rows
        self._clock = clock
        self.metrics = metrics or getattr(inner, "metrics", None) or StoreMetrics()
        per_table = max(64, cfg.capacity_rows // max(1, len(self.tables)))
        self._slots = {name: _slot_table(t.dim, min(per_table, 1 << 16)) for name, t in self.tables.items()}
        self._sketch = {name: CountMinSketch(width=2 * per_table, depth=2, seed=name) for name in self.tables}
        self._threshold = 0  # a fetched row enters a full tier only above this estimate (set by trims)
        self._held = 0
        self._lock = threading.RLock()
        self._schedule = WritebackSchedule(cfg.writeback_every_steps, cfg.writeback_interval_s, clock)
        self._lookups = 0
        self._hits = 0
        self._export_settings()

    def _export_settings(self) -> None:
        m = self.metrics
        m.hot_writeback_every_steps.set(self.cfg.writeback_every_steps)
        m.hot_writeback_interval.set(self.cfg.writeback_interval_s)
        m.hot_capacity.set(self.capacity)
        m.hot_dirty_age.set_function(self._schedule.dirty_age)

    # -- write-back -----------------------------------------------------------------------------

    def _write_back(self, force: bool = False) -> None:
        """Push the rows that are due (:class:`~kelp.store.writeback.WritebackSchedule`) to ``inner``
        in one call; they stay dirty if that raises. Then trim if the tier is over capacity."""
        cutoff = self._schedule.due(force)
        if cutoff:
            updates = {}
            due_slots = {}
            for name, c in self._slots.items():
                high = c.high
                slots = np.flatnonzero(c["dirty"][:high] & (c["since"][:high] <= cutoff))
                if len(slots):
                    due_slots[name] = slots
                    updates[name] = (c.ids[slots], c["rows"][slots], c["state"][slots])
            if updates:
                self.inner.push_many(updates)
                for name, slots in due_slots.items():
                    self._slots[name]["dirty"][slots] = False
                self.metrics.hot_writeback.inc(sum(len(s) for s in due_slots.values()))
            self._schedule.written(cutoff)
        if self._held > self.capacity:
            self._trim()

    def _trim(self) -> None:
        """Drop the clean rows with the lowest estimated frequency, over all tables at once, until the
        tier holds ``capacity`` (dirty rows leave only after their write-back)."""
        excess = self._held - self.capacity
        names, slots, scores = [], [], []
        for i, (name, c) in enumerate(self._slots.items()):
            live = c.live_slots()
            clean = live[~c["dirty"][live]]
            names.append(np.full(len(clean), i))
            slots.append(clean)
            scores.append(self._sketch[name].estimate(c.ids[clean]))
        table_of = np.concatenate(names)
        all_slots = np.concatenate(slots)
        all_scores = np.concatenate(scores)
        if excess < len(all_scores):
            victims = np.argpartition(all_scores, excess - 1)[:excess]
        else:
            victims = np.arange(len(all_scores))
        if not len(victims):
            return
        self._threshold = int(all_scores[victims].max())
        for i, name in enumerate(self._slots):
            mine = all_slots[victims[table_of[victims] == i]]
            if len(mine):
                self._slots[name].remove(mine)
        self._held -= len(victims)
        self.metrics.hot_evictions.inc(len(victims))

    # -- verbs ----------------------------------------------------------------------------------

    def pull_many(
        self,
        ids_by_table: Mapping[str, np.ndarray],
        *,
        count: bool = True,
        occurrences: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, PullResult]:
        with self._lock:
            now = self._clock()
            batch: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            need: dict[str, np.ndarray] = {}
            need_occ: dict[str, np.ndarray] = {}
            for name, raw in ids_by_table.items():
                ids = self.table(name).check_ids(raw)
                occ = None if occurrences is None else occurrences.get(name)
                if count:
                    self._sketch[name].add(ids, 1 if occ is None else np.maximum(np.asarray(occ), 1))
                c = self._slots[name]
                slots = c.lookup(ids)
                cached = slots >= 0
                self._reread_stale(name, slots, cached, now)
                batch[name] = (ids, slots, cached)
                miss = ~cached
                need[name] = ids[miss]
                if occ is not None:
                    need_occ[name] = np.asarray(occ)[miss]
                hits = int(cached.sum())
                self.metrics.hot_hits.labels(table=name).inc(hits)
                self.metrics.hot_misses.labels(table=name).inc(len(ids) - hits)
                self._lookups += len(ids)
                self._hits += hits
            wanted = {k: v for k, v in need.items() if len(v)}
            fetched = (
                self.inner.pull_many(
                    wanted, count=count, occurrences={k: need_occ[k] for k in wanted if k in need_occ}
                )
                if wanted
                else {}
            )
            out = {
                name: self._merge(name, (ids, slots, cached), fetched.get(name), now)
                for name, (ids, slots, cached) in batch.items()
            }
            self._update_gauges()
            return out

    def _reread_stale(self, name: str, slots: np.ndarray, cached: np.ndarray, now: float) -> None:
        """Clean rows loaded more than ``max_staleness_s`` ago leave the tier; ``cached`` is updated."""
        c = self._slots[name]
        hit = slots[cached]
        stale = (now - c["loaded"][hit] > self.cfg.max_staleness_s) & ~c["dirty"][hit]
        if stale.any():
            c.remove(hit[stale])
            self._held -= int(stale.sum())
            where = np.flatnonzero(cached)[stale]
            cached[where] = False
            slots[where] = -1
            self.metrics.hot_stale.inc(len(where))

    def _merge(
        self,
        name: str,
        lookup: tuple[np.ndarray, np.ndarray, np.ndarray],
        fetched: PullResult | None,
        now: float,
    ) -> PullResult:
        """The tier's hits and the store's rows, in the order asked; fetched rows may enter the tier.

        ``lookup``: the ids asked, their slots in the tier and which of them are there.
        """
        ids, slots, cached = lookup
        c = self._slots[name]
        if fetched is None:  # everything was a hit
            rows, state, updated_s = c["rows"][slots], c["state"][slots], c["updated_s"][slots]
            n = len(ids)
            return PullResult(rows, state, np.ones(n, bool), updated_s, np.zeros(n, bool))
        if not cached.any():
            self._admit(name, ids, fetched, now)
            return fetched
        dim = self.tables[name].dim
        n = len(ids)
        rows = np.empty((n, dim), dtype=np.float32)
        state = np.empty(n, dtype=np.float32)
        updated_s = np.empty(n, dtype=np.uint32)
        admitted = np.ones(n, dtype=bool)
        admitted_now = np.zeros(n, dtype=bool)  # a row in the tier was admitted long ago
        hs = slots[cached]
        rows[cached], state[cached], updated_s[cached] = c["rows"][hs], c["state"][hs], c["updated_s"][hs]
        miss = ~cached
        rows[miss], state[miss], admitted[miss] = fetched.rows, fetched.state, fetched.admitted
        updated_s[miss] = 0 if fetched.updated_s is None else fetched.updated_s
        if fetched.admitted_now is not None:
            admitted_now[miss] = fetched.admitted_now
        self._admit(name, ids[miss], fetched, now)
        return PullResult(rows, state, admitted, updated_s, admitted_now)

    def _admit(self, name: str, ids: np.ndarray, fetched: PullResult, now: float) -> None:
        """Fetched admitted rows enter the tier while it has room; a full tier takes (up to 1/8 over
        ``capacity``, until the next trim) only rows whose estimated frequency beats the coldest row
        the last trim dropped."""
        room = self.capacity + max(1, self.capacity // _OVERFILL) - self._held
        if room <= 0:
            return
        keep = fetched.admitted
        if self._held >= self.capacity:
            keep = keep & (self._sketch[name].estimate(ids) > self._threshold)
        pick = np.flatnonzero(keep)[:room]
        if not len(pick):
            return
        updated = fetched.updated_s[pick] if fetched.updated_s is not None else np.uint32(0)
        self._slots[name].insert(
            ids[pick], rows=fetched.rows[pick], state=fetched.state[pick], loaded=now, updated_s=updated
        )
        self._held += len(pick)

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Rows in the tier are written there; the rest go to ``inner`` at once. Then the rows that
        are due are written back (:meth:`_write_back`)."""
        with self._lock:
            passthrough = {}
            push = self._schedule.begin_push()
            stamp = np.uint32(time.time())
            for name, (raw_ids, raw_rows, raw_state) in updates.items():
                ids, rows, state = self.table(name).check_push(raw_ids, raw_rows, raw_state)
                c = self._slots[name]
                slots = c.lookup(ids)
                cached = slots >= 0
                if not cached.all():
                    miss = ~cached
                    passthrough[name] = (ids[miss], rows[miss], state[miss])
                    slots, rows, state = slots[cached], rows[cached], state[cached]
                if not len(slots):
                    continue
                newly = slots[~c["dirty"][slots]]
                c["since"][newly] = push
                self._schedule.dirtied(push, len(newly))
                c.write(slots, rows=rows, state=state, updated_s=stamp, dirty=True)
            if passthrough:
                self.inner.push_many(passthrough)
            self._write_back()
            self._update_gauges()

    def flush(self, force: bool = True) -> bool:
        """Write back what is due (``force``: every dirty row); True once no row is left dirty.

        Rows pushed past the tier went straight to ``inner``, so the answer also
        asks ``inner.flush(force)``. The trainer commits offsets by
        :meth:`durable_pushes`, which stays useful while some rows are always dirty.
        """
        with self._lock:
            self._write_back(force)
            self._update_gauges()
            inner_durable = self.inner.flush(force)
            return inner_durable and self._schedule.all_durable

    def push_count(self) -> int:
        with self._lock:
            return self._schedule.pushes

    def durable_pushes(self) -> int:
        with self._lock:
            return self._schedule.durable

    def dirty_rows(self) -> int:
        return int(sum(c["dirty"][: c.high].sum() for c in self._slots.values()))

    def holds(self, table: str, ids: np.ndarray) -> np.ndarray:
        """bool[n]: which ``ids`` have a row in the tier now (tests, ``kelp store``)."""
        with self._lock:
            return self._slots[table].lookup(self.table(table).check_ids(ids)) >= 0

    def rows_held(self) -> int:
        return self._held

    @property
    def hit_rate(self) -> float:
        return self._hits / self._lookups if self._lookups else 0.0

    def _update_gauges(self) -> None:
        self.metrics.hot_hit_rate.set(self.hit_rate)
        self.metrics.hot_rows.set(self.rows_held())

    def delete(self, table: str, ids: np.ndarray) -> int:
        with self._lock:
            ids = self.table(table).check_ids(ids)
            c = self._slots[table]
            slots = c.lookup(ids)
            slots = slots[slots >= 0]
            dirty = slots[c["dirty"][slots]]
            self._schedule.forget(c["since"][dirty].tolist())  # their pending updates go with them
            c["dirty"][dirty] = False
            c.remove(slots)
            self._held -= len(slots)
            return self.inner.delete(table, ids)

    def stats(self) -> StoreStats:
        s = self.inner.stats()
        s.backend = self.backend
        with self._lock:
            s.counters["hot_tier_hit_rate"] = self.hit_rate
            s.counters["hot_tier_rows"] = float(self.rows_held())
            s.counters["hot_tier_dirty_rows"] = float(self.dirty_rows())
        return s

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.inner.close()
