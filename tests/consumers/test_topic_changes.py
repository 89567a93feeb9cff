"""Topics that change under a running Kafka source, on the real broker: deleted, recreated, grown.

What must hold: a deleted topic makes the source not ready with one log
line (kafka-python's per-refresh "not found" lines are hidden, and no commit
is retried against it); a recreated topic is read whole and its committed
offsets are its own, never the old topic's positions; partitions added while
running are read and committed; offsets that are not valid on the topic (beyond
the end, or committed for another topic id) restart at ``auto_offset_reset``,
counted by reason.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import OffsetAndMetadata, TopicPartition
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig
from kelp.consumers.kafka_source import KafkaSource
from kelp.consumers.topic_watch import commit_metadata

from .test_kafka_source import BATCHING, SPEC, committed, drain, produce, samples

pytestmark = pytest.mark.integration

# Refreshes this often in tests, so added partitions are seen within a second, not 30 s.
METADATA_MAX_AGE_MS = 500


def produce_to(bootstrap: str, topic: str, values: list[bytes], partitions: list[int]) -> None:
    """Round-robin ``values`` over the given partitions only."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i, v in enumerate(values):
        producer.send(topic, v, partition=partitions[i % len(partitions)])
    producer.flush()
    producer.close()


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def lines(caplog: pytest.LogCaptureFixture, logger: str, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and text in r.getMessage()]


def failed_commits(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("kelp_consumer_commits_total", {"result": "failed"}) or 0.0


def test_deleted_topic_is_not_ready_and_the_recreated_one_is_read_whole(
    kafka_broker: Any,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    kafka_broker.create_topic(unique_topic, 2)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 200), partitions=2)
    cfg = kafka_config(metadata_max_age_ms=METADATA_MAX_AGE_MS)
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        assert sorted(drain(src, 200)) == list(range(200))
        assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2) == [100, 100]
        assert src.not_ready_reason() is None

        kafka_broker.delete_topic(unique_topic)
        reason = wait_for(src.not_ready_reason, 30, "the source to report the topic missing")
        assert reason == f"source topic missing from the cluster: {unique_topic}"
        # Readiness reads the metadata listener's view; the poll thread sets the gauge when it acts on it.
        missing = {"topic": unique_topic}
        wait_for(
            lambda: registry.get_sample_value("kelp_consumer_topic_missing", missing) == 1, 10, "the gauge"
        )
        failed = failed_commits(registry)
        # While it is gone the source keeps polling: nothing comes, no commit is retried against it.
        assert src.poll(2.0) is None
        assert failed_commits(registry) == failed
        assert src.not_ready_reason() == reason

        kafka_broker.create_topic(unique_topic, 4)
        produce(kafka_broker.bootstrap, unique_topic, samples(1000, 1180), partitions=4)
        got = drain(src, 180)
        assert set(got) == set(range(1000, 1180))  # every new sample, at least once
        assert src.not_ready_reason() is None
        assert registry.get_sample_value("kelp_consumer_topic_missing", {"topic": unique_topic}) == 0
    finally:
        src.close()
    # The new topic's own ends (45 each), never the old topic's positions (100 on partitions 0 and 1).
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 4) == [45, 45, 45, 45]
    source_log = "kelp.consumers.kafka_source"
    assert len(lines(caplog, source_log, f"source topic {unique_topic} is gone from the cluster")) == 1
    assert len(lines(caplog, source_log, f"source topic {unique_topic} is back with 4 partitions")) == 1
    assert lines(caplog, "kafka.cluster", "not found in cluster metadata") == []
    assert len(lines(caplog, source_log, "offset commit failed")) <= 1


def test_partitions_added_while_running_are_read_and_committed(
    kafka_broker: Any,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    kafka_broker.create_topic(unique_topic, 2)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 40), partitions=2)
    cfg = kafka_config(metadata_max_age_ms=METADATA_MAX_AGE_MS)
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        assert sorted(drain(src, 40)) == list(range(40))
        kafka_broker.create_partitions(unique_topic, 4)
        produce_to(kafka_broker.bootstrap, unique_topic, samples(100, 140), partitions=[2, 3])
        assert sorted(drain(src, 40)) == list(range(100, 140))
        assert src.assignment() == {(unique_topic, p) for p in range(4)}
    finally:
        src.close()
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 4) == [20, 20, 20, 20]
    grew = f"source topic {unique_topic} grew from 2 to 4 partitions"
    assert len(lines(caplog, "kelp.consumers.kafka_source", grew)) == 1


def test_offsets_beyond_the_end_or_of_another_topic_id_restart_at_auto_offset_reset(
    kafka_broker: Any,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 2)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 40), partitions=2)  # 20 per partition
    cfg = kafka_config(metadata_max_age_ms=METADATA_MAX_AGE_MS)
    # What a group keeps after its topic was made again on a broker that does not drop a deleted
    # topic's offsets: one beyond the new end, one inside it but committed under the old topic's id.
    group = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=cfg.group_id)
    try:
        old_id = commit_metadata(str(uuid.uuid4()))
        group.commit(
            {
                TopicPartition(unique_topic, 0): OffsetAndMetadata(500, "", -1),
                TopicPartition(unique_topic, 1): OffsetAndMetadata(5, old_id, -1),
            }
        )
    finally:
        group.close()
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        assert sorted(drain(src, 40)) == list(range(40))  # each partition from its first record
    finally:
        src.close()
    for reason in ("offset_beyond_end", "topic_recreated"):
        assert registry.get_sample_value("kelp_consumer_offset_resets_total", {"reason": reason}) == 1
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2) == [20, 20]
    probe = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=cfg.group_id)
    try:
        meta = probe.committed(TopicPartition(unique_topic, 1), metadata=True)
        assert probe.partitions_for_topic(unique_topic) == {0, 1}  # fetches the topic's metadata
        topic_id = probe._client.cluster.topic_id(unique_topic)
    finally:
        probe.close()
    if topic_id is not None:  # the commit names the topic it belongs to
        assert meta.metadata == commit_metadata(str(topic_id))
