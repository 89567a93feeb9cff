"""Metric naming rules and a small factory around prometheus-client.

Conventions Kelp keeps for every metric (they are checked here, at creation):

* names are ``kelp_<subsystem>_<name>[_<unit>]``; the subsystem is the room
  that owns the metric (``consumer``, ``store``, ``trainer``, ``serving``...);
* counters end in ``_total`` (prometheus-client adds it);
* units are base units (``seconds``, ``bytes``), never ms or MB;
* label values are bounded (table, shard, reason, partition), never an id;
* every metric is created against an explicit registry, so tests use a fresh
  :class:`~prometheus_client.CollectorRegistry` and never see each other's counts.

Example::

    >>> from prometheus_client import CollectorRegistry
    >>> m = MetricFactory("store", CollectorRegistry())
    >>> pulls = m.counter("rows_pulled", "Rows returned by pull()", ["table"])
    >>> pulls.labels(table="ads").inc(3)
    >>> m.names()
    ['kelp_store_rows_pulled_total']
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

__all__ = [
    "LATENCY_BUCKETS_S",
    "NAMESPACE",
    "Children",
    "FunctionGauge",
    "LabelledRegistry",
    "MetricFactory",
    "leave_multiprocess",
    "multiprocess_dir",
    "registered_names",
    "scrape",
]

NAMESPACE = "kelp"
M = TypeVar("M", Counter, Gauge, Histogram)

# 100 µs .. 30 s: covers a Redis round trip on loopback up to a slow checkpoint.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

_SNAKE = re.compile(r"^[a-z]([a-z0-9_]*[a-z0-9])?$")
_BASE_UNITS = frozenset({"seconds", "bytes", "rows", "samples", "ratio", "info", ""})
_NON_BASE_SUFFIXES = ("_ms", "_milliseconds", "_us", "_kb", "_mb", "_gb", "_minutes", "_hours")


def _check_name(kind: str, name: str, unit: str) -> None:
    if not _SNAKE.match(name):
        raise ValueError(f"metric name {name!r} must be lower snake_case")
    if name.endswith("_total"):
        raise ValueError(f"{kind} {name!r}: leave out '_total', prometheus-client appends it to counters")
    if unit not in _BASE_UNITS:
        raise ValueError(f"{kind} {name!r}: unit {unit!r} is not a base unit ({sorted(_BASE_UNITS)})")
    if name.endswith(_NON_BASE_SUFFIXES):
        raise ValueError(f"{kind} {name!r}: use base units (seconds, bytes)")


class MetricFactory:
    """Creates metrics for one subsystem in one registry, enforcing the conventions."""

    def __init__(self, subsystem: str, registry: CollectorRegistry | None = None) -> None:
        if subsystem and not _SNAKE.match(subsystem):
            raise ValueError(f"subsystem {subsystem!r} must be lower snake_case")
        self.subsystem = subsystem
        self.registry = registry if registry is not None else REGISTRY
        self._created: list[str] = []

    def _full(self, name: str, unit: str) -> str:
        parts = [NAMESPACE, self.subsystem, name]
        if unit and not name.endswith(f"_{unit}"):
            parts.append(unit)
        return "_".join(p for p in parts if p)

    def _declare(self, kind: str, name: str, unit: str, exposed_suffix: str = "") -> str:
        """Check ``name``, record what it is exposed as, and return its full name."""
        _check_name(kind, name, unit)
        full = self._full(name, unit)
        self._created.append(full + exposed_suffix)
        return full

    def counter(self, name: str, documentation: str, labels: Sequence[str] = (), unit: str = "") -> Counter:
        """A monotonically increasing count, exposed as ``<full name>_total``."""
        full = self._declare("counter", name, unit, "_total")
        return Counter(full, documentation, labelnames=tuple(labels), registry=self.registry)

    def gauge(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        unit: str = "",
        multiprocess_mode: str = "all",
    ) -> Gauge:
        """A value that goes up and down (queue depth, lag).

        ``multiprocess_mode`` says how several processes' values combine under
        prometheus-client's multiprocess mode (``livesum``, ``max``...); it is
        ignored otherwise.
        """
        full = self._declare("gauge", name, unit)
        return Gauge(
            full,
            documentation,
            labelnames=tuple(labels),
            registry=self.registry,
            multiprocess_mode=multiprocess_mode,
        )

    def function_gauge(self, name: str, documentation: str, unit: str = "") -> FunctionGauge:
        """A gauge computed at scrape time (an age, a queue's length) by the function it is given.

        A collector, not a :class:`~prometheus_client.Gauge`: under multiprocess
        mode it is not written to the shared files, so the scraped process adds
        its own value (see :func:`scrape`).
        """
        gauge = FunctionGauge(self._declare("gauge", name, unit), documentation)
        self.registry.register(gauge)
        return gauge

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        unit: str = "seconds",
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
    ) -> Histogram:
        """A distribution; latency by default, in seconds."""
        full = self._declare("histogram", name, unit)
        return Histogram(
            full, documentation, labelnames=tuple(labels), registry=self.registry, buckets=tuple(buckets)
        )

    def names(self) -> list[str]:
        """Exposed names of the metrics this factory created (counters with ``_total``)."""
        return list(self._created)


class Children(Generic[M]):
    """A labelled metric's children, each looked up once: ``children("ads").inc()``.

    prometheus-client's ``labels()`` takes a lock and checks the values on every
    call. On paths that record per table on every request (a 100-candidate
    request touches 26 tables) that costs more than the increments themselves.
    """

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:  # two threads may both create it: labels() returns the same child
            child = self._children[values] = self.metric.labels(*values)
        return child

    def inc(self, amount: float, *values: str) -> None:
        """``self(*values).inc(amount)`` for a counter, straight to the child's value.

        A child is always observable, and a counter's amount is checked here, so
        prometheus-client's checks on every ``inc`` are skipped: they cost as much
        as the increment, and a serving read makes dozens. A prometheus-client
        without the ``_value`` it has held since its first releases takes the
        public path.
        """
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        child = self(*values)
        value = getattr(child, "_value", None)
        if value is None:
            child.inc(amount)  # type: ignore[attr-defined]
        else:
            value.inc(amount)


class FunctionGauge(Collector):
    """One unlabelled gauge whose value is ``function()`` at collection (0 until a function is set)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self._function: Callable[[], float] = lambda: 0.0

    def set_function(self, function: Callable[[], float]) -> None:
        self._function = function

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation, value=float(self._function()))

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation)


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess directory when this process runs in that mode, else None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def leave_multiprocess() -> None:
    """At a worker's exit: drop its live gauges from the shared files (``live*`` modes count the living)."""
    if multiprocess_dir() is not None:
        mark_process_dead(os.getpid())


