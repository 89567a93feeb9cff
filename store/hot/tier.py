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
  occurrences to a per-table count-min sketch (:mod:`kelp.store.hot.sketch`, halved
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
  that late. A dirty row is kept until its own update was written back. In a
  trainer group (``owned``) a row another rank writes is re-read after
  ``writeback_interval_s`` instead, and between reads it takes the values its
  owner sends back after each step this rank trained it (:meth:`HotRowCache.refresh`).
* only admitted rows enter the tier; pulls of other ids go to the store every
  time, so admission counting still sees them.
* **only finite rows.** Rows enter the tier from the store's pull, which never
  returns a stored value that is no valid finite row (it quarantines it and
  reads an init row instead, :mod:`kelp.store.quarantine`); a pushed row
  holding a NaN or an infinity is refused here as the store refuses it
  (counted as ``nonfinite_push``), so the tier keeps the row it had.

The tables of one width share one tagged table
(:class:`~kelp.store.hot.rows.HotRows`), so each verb is a few array calls over
all of a step's ids. The row values and their Adagrad state are numpy arrays,
or, with ``device`` (the trainer's working copy,
:class:`~kelp.store.hot.working_copy.WorkingCopy`), tensors on the trainer's
device (HBM under CUDA); the bookkeeping columns (dirty, pins, frequencies)
stay in host memory either way. One lock serialises the tables' sections;
see docs/store.md for the sizing (about 100 bytes per dim-16 row).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

import numpy as np
import torch

from kelp.config import HotCacheConfig
from kelp.store.base import EmbeddingStore, PullResult, StoreStats
from kelp.store.hot.rows import HotRows, RowBatch
from kelp.store.hot.writeback import WritebackSchedule
from kelp.store.metrics import StoreMetrics
from kelp.store.quarantine import Quarantine
from kelp.store.rows.id_sets import member

__all__ = ["HotRowCache"]

log = logging.getLogger("kelp.store.hot_cache")  # the name users filter on, kept across moves

_OVERFILL = 8  # a full tier takes hot-enough rows up to capacity / _OVERFILL beyond it until the next trim
_TRIM_SLACK = 16  # a trim leaves capacity - capacity / _TRIM_SLACK rows
_MARGIN = 2  # a newcomer must be seen _MARGIN times as often as the hottest row the last trim dropped
_TRIM_SAMPLE = 4  # a trim scores a random sample of this many times its excess (see HotRowCache._trim) ...
_TRIM_MIN_SAMPLE = 65_536  # ... and never fewer rows than this: a small tier scores every row


class _InFlight:
    """Pushes that went past the tier to the store while a pull may have been reading the store.

    A pull reads its misses from the store without holding the tier's lock, so a
    push can write one of those ids straight to the store (it is not in the tier)
    at the same time. The pull may then have read the row from before that push;
    putting that row in the tier would hide the push from every later pull (a
    lost update). So each such push is logged while it runs, and a pull does not
    keep (only returns, where the trainer's update ledger patches it) the rows of
    ids pushed past the tier between its start and its end. Callers hold the lock.
    """

    def __init__(self) -> None:
        self._next = 0
        self._entries: dict[int, tuple[dict[str, np.ndarray], bool]] = {}  # seq -> (ids, done)
        self._watching: list[int] = []

    def begin(self, ids: dict[str, np.ndarray]) -> int:
        seq = self._next
        self._next += 1
        self._entries[seq] = (ids, False)
        return seq

    def end(self, seq: int) -> None:
        self._entries[seq] = (self._entries[seq][0], True)
        self._collect()

    def watch(self) -> int:
        """A pull starts reading the store: it must skip every push still running or begun from now."""
        running = [seq for seq, (_, done) in self._entries.items() if not done]
        start = min(running) if running else self._next
        self._watching.append(start)
        return start

    def since(self, start: int) -> dict[str, np.ndarray]:
        """The ids pushed past the tier from ``start`` on, per table; ends that pull's watch."""
        self._watching.remove(start)
        out: dict[str, list[np.ndarray]] = {}
        for seq, (ids, _) in self._entries.items():
            if seq >= start:
                for name, a in ids.items():
                    out.setdefault(name, []).append(a)
        self._collect()
        return {name: np.concatenate(parts) for name, parts in out.items()}

    def _collect(self) -> None:
        oldest = min(self._watching, default=self._next)
        for seq in [s for s, (_, done) in self._entries.items() if done and s < oldest]:
            del self._entries[seq]


_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A pull's result columns for one width group: rows, state, updated_s, admitted, admitted_now."""


def _hit_arrays(g: HotRows, slots: np.ndarray) -> _Arrays:
    """The result columns with the tier's hits filled in; copied while the lock is held (slots move)."""
    t = g.table
    n = len(slots)
    rows = np.empty((n, g.dim), dtype=np.float32)
    state = np.empty(n, dtype=np.float32)
    updated_s = np.zeros(n, dtype=np.uint32)
    hit = np.flatnonzero(slots >= 0)
    at = slots[hit]
    rows[hit], state[hit], updated_s[hit] = t.read(at, "rows", "state", "updated_s")
    admitted_now = np.zeros(n, dtype=bool)  # a row in the tier was admitted long ago
    return rows, state, updated_s, np.ones(n, dtype=bool), admitted_now


def _weights(batch: RowBatch, occurrences: Mapping[str, np.ndarray]) -> np.ndarray | int:
    """Sketch increments of ``batch``'s ids: their occurrences in the trained samples (at least 1)."""
    if not any(name in occurrences for name in batch.names):
        return 1
    lengths = np.diff(batch.bounds).tolist()
    parts = [
        np.asarray(occurrences[name]) if name in occurrences else np.ones(n, np.int64)
        for name, n in zip(batch.names, lengths, strict=True)
    ]
    return np.maximum(np.concatenate(parts), 1)


def _add_misses(
    batch: RowBatch,
    miss: np.ndarray,
    occurrences: Mapping[str, np.ndarray],
    need: dict[str, np.ndarray],
    need_occ: dict[str, np.ndarray],
) -> None:
    """Per table of ``batch``, the ids ``miss`` selects into ``need``, their occurrences into ``need_occ``."""
    ids_by, miss_by = batch.split(batch.ids), batch.split(miss)
    for name in batch.names:
        m = miss_by[name]
        if m.any():
            need[name] = ids_by[name][m]
            if name in occurrences:
                need_occ[name] = np.asarray(occurrences[name])[m]


def _pushed_past(batch: RowBatch, pick: np.ndarray, raced: Mapping[str, np.ndarray]) -> np.ndarray:
    """bool per position of ``pick`` (ascending): its id was pushed past the tier during the pull."""
    out = np.zeros(len(pick), dtype=bool)
    cuts = np.searchsorted(pick, batch.bounds).tolist()
    for i, name in enumerate(batch.names):
        if name in raced and cuts[i + 1] > cuts[i]:
            out[cuts[i] : cuts[i + 1]] = member(batch.ids[pick[cuts[i] : cuts[i + 1]]], raced[name])
    return out


class HotRowCache(EmbeddingStore):
    """Wraps ``inner``; same interface. One per trainer process (not shared between processes).

    ``clock`` is monotonic seconds (write-back interval and staleness); tests pass their own.
    ``owned``: which ids' rows this trainer writes (bool per id), None for all. In a trainer group
    another rank writes the rest; their copies here are kept fresh by :meth:`refresh` when this
    rank trains them, and are re-read after ``writeback_interval_s`` (the owner's own write-back
    bound) instead of ``max_staleness_s`` otherwise.
    """

    def __init__(
        self,
        inner: EmbeddingStore,
        cfg: HotCacheConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: StoreMetrics | None = None,
        owned: Callable[[np.ndarray], np.ndarray] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.inner = inner
        self._owned = owned
        self.tables = inner.tables
        self.backend = f"{inner.backend}+hot-tier"
        self.enforces = inner.enforces
        self.cfg = cfg
        self.capacity = cfg.capacity_rows
        self._clock = clock
        self.metrics = metrics or getattr(inner, "metrics", None) or StoreMetrics()
        shared = getattr(inner, "quarantine", None)  # one log rate limit with the store's own refusals
        self.quarantine = (
            shared if shared is not None and shared.metrics is self.metrics else Quarantine(self.metrics)
        )
        widths: dict[int, list[str]] = {}
        for name, t in self.tables.items():
            widths.setdefault(t.dim, []).append(name)
        self._groups = [
            HotRows(names, dim, max(64, cfg.capacity_rows), device=device) for dim, names in widths.items()
        ]
        self._group_of = {name: g for g in self._groups for name in g.names}
        self._threshold = 0  # a fetched row enters a full tier only above this estimate (set by trims)
        self._trim_rng = np.random.default_rng(0)
        self._held = 0
        self._lock = threading.RLock()  # the tables: short sections, never held across a store call
        self._push_lock = threading.RLock()  # pushes, write-backs, flushes and deletes, one at a time
        self._inflight = _InFlight()
        self._schedule = WritebackSchedule(cfg.writeback_every_steps, cfg.writeback_interval_s, clock)
        self._lookups = 0
        self._hits = 0
        self._export_settings()

    def _export_settings(self) -> None:
        m = self.metrics
        m.hot_tier()
        m.hot_writeback_every_steps.set(self.cfg.writeback_every_steps)
        m.hot_writeback_interval.set(self.cfg.writeback_interval_s)
        m.hot_capacity.set(self.capacity)
        m.hot_dirty_age.set_function(self._schedule.dirty_age)

    # -- write-back -----------------------------------------------------------------------------

    def _write_back(self, force: bool = False) -> None:
        """Push the rows that are due (:class:`~kelp.store.hot.writeback.WritebackSchedule`, and every
        ``fresh`` row) to ``inner`` in one call; they stay dirty if that raises. Then trim if the tier
        is over capacity.

        Runs under ``_push_lock`` only while it talks to the store: pulls, and the working copy's
        in-place writes (:class:`~kelp.store.hot.working_copy.WorkingCopy`), go on meanwhile. A row
        written again while its old value was on the way stays dirty (its ``last`` push moved) and
        waits for its new write-back; a pull only removes clean rows, never one of these dirty ones.
        """
        with self._lock:
            cutoff = self._schedule.due(force)
            fresh = [g.take_fresh() for g in self._groups]
            updates = {}
            due: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
            if cutoff or any(len(f) for f in fresh):
                for g, fresh_slots in zip(self._groups, fresh, strict=True):
                    t = g.table
                    slots = g.due(cutoff) if cutoff else fresh_slots  # a period's scan takes fresh rows too
                    due.append((slots, t["last"][slots], t["since"][slots]))
                    ordered, parts = g.by_table(slots)
                    if parts:
                        ids = t.ids[ordered]
                        rows, state = t.read(ordered, "rows", "state")
                        for name, (lo, hi) in parts.items():
                            updates[name] = (ids[lo:hi], rows[lo:hi], state[lo:hi])
        if updates:
            self.inner.push_many(updates)
        with self._lock:
            if due:
                self._written_back(due, cutoff)
            if self._held > self.capacity:
                self._trim()

    def _written_back(self, due: list[tuple[np.ndarray, np.ndarray, np.ndarray]], cutoff: int) -> None:
        """The rows of ``due`` (per group: slots, their ``last`` and ``since`` when copied) are in the
        store: clean where nothing wrote them since; the schedule learns what is durable."""
        early: list[int] = []  # the since of fresh rows written before their period ended
        again: dict[int, int] = {}  # rows written while on the way whose pending entry went: last -> count
        for g, (slots, last, since) in zip(self._groups, due, strict=True):
            t = g.table
            same = t["last"][slots] == last
            t["dirty"][slots[same]] = False
            t["fresh"][slots] = False
            early.extend(since[same & (since > cutoff)].tolist())
            moved = slots[~same & (since <= cutoff)]
            if len(moved):
                t["since"][moved] = t["last"][moved]
                pushes, counts = np.unique(t["last"][moved], return_counts=True)
                for push, n in zip(pushes.tolist(), counts.tolist(), strict=True):
                    again[push] = again.get(push, 0) + n
        self._schedule.forget(early)
        for push, n in again.items():
            self._schedule.dirtied(push, n)
        if cutoff:
            self._schedule.written(cutoff)
        self.metrics.hot_writeback.inc(sum(len(s) for s, _, _ in due))

    def _trim(self) -> None:
        """Drop clean rows with the lowest estimated frequency, over all tables at once, until the
        tier holds ``capacity`` less 1/16 (dirty rows leave only after their write-back).

        Trimming a sixteenth at a time, not just the excess, keeps trims to one per many steps.
        The victims are the least frequent of a random sample of ``_TRIM_SAMPLE`` times the excess
        (every row of a tier smaller than ``_TRIM_MIN_SAMPLE``), as Redis's approximated LFU
        samples its keys: scoring every row of a full tier at every trim held the tier's lock for
        a large part of a step, while a row in the sample's lowest quarter is cold by any measure."""
        excess = self._held - (self.capacity - self.capacity // _TRIM_SLACK)
        if excess <= 0:
            return
        total = sum(g.table.high for g in self._groups) or 1
        sample = max(_TRIM_SAMPLE * excess, _TRIM_MIN_SAMPLE)
        candidates = [g.clean_rows(-(-sample * g.table.high // total), self._trim_rng) for g in self._groups]
        scores = np.concatenate([score for _, score in candidates])
        if excess < len(scores):
            victims = np.argpartition(scores, excess - 1)[:excess]
        else:
            victims = np.arange(len(scores))
        if not len(victims):
            return
        self._threshold = int(scores[victims].max())
        start = 0
        for g, (slots, _) in zip(self._groups, candidates, strict=True):
            mine = victims[(victims >= start) & (victims < start + len(slots))] - start
            g.table.remove(slots[mine])
            start += len(slots)
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
        checked = {name: self.table(name).check_ids(raw) for name, raw in ids_by_table.items()}
        occurrences = occurrences or {}
        with self._lock:
            now = self._clock()
            looked: list[tuple[HotRows, RowBatch, np.ndarray, _Arrays]] = []
            need: dict[str, np.ndarray] = {}
            need_occ: dict[str, np.ndarray] = {}
            for g in self._groups:
                batch = g.batch(checked)
                if batch is None:
                    continue
                if count:
                    g.sketch.add(g.sketch_keys(batch.ids, batch.tags), _weights(batch, occurrences))
                slots = g.lookup(batch)
                self._reread_stale(g, batch, slots, now)
                looked.append((g, batch, slots, _hit_arrays(g, slots)))
                miss = slots < 0
                _add_misses(batch, miss, occurrences, need, need_occ)
                self._count_hits(batch, miss)
            watch = self._inflight.watch()
        try:
            fetched = self.inner.pull_many(need, count=count, occurrences=need_occ) if need else {}
        except BaseException:
            with self._lock:
                self._inflight.since(watch)
            raise
        with self._lock:
            raced = self._inflight.since(watch)  # pushed past the tier while we read the store
            out: dict[str, PullResult] = {}
            for item in looked:
                out.update(self._merge(item, fetched, raced, now))
            self._update_gauges()
            return out

    def _count_hits(self, batch: RowBatch, miss: np.ndarray) -> None:
        hits = batch.counts(~miss)
        for name, h, n in zip(batch.names, hits, np.diff(batch.bounds).tolist(), strict=True):
            self.metrics.hot_hits_by.inc(h, name)
            self.metrics.hot_misses_by.inc(n - h, name)
        self._lookups += len(miss)
        self._hits += sum(hits)

    def _reread_stale(self, g: HotRows, batch: RowBatch, slots: np.ndarray, now: float) -> None:
        """Clean rows loaded more than ``max_staleness_s`` ago (another rank's rows: more than
        ``writeback_interval_s``) leave the tier; their ``slots`` become -1."""
        t = g.table
        hit = np.flatnonzero(slots >= 0)
        at = slots[hit]
        limit: float | np.ndarray = self.cfg.max_staleness_s
        if self._owned is not None and len(hit):
            theirs = min(self.cfg.max_staleness_s, self.cfg.writeback_interval_s)
            limit = np.where(self._owned(batch.ids[hit]), self.cfg.max_staleness_s, theirs)
        stale = (now - t["loaded"][at] > limit) & ~t["dirty"][at] & (t["pins"][at] == 0)
        if stale.any():
            t.remove(at[stale])
            slots[hit[stale]] = -1
            self._held -= int(stale.sum())
            self.metrics.hot_stale.inc(int(stale.sum()))

    def _merge(
        self,
        looked: tuple[HotRows, RowBatch, np.ndarray, _Arrays],
        fetched: Mapping[str, PullResult],
        raced: Mapping[str, np.ndarray],
        now: float,
    ) -> dict[str, PullResult]:
        """The tier's hits and the store's rows, in the order asked, split per table (views of one
        array each); fetched rows may enter the tier, except those ``raced`` (see :class:`_InFlight`).

        ``looked``: the width group, the batch, each id's slot then (-1: fetched) and the hits."""
        g, batch, slots, (rows, state, updated_s, admitted, admitted_now) = looked
        got = [fetched[name] for name in batch.names if name in fetched]
        if got:
            where = np.flatnonzero(slots < 0)
            rows[where] = np.concatenate([f.rows for f in got])
            state[where] = np.concatenate([f.state for f in got])
            admitted[where] = np.concatenate([f.admitted for f in got])
            updated_s[where] = np.concatenate(
                [f.updated_s if f.updated_s is not None else np.zeros(len(f), np.uint32) for f in got]
            )
            admitted_now[where] = np.concatenate(
                [f.admitted_now if f.admitted_now is not None else np.zeros(len(f), bool) for f in got]
            )
            self._admit(g, batch, where, (rows, state, updated_s, admitted), now, raced=raced)
        parts = [batch.split(a) for a in (rows, state, admitted, updated_s, admitted_now)]
        return {name: PullResult(*(p[name] for p in parts)) for name in batch.names}

    def _admit(
        self,
        g: HotRows,
        batch: RowBatch,
        where: np.ndarray,
        values: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        now: float,
        *,
        raced: Mapping[str, np.ndarray],
    ) -> None:
        """Fetched admitted rows (positions ``where`` of ``batch``, ascending) seen at least ``min_count``
        times, and not pushed past the tier while they were read (``raced``, see :class:`_InFlight`), enter
        the tier while it has room; a full tier takes (up to 1/8 over ``capacity``, until the
        next trim) only rows whose estimated frequency is more than twice that of the hottest row the
        last trim dropped. Near the cut of a Zipf stream rows are seen about equally rarely; without
        the margin they swapped places ~10k rows per step, each swap a trim's worth of work for no
        gain in hits."""
        room = self.capacity + max(1, self.capacity // _OVERFILL) - self._held
        if room <= 0:
            return
        rows, state, updated_s, admitted = values
        pick = where[admitted[where]]
        full = self._held >= self.capacity
        if (full or self.cfg.min_count > 1) and len(pick):
            seen = g.sketch.estimate(g.sketch_keys(batch.ids[pick], batch.tags[pick]))
            bar = max(self.cfg.min_count - 1, _MARGIN * self._threshold if full else 0)
            pick = pick[seen > bar]
        if raced and len(pick):  # checked only for the rows that would enter: ~26k raced ids per pull
            pick = pick[~_pushed_past(batch, pick, raced)]
        if len(pick):  # another pull may have brought some of them in while this one read the store
            pick = pick[g.table.lookup(batch.ids[pick], batch.tags[pick]) < 0]
        pick = pick[:room]
        if not len(pick):
            return
        g.table.insert(
            batch.ids[pick],
            batch.tags[pick],
            rows=rows[pick],
            state=state[pick],
            loaded=now,
            updated_s=updated_s[pick],
        )
        self._held += len(pick)

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> int:
        """Rows in the tier are written there; the rest go to ``inner`` at once. Then the rows that
        are due are written back (:meth:`_write_back`). The ticket is the schedule's push number."""
        checked = {
            name: self._finite_only(name, *self.table(name).check_push(*u)) for name, u in updates.items()
        }
        with self._push_lock:
            with self._lock:
                passthrough = {}
                push = self._schedule.begin_push()
                stamp = np.uint32(time.time())
                for g in self._groups:
                    batch = g.batch({name: c[0] for name, c in checked.items()})
                    if batch is None:
                        continue
                    rows = np.concatenate([checked[n][1] for n in batch.names])
                    state = np.concatenate([checked[n][2] for n in batch.names])
                    slots = g.lookup(batch)
                    miss = slots < 0
                    if miss.any():
                        for name, m in batch.split(miss).items():
                            if m.any():
                                ids, r, st = checked[name]
                                passthrough[name] = (ids[m], r[m], st[m])
                        keep = ~miss
                        slots, rows, state = slots[keep], rows[keep], state[keep]
                    if not len(slots):
                        continue
                    t = g.table
                    newly = slots[~t["dirty"][slots]]
                    t["since"][newly] = push
                    self._schedule.dirtied(push, len(newly))
                    t.write(slots, rows=rows, state=state, updated_s=stamp, dirty=True, last=push)
                entry = (
                    self._inflight.begin({n: p[0] for n, p in passthrough.items()}) if passthrough else None
                )
            try:
                if passthrough:
                    self.inner.push_many(passthrough)
            finally:
                if entry is not None:
                    with self._lock:
                        self._inflight.end(entry)
            self._write_back()
            with self._lock:
                self._update_gauges()
        return push

    def refresh(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Rows their owner just stepped (a trainer group): a clean copy here takes the new values, as
        if read from the store now. Rows the tier does not hold stay out; a dirty row is this rank's
        own update waiting for its write-back and is never among them."""
        with self._lock:
            now = self._clock()
            for g in self._groups:
                batch = g.batch({name: u[0] for name, u in updates.items() if name in g.tag_of})
                if batch is None:
                    continue
                slots = g.lookup(batch)
                hit = slots >= 0
                if not hit.any():
                    continue
                rows = np.concatenate([updates[n][1] for n in batch.names])[hit]
                state = np.concatenate([updates[n][2] for n in batch.names])[hit]
                slots = slots[hit]
                clean = ~g.table["dirty"][slots]
                g.table.write(slots[clean], rows=rows[clean], state=state[clean], loaded=now)

    def _finite_only(
        self, name: str, ids: np.ndarray, rows: np.ndarray, state: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A push's rows without those holding NaN or infinity (counted and logged as the store does)."""
        keep = self.quarantine.refuse_nonfinite(name, ids, rows, state)
        return (ids, rows, state) if keep is None else (ids[keep], rows[keep], state[keep])

    def flush(self, force: bool = True) -> bool:
        """Write back what is due (``force``: every dirty row); True once no row is left dirty.

        Rows pushed past the tier went straight to ``inner``, so the answer also
        asks ``inner.flush(force)``. The trainer commits offsets by
        :meth:`durable_through`, which stays useful while some rows are always dirty.
        """
        with self._push_lock:
            self._write_back(force)
            inner_durable = self.inner.flush(force)
            with self._lock:
                self._update_gauges()
                return inner_durable and self._schedule.all_durable

    def durable_through(self, force: bool = False) -> int:
        """Writes back what is due (``force``: every dirty row), then the schedule's durable watermark.

        Rows pushed past the tier went to ``inner``, which writes through, so
        they are durable once their push returned.
        """
        with self._push_lock:
            self._write_back(force)
            self.inner.flush(force)
            with self._lock:
                self._update_gauges()
                return self._schedule.durable

    def dirty_rows(self) -> int:
        return int(sum(g.table["dirty"][: g.table.high].sum() for g in self._groups))

    def holds(self, table: str, ids: np.ndarray) -> np.ndarray:
        """bool[n]: which ``ids`` have a row in the tier now (tests, ``kelp store``)."""
        with self._lock:
            g = self._group_of[self.table(table).name]
            batch = g.batch({table: self.table(table).check_ids(ids)})
            assert batch is not None
            return g.lookup(batch) >= 0

    def rows_held(self) -> int:
        return self._held

    def bytes_held(self) -> int:
        """What the tier's slot columns take (rows, state, ids; allocated capacity, not the id index)."""
        return sum(g.table.nbytes() for g in self._groups)

    @property
    def hit_rate(self) -> float:
        return self._hits / self._lookups if self._lookups else 0.0

    def _update_gauges(self) -> None:
        self.metrics.hot_hit_rate.set(self.hit_rate)
        self.metrics.hot_rows.set(self.rows_held())
        self.metrics.hot_bytes.set(self.bytes_held())

    def delete(self, table: str, ids: np.ndarray) -> int:
        with self._push_lock, self._lock:
            ids = self.table(table).check_ids(ids)
            g = self._group_of[table]
            batch = g.batch({table: ids})
            assert batch is not None
            slots = g.lookup(batch)
            slots = slots[slots >= 0]
            t = g.table
            dirty = slots[t["dirty"][slots]]
            self._schedule.forget(t["since"][dirty].tolist())  # their pending updates go with them
            t["dirty"][dirty] = False
            t.remove(slots)
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

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Leaving a block that raised (the store is down past the outage budget), a failing final
        write-back must not replace that error: it is logged, and nothing is lost, because the
        offsets of rows never written back were never committed (a restart replays them)."""
        if exc is None:
            self.close()
            return
        dirty = self.dirty_rows()
        try:
            self.close()
        except Exception as failed:
            log.warning(
                "hot tier: %d rows not written back on close (%s); their Kafka offsets were not "
                "committed, so the next start trains them again",
                dirty,
                failed,
            )
