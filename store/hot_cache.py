"""FAE-style hot-row cache: a bounded, write-back cache of rows in front of any store.

The trainer's hottest ids (Zipf-skewed) are served from rows kept on the
trainer's device (a torch tensor on CUDA when available) instead of Redis.

Rules it keeps:

* **bounded**: ``capacity_rows`` across all tables (split evenly per table);
  when full, the rows used least often (by cache hits) leave first.
* **no lost updates**: a pushed row is marked dirty; dirty rows are written
  to the store on the write-back schedule (every ``writeback_every_steps``
  pushes or ``writeback_interval_s`` seconds), on :meth:`HotRowCache.flush` /
  :meth:`HotRowCache.close`, and *before* they leave the cache (eviction or
  staleness re-read). If a write-back fails the rows stay dirty and the error
  propagates.
* **durability is reported, and scheduled here only**: :meth:`HotRowCache.flush`
  returns True once no pushed row is still dirty. ``flush(force=False)`` writes
  back only when the schedule says so; the trainer's push thread calls it after
  every push and commits Kafka offsets only when it returns True, so this class
  holds the one copy of the schedule (:meth:`HotRowCache._writeback_due`).
* **bounded staleness**: a cached row read from the store more than
  ``max_staleness_s`` ago is re-read (after writing back its own update), so
  a trainer sees other trainers' updates at most ``max_staleness_s`` (plus
  their write-back period) late. Between two trainers caching the same row,
  write-backs are whole-row last-writer-wins, like the store itself.
* only admitted rows are cached; pulls of other ids go to the store every time
  (so admission counting still sees them).

Per table the rows live in a :class:`~kelp.store.slots.SlotTable` whose ``rows``
and ``state`` columns are torch tensors on the device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import numpy as np
import torch

from kelp.config import HotCacheConfig
from kelp.store.base import EmbeddingStore, PullResult, StoreStats
from kelp.store.metrics import StoreMetrics
from kelp.store.slots import Column, SlotTable

__all__ = ["HotRowCache"]


def _slot_table(capacity: int, dim: int, device: torch.device) -> SlotTable:
    return SlotTable(
        {
            "rows": Column(torch.float32, width=dim, device=device),
            "state": Column(torch.float32, device=device),
            "loaded": Column(np.float64),  # cache clock when read from the store (staleness)
            "updated_s": Column(np.uint32),  # unix seconds of the row's last update
            "hits": Column(np.uint32),
            "dirty": Column(bool),
        },
        capacity=capacity,
    )


class HotRowCache(EmbeddingStore):
    """Wraps ``inner``; same interface. Not shared between processes (one per trainer)."""

    def __init__(
        self,
        inner: EmbeddingStore,
        cfg: HotCacheConfig,
        *,
        device: str | torch.device | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self.inner = inner
        self.tables = inner.tables
        self.backend = f"{inner.backend}+hot-cache"
        self.enforces = inner.enforces
        self.cfg = cfg
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self._clock = clock
        self.metrics = metrics or getattr(inner, "metrics", None) or StoreMetrics()
        self.rows_per_table = max(1, cfg.capacity_rows // max(1, len(self.tables)))
        self._slots = {
            name: _slot_table(self.rows_per_table, t.dim, self.device) for name, t in self.tables.items()
        }
        self._lock = threading.RLock()
        self._steps = 0
        self._last_writeback = clock()
        self._lookups = 0
        self._hits = 0

    # -- write-back -----------------------------------------------------------------------------

    def _writeback_due(self) -> bool:
        """The write-back schedule, its only copy: every ``writeback_every_steps`` pushes or
        ``writeback_interval_s`` seconds."""
        return (
            self._steps >= self.cfg.writeback_every_steps
            or self._clock() - self._last_writeback >= self.cfg.writeback_interval_s
        )

    def _write_back(self, slots_by_table: Mapping[str, np.ndarray]) -> None:
        """Push the dirty rows among these slots to ``inner``; they stay dirty if that raises."""
        updates = {}
        for name, candidates in slots_by_table.items():
            c = self._slots[name]
            slots = candidates[c["dirty"][candidates]]
            if len(slots):
                updates[name] = (c.ids[slots], *c.read(slots, "rows", "state"))
        if not updates:
            return
        self.inner.push_many(updates)
        for name, slots in slots_by_table.items():
            self._slots[name]["dirty"][slots] = False
        self.metrics.hot_writeback.inc(sum(len(u[0]) for u in updates.values()))

    def _write_back_all(self) -> None:
        self._write_back({name: np.flatnonzero(c["dirty"]) for name, c in self._slots.items()})
        self._steps = 0
        self._last_writeback = self._clock()

    def _drop(self, name: str, slots: np.ndarray) -> None:
        c = self._slots[name]
        c["dirty"][slots] = False
        c.remove(slots)

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
            hits: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            stale: dict[str, np.ndarray] = {}
            need: dict[str, np.ndarray] = {}
            need_occ: dict[str, np.ndarray] = {}
            for name, raw in ids_by_table.items():
                t = self.table(name)
                ids = t.check_ids(raw)
                c = self._slots[name]
                slots = c.lookup(ids)
                cached = slots >= 0
                too_old = np.zeros(len(ids), dtype=bool)
                too_old[cached] = now - c["loaded"][slots[cached]] > self.cfg.max_staleness_s
                if too_old.any():
                    stale[name] = slots[too_old]
                    cached &= ~too_old
                hits[name] = (ids, slots, cached)
                need[name] = ids[~cached]
                if occurrences is not None and name in occurrences:
                    need_occ[name] = np.asarray(occurrences[name])[~cached]
                self.metrics.hot_hits.labels(table=name).inc(int(cached.sum()))
                self.metrics.hot_misses.labels(table=name).inc(int((~cached).sum()))
                self._lookups += len(ids)
                self._hits += int(cached.sum())
            if stale:
                self._write_back(stale)  # own updates first, then re-read: never lose them
                for name, s in stale.items():
                    self._drop(name, s)
                    self.metrics.hot_stale.inc(len(s))
            fetched = self.inner.pull_many(
                {k: v for k, v in need.items() if len(v)},
                count=count,
                occurrences={k: v for k, v in need_occ.items() if len(v)},
            )
            out: dict[str, PullResult] = {}
            for name, (ids, slots, cached) in hits.items():
                t = self.tables[name]
                c = self._slots[name]
                rows = np.empty((len(ids), t.dim), dtype=np.float32)
                state = np.empty(len(ids), dtype=np.float32)
                admitted = np.ones(len(ids), dtype=bool)
                admitted_now = np.zeros(len(ids), dtype=bool)  # a cached row was admitted long ago
                updated_s = np.zeros(len(ids), dtype=np.uint32)
                hs = slots[cached]
                if len(hs):
                    rows[cached], state[cached], updated_s[cached] = c.read(hs, "rows", "state", "updated_s")
                    c["hits"][hs] += 1
                if name in fetched:
                    f = fetched[name]
                    miss = ~cached
                    rows[miss], state[miss], admitted[miss] = f.rows, f.state, f.admitted
                    if f.admitted_now is not None:
                        admitted_now[miss] = f.admitted_now
                    f_updated = f.updated_s if f.updated_s is not None else np.zeros(len(f), np.uint32)
                    updated_s[miss] = f_updated
                    keep = f.admitted
                    self._insert(
                        name,
                        need[name][keep],
                        f.rows[keep],
                        f.state[keep],
                        f_updated[keep],
                        now=now,
                        protect=hs,
                    )
                out[name] = PullResult(rows, state, admitted, updated_s, admitted_now)
            self._update_gauges()
            return out

    def _insert(
        self,
        name: str,
        ids: np.ndarray,
        rows: np.ndarray,
        state: np.ndarray,
        updated_s: np.ndarray,
        *,
        now: float,
        protect: np.ndarray,
    ) -> None:
        c = self._slots[name]
        cap = self.rows_per_table
        if len(ids) == 0:
            return
        if len(ids) > cap:
            ids, rows, state, updated_s = ids[:cap], rows[:cap], state[:cap], updated_s[:cap]
        short = len(c) + len(ids) - cap
        if short > 0:
            live = c.live_slots()
            score = c["hits"][live].astype(np.float64)
            score[np.isin(live, protect)] = np.inf
            victims = live[np.argsort(score, kind="stable")[:short]]
            self._write_back({name: victims})  # dirty rows reach the store before they leave
            self._drop(name, victims)
        c.insert(ids, rows=rows, state=state, loaded=now, updated_s=updated_s)

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        with self._lock:
            passthrough = {}
            for name, (raw_ids, raw_rows, raw_state) in updates.items():
                t = self.table(name)
                ids, rows, state = t.check_push(raw_ids, raw_rows, raw_state)
                c = self._slots[name]
                slots = c.lookup(ids)
                cached = slots >= 0
                cs = slots[cached]
                if len(cs):
                    c.write(
                        cs,
                        rows=rows[cached],
                        state=state[cached],
                        updated_s=np.uint32(time.time()),
                        dirty=True,
                    )
                if (~cached).any():
                    passthrough[name] = (ids[~cached], rows[~cached], state[~cached])
            if passthrough:
                self.inner.push_many(passthrough)
            self._steps += 1
            if self._writeback_due():
                self._write_back_all()

    def flush(self, force: bool = True) -> bool:
        """Write back dirty rows (``force``, or when the schedule says so); True once none is left dirty.

        Rows pushed past the cache (not cached) went straight to ``inner``, so
        the answer also asks ``inner.flush(force)``.
        """
        with self._lock:
            if force or self._writeback_due():
                self._write_back_all()
            inner_durable = self.inner.flush(force)
            return inner_durable and self.dirty_rows() == 0

    def dirty_rows(self) -> int:
        return int(sum(c["dirty"].sum() for c in self._slots.values()))

    @property
    def hit_rate(self) -> float:
        return self._hits / self._lookups if self._lookups else 0.0

    def _update_gauges(self) -> None:
        self.metrics.hot_hit_rate.set(self.hit_rate)
        self.metrics.hot_rows.set(sum(len(c) for c in self._slots.values()))

    def delete(self, table: str, ids: np.ndarray) -> int:
        with self._lock:
            t = self.table(table)
            ids = t.check_ids(ids)
            c = self._slots[table]
            slots = c.lookup(ids)
            self._drop(table, slots[slots >= 0])
            return self.inner.delete(table, ids)

    def stats(self) -> StoreStats:
        s = self.inner.stats()
        s.backend = self.backend
        s.counters["hot_cache_hit_rate"] = self.hit_rate
        s.counters["hot_cache_dirty_rows"] = float(self.dirty_rows())
        return s

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.inner.close()
