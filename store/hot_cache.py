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

__all__ = ["HotRowCache"]

_SLACK = 8  # the tier may overfill by capacity / _SLACK between two trims


def _slot_table(dim: int, capacity: int) -> SlotTable:
    return SlotTable(
        {
            "rows": Column(np.float32, width=dim),
            "state": Column(np.float32),
            "loaded": Column(np.float64),  # tier clock when read from the store (staleness)
            "updated_s": Column(np.uint32),  # unix seconds of the row's last update
            "dirty": Column(bool),
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
        self._soft_capacity = cfg.capacity_rows + max(1, cfg.capacity_rows // _SLACK)
        self._clock = clock
        self.metrics = metrics or getattr(inner, "metrics", None) or StoreMetrics()
        per_table = max(64, cfg.capacity_rows // max(1, len(self.tables)))
        self._slots = {name: _slot_table(t.dim, min(per_table, 1 << 16)) for name, t in self.tables.items()}
        self._sketch = {name: CountMinSketch(width=2 * per_table, depth=2, seed=name) for name in self.tables}
        self._threshold = 0  # a fetched row enters a full tier only above this estimate (set by trims)
        self._lock = threading.RLock()
        self._steps = 0
        self._last_writeback = clock()
        self._oldest_dirty: float | None = None  # clock of the first update not written back yet
        self._lookups = 0
        self._hits = 0
        self._export_settings()

    def _export_settings(self) -> None:
        m = self.metrics
        m.hot_writeback_every_steps.set(self.cfg.writeback_every_steps)
        m.hot_writeback_interval.set(self.cfg.writeback_interval_s)
        m.hot_capacity.set(self.capacity)
        m.hot_dirty_age.set_function(self._dirty_age)

    def _dirty_age(self) -> float:
        oldest = self._oldest_dirty
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    # -- write-back -----------------------------------------------------------------------------

    def _writeback_due(self) -> bool:
        """The write-back schedule, its only copy: every ``writeback_every_steps`` pushes or
        ``writeback_interval_s`` seconds."""
        return (
            self._steps >= self.cfg.writeback_every_steps
            or self._clock() - self._last_writeback >= self.cfg.writeback_interval_s
        )

    def _write_back_all(self) -> None:
        """Push every dirty row to ``inner`` in one call; they stay dirty if that raises. Then trim."""
        updates = {}
        dirty_slots = {}
        for name, c in self._slots.items():
            slots = np.flatnonzero(c["dirty"][: c.high])
            if len(slots):
                dirty_slots[name] = slots
                updates[name] = (c.ids[slots], c["rows"][slots], c["state"][slots])
        if updates:
            self.inner.push_many(updates)
            for name, slots in dirty_slots.items():
                self._slots[name]["dirty"][slots] = False
            self.metrics.hot_writeback.inc(sum(len(s) for s in dirty_slots.values()))
        self._steps = 0
        self._last_writeback = self._clock()
        self._oldest_dirty = None
        self._trim()

    def _trim(self) -> None:
        """Drop the clean rows with the lowest estimated frequency until the tier holds ``capacity``."""
        total = sum(len(c) for c in self._slots.values())
        excess = total - self.capacity
        if excess <= 0:
            return
        names, slots, scores = [], [], []
        for name, c in self._slots.items():
            live = c.live_slots()
            score = self._sketch[name].estimate(c.ids[live]).astype(np.float64)
            score[c["dirty"][live]] = np.inf  # a dirty row leaves only after its write-back
            names.append(np.full(len(live), len(names)))
            slots.append(live)
            scores.append(score)
        table_of = np.concatenate(names)
        all_slots = np.concatenate(slots)
        all_scores = np.concatenate(scores)
        victims = np.argpartition(all_scores, excess - 1)[:excess] if excess < len(all_scores) else None
        if victims is None:
            victims = np.arange(len(all_scores))
        victims = victims[np.isfinite(all_scores[victims])]
        if not len(victims):
            return
        self._threshold = int(all_scores[victims].max())
        for i, name in enumerate(self._slots):
            mine = all_slots[victims[table_of[victims] == i]]
            if len(mine):
                self._slots[name].remove(mine)
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
        """Fetched admitted rows enter the tier while it has room, and beyond ``capacity`` only if
        their estimated frequency beats the coldest row kept at the last trim."""
        room = self._soft_capacity - sum(len(c) for c in self._slots.values())
        if room <= 0:
            return
        keep = fetched.admitted.copy()
        if sum(len(c) for c in self._slots.values()) >= self.capacity and self._threshold > 0:
            keep &= self._sketch[name].estimate(ids) > self._threshold
        pick = np.flatnonzero(keep)[:room]
        if not len(pick):
            return
        updated = fetched.updated_s[pick] if fetched.updated_s is not None else np.uint32(0)
        self._slots[name].insert(
            ids[pick], rows=fetched.rows[pick], state=fetched.state[pick], loaded=now, updated_s=updated
        )

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        with self._lock:
            passthrough = {}
            wrote_tier = False
            stamp = np.uint32(time.time())
            for name, (raw_ids, raw_rows, raw_state) in updates.items():
                ids, rows, state = self.table(name).check_push(raw_ids, raw_rows, raw_state)
                c = self._slots[name]
                slots = c.lookup(ids)
                cached = slots >= 0
                if cached.all():
                    c.write(slots, rows=rows, state=state, updated_s=stamp, dirty=True)
                    wrote_tier = True
                    continue
                cs = slots[cached]
                if len(cs):
                    c.write(cs, rows=rows[cached], state=state[cached], updated_s=stamp, dirty=True)
                    wrote_tier = True
                miss = ~cached
                passthrough[name] = (ids[miss], rows[miss], state[miss])
            if wrote_tier and self._oldest_dirty is None:
                self._oldest_dirty = self._clock()
            if passthrough:
                self.inner.push_many(passthrough)
            self._steps += 1
            if self._writeback_due():
                self._write_back_all()
            self._update_gauges()

    def flush(self, force: bool = True) -> bool:
        """Write back dirty rows (``force``, or when the schedule says so); True once none is left dirty.

        Rows pushed past the tier went straight to ``inner``, so the answer also
        asks ``inner.flush(force)``.
        """
        with self._lock:
            if force or self._writeback_due():
                self._write_back_all()
                self._update_gauges()
            inner_durable = self.inner.flush(force)
            return inner_durable and self._oldest_dirty is None

    def dirty_rows(self) -> int:
        return int(sum(c["dirty"][: c.high].sum() for c in self._slots.values()))

    def holds(self, table: str, ids: np.ndarray) -> np.ndarray:
        """bool[n]: which ``ids`` have a row in the tier now (tests, ``kelp store``)."""
        with self._lock:
            return self._slots[table].lookup(self.table(table).check_ids(ids)) >= 0

    def rows_held(self) -> int:
        return sum(len(c) for c in self._slots.values())

    @property
    def hit_rate(self) -> float:
        return self._hits / self._lookups if self._lookups else 0.0

    def _update_gauges(self) -> None:
        self.metrics.hot_hit_rate.set(self.hit_rate)
        self.metrics.hot_rows.set(self.rows_held())

    def delete(self, table: str, ids: np.ndarray) -> int:
        with self._lock:
            ids = self.table(table).check_ids(ids)
            self._slots[table].remove_ids(ids)  # a deleted row's pending update is dropped with it
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
