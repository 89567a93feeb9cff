"""The publisher's Prometheus metrics (subsystem ``publisher``), in the trainer's registry.

===================================================  ==============================================
``kelp_publisher_snapshots_total``                   snapshots, by result (ok, failed, refused_nonfinite,
                                                     unchanged: same weights and step as the last version)
``kelp_publisher_failures_total``                    failed publishes, by reason (:data:`FAILURE_REASONS`)
``kelp_publisher_version``                           gauge: version of the last published snapshot
                                                     (the channel's latest from the publisher's start)
``kelp_publisher_last_publish_timestamp_seconds``    gauge: unix time of the last published snapshot
``kelp_publisher_snapshot_bytes``                    gauge: size of the last snapshot (weights + manifest)
``kelp_publisher_publish_seconds``                   histogram: time to serialize and publish one snapshot
===================================================  ==============================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kelp.metrics import MetricFactory

__all__ = ["FAILURE_REASONS", "PublisherMetrics"]

FAILURE_REASONS: tuple[str, ...] = ("evicted", "overwritten", "state", "unavailable", "auth", "error")
"""Every ``reason`` of ``kelp_publisher_failures_total``; each failure is also ``snapshots{result="failed"}``.

``evicted``: written, but not readable back whole (the channel's Redis evicted
it); ``overwritten``: it read back different (another writer on the same
keys); ``state``: the channel's bookkeeping is missing or contradicts itself
(:class:`~kelp.publish.errors.ChannelStateError`); ``unavailable``: the
channel could not be reached; ``auth``: the channel's Redis refused the credentials
or the ACL user (a user error); ``error``: anything else the channel refused.
"""


class PublisherMetrics:
    """Every publisher metric in one registry (one instance per publisher)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricFactory("publisher", registry)
        self.registry = m.registry
        self.snapshots = m.counter("snapshots", "Dense snapshot publish attempts, by result.", ["result"])
        self.failures = m.counter("failures", "Failed snapshot publishes, by reason.", ["reason"])
        self.version = m.gauge(
            "version", "Version of the last published snapshot (at start, the channel's latest)."
        )
        self.last_publish = m.gauge(
            "last_publish_timestamp", "Unix time of the last published snapshot.", unit="seconds"
        )
        self.snapshot_bytes = m.gauge("snapshot", "Size of the last snapshot.", unit="bytes")
        self.publish_seconds = m.histogram("publish_seconds", "Time to serialize and publish a snapshot.")
