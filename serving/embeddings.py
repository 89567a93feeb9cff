"""Embedding rows for a request: one batched, read-only store call, plus an optional local TTL cache.

Per request the fetcher receives each table's *unique* ids (the batch already
deduplicated them) and makes one ``store.pull_many(..., count=False)``: a
serving read never counts a sighting, admits an id, or writes anything. Ids
without a stored row (never admitted, or evicted) read their fallback bucket's
row when the table has ``admission.fallback_buckets`` (what the trainer trained
for them, pulled in the same round trip), else the table's default row (zeros,
or the deterministic init row with ``default_row: init``); that is never an
error, it is counted in ``default_row_rate``.

Local cache (``serving.local_cache_ttl_ms``, 0 = off): rows read from the store
are kept in this process for at most the TTL, so hot ids (Zipf-skewed traffic)
skip the network. The trade-off is freshness: a trainer's update to a cached
row becomes visible here up to TTL later (on top of the trainer's own
write-back delay), and ``embedding_age_s`` reports the age of the copy used.
The cache is whole-generation: it is emptied when its oldest entry reaches the
TTL (or it holds ``capacity_rows``), which bounds staleness exactly and needs
no per-row bookkeeping. Default rows are cached too, so a newly admitted id is
seen up to TTL late. Per table the copies live in a
:class:`~kelp.store.rows.slots.SlotTable` (columns ``rows``, ``updated``, ``admitted``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from kelp.serving.metrics import ServingMetrics
from kelp.store.base import EmbeddingStore, PullResult
from kelp.store.policy.fallback import Fallback
from kelp.store.rows.slots import Column, SlotTable

__all__ = ["FetchedRows", "RowFetcher"]

DEFAULT_CACHE_ROWS = 500_000


@dataclass(frozen=True)
class FetchedRows:
    """Rows for one request.

    * ``rows``: per table float32[U, dim], in the order of the ids given;
    * ``stored`` / ``default``: how many unique (table, id) pairs had a stored row / read the default;
    * ``ages_s``: float64[stored], seconds since each stored row's last update (clamped at 0).
    """

    rows: dict[str, np.ndarray]
    stored: int
    default: int
    ages_s: np.ndarray

    @property
    def default_rate(self) -> float:
        total = self.stored + self.default
        return self.default / total if total else 0.0


def _table_cache(dim: int) -> SlotTable:
    """Cached copies of one table's rows: what a store pull returned, per id."""
    return SlotTable(
        {
            "rows": Column(np.float32, width=dim),
            "updated": Column(np.uint32),
            "admitted": Column(bool),
        }
    )


