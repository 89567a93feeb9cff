"""Embedding rows for a request: one batched, read-only store call, plus an optional local TTL cache.

Per request the fetcher receives each table's *unique* ids (the batch already
deduplicated them) and makes one ``store.read_many(...)``, which is
``pull_many(..., count=False)`` with every table's results side by side (no
split per table in the store, no concatenation again here): a serving read
never counts a sighting, admits an id, or writes anything. Ids
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
seen up to TTL late. The copies live in tagged
:class:`~kelp.store.rows.slots.SlotTable` s (columns ``rows``, ``updated``,
``admitted``; the tag is the table), one per row width: a request's lookup is
one index probe per width, not one per table (a 100-candidate request reads
~50 rows from each of 26 tables, and 26 small probes cost more than the store
read they save).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from kelp.serving.metrics import ServingMetrics
from kelp.store.base import EmbeddingStore, ReadRows
from kelp.store.policy.fallback import Fallback
from kelp.store.rows.index import MAX_TAG
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


def _group_cache(dim: int) -> SlotTable:
    """Cached copies of the rows of the tables of one width: what a store pull returned, per (table, id)."""
    return SlotTable(
        {
            "rows": Column(np.float32, width=dim),
            "updated": Column(np.uint32),
            "admitted": Column(bool),
        },
        tagged=True,
    )


@dataclass(frozen=True)
class _Probe:
    """One cache group's part of a request: its tables' ids side by side, and what the cache had."""

    tables: list[str]
    bounds: list[int]
    ids: np.ndarray
    tags: np.ndarray
    rows: np.ndarray
    admitted: np.ndarray
    updated: np.ndarray
    hit: np.ndarray


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
        self._cache: dict[tuple[int, int], SlotTable] = {}
        # Each table's cache group (its row width, and a chunk when a width has more tables than tags)
        # and its tag there.
        self._group: dict[str, tuple[tuple[int, int], int]] = {}
        by_width: dict[int, int] = {}
        for name in store.tables:
            dim = store.table(name).dim
            k = by_width.get(dim, 0)
            by_width[dim] = k + 1
            self._group[name] = ((dim, k // (MAX_TAG + 1)), k % (MAX_TAG + 1))
        self._cache_started = clock()
        self._cache_rows = 0
        self.fallback = Fallback(t.spec for t in store.tables.values())
        self._rows_stored = metrics.rows.labels(result="stored")  # labels() per request takes a lock
        self._rows_default = metrics.rows.labels(result="default")
        self._cache_hits = metrics.row_cache.labels(result="hit")
        self._cache_misses = metrics.row_cache.labels(result="miss")

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
        read = self.read(plan.ids)
        rows = read.rows
        if self.fallback:
            admitted = {t: read.admitted[read.span(t)] for t in read.tables}
            rows = self.fallback.compose(rows, admitted, plan)
        return self._result(read, rows, unique_ids)

    def read(self, unique_ids: Mapping[str, np.ndarray]) -> ReadRows:
        """What the store holds for ``unique_ids``, through the cache when it is on: the rows a
        request would use, before fallback rows and counts (``kelp bench freshness`` watches it)."""
        if self.ttl_s <= 0:
            return self._pull(unique_ids)
        groups: dict[tuple[int, int], list[str]] = {}
        for table in unique_ids:
            groups.setdefault(self._group[table][0], []).append(table)
        probes: dict[tuple[int, int], _Probe] = {}
        need: dict[str, np.ndarray] = {}
        with self._lock:
            cache = self._fresh_cache(self._clock())
            for key, tables in groups.items():
                probe = self._probe(cache.get(key), key[0], tables, unique_ids)
                probes[key] = probe
                if probe.hit.all():  # the common case once the cache is warm: nothing to read
                    continue
                for i, table in enumerate(tables):
                    lo, hi = probe.bounds[i], probe.bounds[i + 1]
                    missed = ~probe.hit[lo:hi]
                    if missed.any():
                        need[table] = probe.ids[lo:hi][missed]
        missed = sum(len(ids) for ids in need.values())
        self._cache_hits.inc(sum(len(p.ids) for p in probes.values()) - missed)
        self._cache_misses.inc(missed)
        if need:
            got = self._pull(need)
            with self._lock:
                cache = self._fresh_cache(self._clock())
                for key, probe in probes.items():
                    self._fill(cache, key, probe, got)
        return self._probed(list(probes.values()))

    @staticmethod
    def _probed(probes: list[_Probe]) -> ReadRows:
        """The probes' arrays (hits and filled misses) as one :class:`ReadRows`."""
        rows: dict[str, np.ndarray] = {}
        names: list[str] = []
        bounds = [0]
        for probe in probes:
            for i, table in enumerate(probe.tables):
                lo, hi = probe.bounds[i], probe.bounds[i + 1]
                rows[table] = probe.rows[lo:hi]
                names.append(table)
                bounds.append(bounds[-1] + hi - lo)
        if len(probes) == 1:
            admitted, updated = probes[0].admitted, probes[0].updated
        else:
            admitted = np.concatenate([p.admitted for p in probes]) if probes else np.zeros(0, bool)
            updated = np.concatenate([p.updated for p in probes]) if probes else np.zeros(0, np.uint32)
        return ReadRows(rows, tuple(names), tuple(bounds), admitted, updated)

    def _probe(
        self, tc: SlotTable | None, dim: int, tables: list[str], unique_ids: Mapping[str, np.ndarray]
    ) -> _Probe:
        """What the cache holds of ``tables``' ids (one tagged lookup for the whole group)."""
        parts = [np.asarray(unique_ids[t], dtype=np.uint64) for t in tables]
        lengths = [len(p) for p in parts]
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
        tags = np.repeat(np.array([self._group[t][1] for t in tables], dtype=np.uint8), lengths)
        n = len(ids)
        rows = np.empty((n, dim), np.float32)
        admitted = np.zeros(n, bool)
        updated = np.zeros(n, np.uint32)
        slots = tc.lookup(ids, tags) if tc is not None else np.full(n, -1, np.int64)
        hit = slots >= 0
        if tc is not None and hit.any():
            hs = slots[hit]
            rows[hit] = tc["rows"][hs]
            admitted[hit], updated[hit] = tc["admitted"][hs], tc["updated"][hs]
        bounds = [0, *np.cumsum(lengths).tolist()]
        return _Probe(tables, bounds, ids, tags, rows, admitted, updated, hit)

    def _fill(
        self,
        cache: dict[tuple[int, int], SlotTable],
        key: tuple[int, int],
        probe: _Probe,
        got: ReadRows,
    ) -> None:
        """Put the pulled rows into the request's arrays and the cache (one insert for the group)."""
        positions = []
        for i, table in enumerate(probe.tables):
            if table not in got.rows:
                continue
            lo = probe.bounds[i]
            where = lo + np.flatnonzero(~probe.hit[lo : probe.bounds[i + 1]])
            span = got.span(table)
            probe.rows[where], probe.admitted[where] = got.rows[table], got.admitted[span]
            probe.updated[where] = got.updated_s[span] if got.updated_s is not None else 0
            positions.append(where)
        if not positions:  # every table of the group was a full hit
            return
        miss = np.concatenate(positions) if len(positions) > 1 else positions[0]
        tc = cache.get(key)
        if tc is None:
            tc = cache[key] = _group_cache(key[0])
        fresh = miss[tc.lookup(probe.ids[miss], probe.tags[miss]) < 0]  # another request may have cached some
        if len(fresh):
            tc.insert(
                probe.ids[fresh],
                probe.tags[fresh],
                rows=probe.rows[fresh],
                admitted=probe.admitted[fresh],
                updated=probe.updated[fresh],
            )
            self._cache_rows += len(fresh)

    def _pull(self, ids: Mapping[str, np.ndarray]) -> ReadRows:
        started = time.perf_counter()
        got = self.store.read_many(ids)
        self.metrics.store_fetch_seconds.observe(time.perf_counter() - started)
        return got

    def _result(
        self, read: ReadRows, rows: Mapping[str, np.ndarray], asked: Mapping[str, np.ndarray]
    ) -> FetchedRows:
        """Counts and ages over the tables asked for (a fallback's bucket tables are left out), on the
        read's flat arrays: a dozen numpy calls per table would cost more than the same calls once."""
        if len(read.tables) == len(asked):  # no fallback tables: the flat arrays are the tables asked
            admitted, updated = read.admitted, read.updated_s
        else:
            spans = [read.span(t) for t in asked]
            admitted = np.concatenate([read.admitted[s] for s in spans]) if spans else np.zeros(0, bool)
            updated = None if read.updated_s is None else np.concatenate([read.updated_s[s] for s in spans])
        total = len(admitted)
        stored = int(np.count_nonzero(admitted))
        default = total - stored
        all_ages = np.zeros(0)
        if updated is not None and stored:
            known = updated[admitted & (updated > 0)]
            all_ages = np.maximum(self._wall() - known.astype(np.float64), 0.0)
        self._rows_stored.inc(stored)
        self._rows_default.inc(default)
        if all_ages.size:
            # One observation per request (the mean), not per row: a histogram observe per row would
            # cost more than the store call itself.
            self.metrics.embedding_age.observe(float(all_ages.mean()))
        return FetchedRows({t: rows[t] for t in asked}, stored, default, all_ages)
