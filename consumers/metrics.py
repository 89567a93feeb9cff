"""The consumer's Prometheus metrics, created against an explicit registry.

==========================================  =======================================================
``kelp_consumer_records_total``             records (messages) read, by topic
``kelp_consumer_samples_total``             samples decoded and accepted, by topic
``kelp_consumer_bytes_total``               record value bytes read, by topic
``kelp_consumer_batches_total``             micro-batches emitted
``kelp_consumer_decode_seconds``            histogram: time to decode + validate one poll's records
``kelp_consumer_lag_records``               gauge: high watermark - position, by topic and partition
                                            (from the first fetch after assignment, records or none)
``kelp_consumer_committed_lag_records``     gauge: high watermark - committed offset (a group's true backlog)
``kelp_consumer_committed_offset``          gauge: last committed offset, by topic and partition
``kelp_consumer_queue_batches``             gauge: batches waiting for the trainer
``kelp_consumer_paused``                    gauge: 1 while fetching is paused for back-pressure
``kelp_consumer_commits_total``             offset commits sent, by result (ok, failed)
``kelp_consumer_partitions_assigned_total`` partitions a rebalance handed to this member
``kelp_consumer_partitions_revoked_total``  partitions taken from it (rebalance, lost membership, close)
``kelp_consumer_offset_resets_total``       partitions moved to auto_offset_reset, by reason
                                            (offset_beyond_end, topic_recreated)
``kelp_consumer_topic_missing``             gauge: 1 while a subscribed topic is gone from the cluster
``kelp_records_rejected_total``             rejected samples, by reason (see codec.REASONS)
``kelp_consumer_dead_letters_total``        records sent to the dead-letter topic, by result
``kelp_consumer_rejected_records_total``    records rejected, by topic and reason (a rate over
                                            ``kelp_consumer_records_total`` is the share rejected)
``kelp_consumer_dead_letter_truncated_total``  dead-letter records cut to fit the producer's limit
``kelp_consumer_dead_letter_dropped_bytes_total``  bytes of those records left out of the copy
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
        self.lag = m.gauge(
            "lag_records",
            "High watermark minus position, from the first fetch after a partition is assigned.",
            ["topic", "partition"],
        )
        self.committed = m.gauge("committed_offset", "Last committed offset.", ["topic", "partition"])
        self.committed_lag = m.gauge(
            "committed_lag_records", "High watermark minus the last committed offset.", ["topic", "partition"]
        )
        self.queue = m.gauge("queue_batches", "Micro-batches waiting for the trainer.")
        self.paused = m.gauge("paused", "1 while fetching is paused because the batch queue is full.")
        self.commits = m.counter("commits", "Offset commits sent.", ["result"])
        # Per partition: which partitions a rebalance moved shows whether it was incremental (KIP-429)
        # or a static member's restart moved nothing (KIP-345).
        self.assigned = m.counter(
            "partitions_assigned", "Partitions handed to this member by a rebalance.", ["topic", "partition"]
        )
        self.revoked = m.counter(
            "partitions_revoked",
            "Partitions taken from this member (by a rebalance, a lost membership or close).",
            ["topic", "partition"],
        )
        self.offset_resets = m.counter(
            "offset_resets",
            "Partitions moved to source.auto_offset_reset because their offset was not valid on the "
            "topic, by reason (offset_beyond_end, topic_recreated).",
            ["reason"],
        )
        self.topic_missing = m.gauge(
            "topic_missing", "1 while a subscribed topic is absent from the cluster metadata.", ["topic"]
        )
        self.dead_letters = m.counter("dead_letters", "Records sent to the dead-letter topic.", ["result"])
        self.rejected = root.counter("records_rejected", "Rejected samples, by reason.", ["reason"])
        # Per topic, in records, so a share of kelp_consumer_records_total is computable (an alert
        # on a topic of the wrong format); kelp_records_rejected_total keeps its labels for dashboards.
        self.rejected_records = m.counter(
            "rejected_records",
            "Records rejected (whole or some rows), by topic and reason.",
            ["topic", "reason"],
        )
        self.dead_letter_truncated = m.counter(
            "dead_letter_truncated", "Dead-letter records cut short to fit the producer's max_request_size."
        )
        self.dead_letter_dropped_bytes = m.counter(
            "dead_letter_dropped_bytes", "Bytes of truncated dead-letter records left out of the copy."
        )