class RowFetcher:
    """Fetches request rows from ``store`` (read-only), through a TTL cache when ``cache_ttl_ms > 0``.

    Thread-safe: requests run in a thread pool. The store call happens outside
    the cache lock, so concurrent requests never wait on each other's network I/O.
    """

    def __init__(
        self,
        store: EmbeddingStore,
        metrics: ServingMetrics,
        cache_ttl_ms: int = 0,
        *,
        capacity_rows: int = DEFAULT_CACHE_ROWS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.ttl_s = cache_ttl_ms / 1000.0
        self.capacity_rows = capacity_rows
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._cache: dict[str, SlotTable] = {}
        self._cache_started = clock()
        self._cache_rows = 0
        self.fallback = Fallback(t.spec for t in store.tables.values())
        self._rows_stored = metrics.rows.labels(result="stored")  # labels() per request takes a lock
        self._rows_default = metrics.rows.labels(result="default")

    def _fresh_cache(self, now: float) -> dict[str, SlotTable]:
        """The current generation, emptied first if it is as old as the TTL or full."""
        if now - self._cache_started >= self.ttl_s or self._cache_rows >= self.capacity_rows:
            self._cache = {}
            self._cache_started = now
            self._cache_rows = 0
        return self._cache

    def fetch(self, unique_ids: Mapping[str, np.ndarray]) -> FetchedRows:
        """Rows for each table's unique uint64 ids (one store round trip for whatever is not cached).

        Ids without a stored row read their fallback bucket's row where the table has
        ``admission.fallback_buckets`` (pulled in the same round trip), else the default row.
        """
        plan = self.fallback.expand(unique_ids)
        parts = self._fetch_tables(plan.ids)
        rows = {t: p[0] for t, p in parts.items()}
        if self.fallback:
            rows = self.fallback.compose(rows, {t: p[1] for t, p in parts.items()}, plan)
        return self._result({t: (rows[t], *parts[t][1:]) for t in unique_ids})

    def _fetch_tables(
        self, unique_ids: Mapping[str, np.ndarray]
    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """``{table: (rows, admitted, updated_s)}`` as stored, through the cache when it is on."""
        if self.ttl_s <= 0:
            got = self._pull(unique_ids)
            return {t: (g.rows, g.admitted, g.updated_s) for t, g in got.items()}
        need: dict[str, np.ndarray] = {}
        parts: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        with self._lock:
            cache = self._fresh_cache(self._clock())
            for table, ids in unique_ids.items():
                dim = self.store.table(table).dim
                rows = np.empty((len(ids), dim), np.float32)
                admitted = np.zeros(len(ids), bool)
                updated = np.zeros(len(ids), np.uint32)
                tc = cache.get(table)
                slots = tc.lookup(ids) if tc is not None else np.full(len(ids), -1, np.int64)
                hit = slots >= 0
                if tc is not None and hit.any():
                    hs = slots[hit]
                    rows[hit] = tc["rows"][hs]
                    admitted[hit], updated[hit] = tc["admitted"][hs], tc["updated"][hs]
                parts[table] = (rows, admitted, updated, hit)
                if not hit.all():
                    need[table] = ids[~hit]
        got = self._pull(need) if need else {}
        with self._lock:
            cache = self._fresh_cache(self._clock())
            for table, g in got.items():
                rows, admitted, updated, hit = parts[table]
                miss = ~hit
                rows[miss], admitted[miss] = g.rows, g.admitted
                updated[miss] = g.updated_s if g.updated_s is not None else 0
                tc = cache.get(table)
                if tc is None:
                    tc = cache[table] = _table_cache(rows.shape[1])
                fresh = tc.lookup(need[table]) < 0  # another request may have cached some meanwhile
                if fresh.any():
                    tc.insert(
                        need[table][fresh],
                        rows=g.rows[fresh],
                        admitted=g.admitted[fresh],
                        updated=0 if g.updated_s is None else g.updated_s[fresh],
                    )
                    self._cache_rows += int(fresh.sum())
        return {t: (r, a, u) for t, (r, a, u, _h) in parts.items()}

    def _pull(self, ids: Mapping[str, np.ndarray]) -> dict[str, PullResult]:
        started = time.perf_counter()
        got = self.store.pull_many(ids, count=False)
        self.metrics.store_fetch_seconds.observe(time.perf_counter() - started)
        return got

    def _result(self, parts: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> FetchedRows:
        """Counts and ages over all tables at once: a request has 26 tables of ~50 rows, and a dozen
        numpy calls per table cost more than the same calls once on the concatenation."""
        now = self._wall()
        admitted = [p[1] for p in parts.values()]
        stamped = [(p[1], p[2]) for p in parts.values() if p[2] is not None]
        total = sum(len(a) for a in admitted)
        stored = int(np.concatenate(admitted).sum()) if admitted else 0
        default = total - stored
        all_ages = np.zeros(0)
        if stamped and stored:
            had = np.concatenate([a for a, _ in stamped])
            updated = np.concatenate([u for _, u in stamped])
            known = updated[had & (updated > 0)]
            all_ages = np.maximum(now - known.astype(np.float64), 0.0)
        self._rows_stored.inc(stored)
        self._rows_default.inc(default)
        if all_ages.size:
            # One observation per request (the mean), not per row: a histogram observe per row would
            # cost more than the store call itself.
            self.metrics.embedding_age.observe(float(all_ages.mean()))
        return FetchedRows({t: p[0] for t, p in parts.items()}, stored, default, all_ages)
