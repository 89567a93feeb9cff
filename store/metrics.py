"""The store's Prometheus metrics (subsystem ``store``), created against one registry.

Labels are bounded: ``table`` (configured tables), ``shard`` (configured shard
addresses, no password), ``op`` (pull, push, delete, admit; for row operations read, count,
write), ``reason``.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge

from kelp.metrics import Children, MetricFactory

__all__ = ["StoreMetrics", "counter_totals"]

_PREFIX = "kelp_store_"


class StoreMetrics:
    """Every store metric; ``registry=None`` gives a private registry (so two stores never clash)."""

    # The hot tier's, there once :meth:`hot_tier` has run.
    hot_hits: Counter
    hot_misses: Counter
    hot_hits_by: Children[Counter]
    hot_misses_by: Children[Counter]
    hot_hit_rate: Gauge
    hot_rows: Gauge
    hot_bytes: Gauge
    hot_writeback: Counter
    hot_stale: Counter
    hot_evictions: Counter
    hot_capacity: Gauge
    hot_writeback_every_steps: Gauge
    hot_writeback_interval: Gauge
    hot_dirty_age: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        m = MetricFactory("store", self.registry)
        self.factory = m
        self.rows_pulled = m.counter("rows_pulled", "Rows returned by pull", ["table"])
        self.rows_pushed = m.counter("rows_pushed", "Rows written by push (acknowledged)", ["table"])
        self.misses = m.counter("misses", "Pulled ids with no stored row", ["table"])
        self.backend_row_ops = m.counter(
            "backend_row_ops",
            "Rows the backend (Redis, or the memory store) read, counted for admission or wrote; "
            "a hot tier in front keeps its hits out of this count",
            ["op"],
        )
        self.admissions = m.counter("admissions", "Ids admitted (init row stored)", ["table"])
        self.rejections = m.counter(
            "rejections", "Pulled ids (count=True) not admitted yet: they read the default row", ["table"]
        )
        self.push_discarded = m.counter(
            "push_discarded",
            "Pushed rows dropped because the id is not admitted (never, or evicted)",
            ["table"],
        )
        self.rows_quarantined = m.counter(
            "rows_quarantined",
            "Stored rows not valid for their table, never trained through (reason: nonfinite, "
            "wrong_length, bad_header), and pushed rows refused as non-finite (nonfinite_push)",
            ["table", "reason"],
        )
        self.evictions = m.counter(
            "evictions", "Rows evicted as seen by Kelp (memory backend: ttl or lfu)", ["table", "reason"]
        )
        self.round_trips = m.counter("round_trips", "Pipelined round trips to a shard", ["shard", "op"])
        self.bytes_sent = m.counter(
            "sent", "Row and key payload bytes sent to Redis", ["table"], unit="bytes"
        )
        self.bytes_received = m.counter(
            "received", "Row payload bytes received from Redis", ["table"], unit="bytes"
        )
        self.errors = m.counter("errors", "Failed operations after retries", ["op", "kind"])
        self.retries = m.counter("retries", "Retried attempts", ["op"])
        self.latency = m.histogram("op_duration", "Wall time of a store operation", ["op"])
        # Per-request recording by table or op, without labels()'s lock and checks each time.
        self.pulled_rows = Children(self.rows_pulled)
        self.missed_rows = Children(self.misses)
        self.received = Children(self.bytes_received)
        self.sent = Children(self.bytes_sent)
        self.row_ops = Children(self.backend_row_ops)
        self.op_latency = Children(self.latency)
        self.trips = Children(self.round_trips)
        self._hot_lock = threading.Lock()  # a hot tier registers its metrics once, whoever asks first

    def hot_tier(self) -> None:
        """Register the hot tier's metrics (``kelp_store_hot_cache_*``); a hot tier calls it, once or more.

        Only a store with a hot tier in front exports them: made at start in
        every process they would read 0 where there is no hot tier at all
        (serving, a write-through trainer), a cold cache to whoever reads them,
        and pull a dashboard's average hit rate down.
        """
        with self._hot_lock:
            if hasattr(self, "hot_hits"):
                return
            m = self.factory
            self.hot_hits = m.counter("hot_cache_hits", "Pulled rows served by the hot-row cache", ["table"])
            self.hot_misses = m.counter(
                "hot_cache_misses", "Pulled rows the hot-row cache had to fetch", ["table"]
            )
            self.hot_hit_rate = m.gauge(
                "hot_cache_hit_rate", "Hits / lookups of the hot-row cache since start", unit="ratio"
            )
            self.hot_rows = m.gauge("hot_cache_rows", "Rows held in the hot-row cache", unit="rows")
            self.hot_bytes = m.gauge(
                "hot_cache", "Memory the hot tier's slot columns take (rows, state, ids)", unit="bytes"
            )
            self.hot_writeback = m.counter(
                "hot_cache_writeback_rows", "Dirty rows written back by the hot cache"
            )
            self.hot_stale = m.counter(
                "hot_cache_stale_rereads", "Cached rows re-read because they passed max_staleness_s"
            )
            self.hot_evictions = m.counter(
                "hot_cache_evictions", "Clean rows dropped from the hot tier by frequency (trims)"
            )
            self.hot_capacity = m.gauge("hot_cache_capacity", "Configured hot tier capacity", unit="rows")
            self.hot_writeback_every_steps = m.gauge(
                "hot_cache_writeback_every_steps",
                "Configured bound: pushes between two write-backs of the hot tier (store.hot_cache)",
            )
            self.hot_writeback_interval = m.gauge(
                "hot_cache_writeback_interval",
                "Configured bound: seconds between two write-backs of the hot tier (store.hot_cache)",
                unit="seconds",
            )
            self.hot_hits_by = Children(self.hot_hits)
            self.hot_misses_by = Children(self.hot_misses)
            self.hot_dirty_age = m.gauge(
                "hot_cache_dirty_age",
                "Age of the oldest hot-tier update not yet written back to the store (0: all durable)",
                unit="seconds",
            )

    def totals(self) -> dict[str, float]:
        """Each store counter summed over its labels, without prefix or suffix: ``{"rows_pulled": 12.0}``.

        For ``kelp store stats``; only this subsystem's counters, even in a registry shared with others.
        """
        return counter_totals(self.registry)


def counter_totals(registry: CollectorRegistry) -> dict[str, float]:
    """:meth:`StoreMetrics.totals` read from any registry the store's metrics live in (benchmarks)."""
    totals: dict[str, float] = {}
    for family in registry.collect():
        if family.type != "counter" or not family.name.startswith(_PREFIX):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = sample.name.removeprefix(_PREFIX).removesuffix("_total")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals
