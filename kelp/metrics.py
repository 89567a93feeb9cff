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

import re
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

__all__ = ["LATENCY_BUCKETS_S", "NAMESPACE", "LabelledRegistry", "MetricFactory", "registered_names"]

NAMESPACE = "kelp"

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

    def counter(self, name: str, documentation: str, labels: Sequence[str] = (), unit: str = "") -> Counter:
        """A monotonically increasing count, exposed as ``<full name>_total``."""
        _check_name("counter", name, unit)
        full = self._full(name, unit)
        self._created.append(f"{full}_total")
        return Counter(full, documentation, labelnames=tuple(labels), registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = (), unit: str = "") -> Gauge:
        """A value that goes up and down (queue depth, lag, model age)."""
        _check_name("gauge", name, unit)
        full = self._full(name, unit)
        self._created.append(full)
        return Gauge(full, documentation, labelnames=tuple(labels), registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        unit: str = "seconds",
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
    ) -> Histogram:
        """A distribution; latency by default, in seconds."""
        _check_name("histogram", name, unit)
        full = self._full(name, unit)
        self._created.append(full)
        return Histogram(
            full, documentation, labelnames=tuple(labels), registry=self.registry, buckets=tuple(buckets)
        )

    def names(self) -> list[str]:
        """Exposed names of the metrics this factory created (counters with ``_total``)."""
        return list(self._created)


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