def scrape(registry: CollectorRegistry, local: Sequence[Collector] = ()) -> bytes:
    """The Prometheus text of ``registry``, or, under multiprocess mode, of every process's metrics.

    In multiprocess mode (several ``kelp serve`` workers) counters, histograms and
    file-backed gauges are summed or combined across the processes by
    :class:`~prometheus_client.multiprocess.MultiProcessCollector`; ``local``
    collectors (function gauges) are this process's own values.
    """
    if multiprocess_dir() is None:
        return generate_latest(registry)
    combined = CollectorRegistry()
    MultiProcessCollector(combined)
    for collector in local:
        combined.register(collector)
    return generate_latest(combined)


_SERIES_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def registered_names(registry: CollectorRegistry | None = None) -> set[str]:
    """Every series name a PromQL query can use against this registry (counters as ``..._total``,
    histograms as ``_bucket``/``_sum``/``_count``), whether or not a labelled metric has samples yet.

    Used to cross-check dashboards and alert rules against what Kelp exports.
    """
    reg = registry if registry is not None else REGISTRY
    return {
        family.name + suffix
        for family in reg.collect()
        for suffix in _SERIES_SUFFIXES.get(family.type, ("",))
    }


class LabelledRegistry:
    """A registry seen with constant labels added to every sample (``rank`` for a trainer group).

    prometheus-client has no per-registry constant labels; exporting through
    this view keeps the metric objects label-free, so code that records a
    metric never has to know which rank it runs on.
    """

    def __init__(self, registry: CollectorRegistry, labels: Mapping[str, str]) -> None:
        self.registry = registry
        self.labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.samples.append(sample._replace(labels={**sample.labels, **self.labels}))
            yield labelled
