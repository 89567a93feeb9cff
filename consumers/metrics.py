"""The consumer's Prometheus metrics, created against an explicit registry.

==========================================  =======================================================
``kelp_consumer_records_total``             records (messages) read, by topic
``kelp_consumer_samples_total``             samples decoded and accepted, by topic
``kelp_consumer_bytes_total``               record value bytes read, by topic
``kelp_consumer_batches_total``             micro-batches emitted
``kelp_consumer_decode_seconds``            histogram: time to decode + validate one poll's records
``kelp_consumer_lag_records``               gauge: high watermark - position, by topic and partition
``kelp_consumer_committed_lag_records``     gauge: high watermark - committed offset (a group's true backlog)
``kelp_consumer_committed_offset``          gauge: last committed offset, by topic and partition
``kelp_consumer_queue_batches``             gauge: batches waiting for the trainer
``kelp_consumer_paused``                    gauge: 1 while fetching is paused for back-pressure
``kelp_consumer_commits_total``             offset commits sent, by result (ok, failed)
``kelp_records_rejected_total``             rejected samples, by reason (see codec.REASONS)
``kelp_consumer_dead_letters_total``        records sent to the dead-letter topic, by result
==========================================  =======================================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kelp.metrics import MetricFactory

__all__ = ["ConsumerMetrics"]


class ConsumerMetrics:
    """All consumer metrics in one registry (one instance per source)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricFactory("consumer", registry)
        root = MetricFactory("", m.registry)
        self.registry = m.registry
        self.records = m.counter("records", "Records (messages) read from the source.", ["topic"])
        self.samples = m.counter("samples", "Samples decoded, validated and accepted.", ["topic"])
        # No unit="bytes": the name already ends in bytes (the unit would make it ..._bytes_bytes_total).
        self.bytes = m.counter("bytes", "Record value bytes read.", ["topic"])
        self.batches = m.counter("batches", "Micro-batches emitted.")
        self.decode_seconds = m.histogram("decode_seconds", "Decode + validate time per run of records.")
        self.lag = m.gauge("lag_records", "High watermark minus position.", ["topic", "partition"])
        self.committed = m.gauge("committed_offset", "Last committed offset.", ["topic", "partition"])
        self.committed_lag = m.gauge(
            "committed_lag_records", "High watermark minus the last committed offset.", ["topic", "partition"]
        )
        self.queue = m.gauge("queue_batches", "Micro-batches waiting for the trainer.")
        self.paused = m.gauge("paused", "1 while fetching is paused because the batch queue is full.")
        self.commits = m.counter("commits", "Offset commits sent.", ["result"])
        self.dead_letters = m.counter("dead_letters", "Records sent to the dead-letter topic.", ["result"])
        self.rejected = root.counter("records_rejected", "Rejected samples, by reason.", ["reason"])
