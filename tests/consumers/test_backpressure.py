"""Back-pressure against a real broker (fetch sessions on where it is Apache Kafka): a stalled trainer.

The source must keep its queue bounded, stop fetching while the queue is full,
stay in the group while the trainer sleeps past the session timeout and the
max poll interval, and then hand out every sample exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig, SparseFeature
from kelp.consumers import encode_columns
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness import KafkaBroker

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(sparse=[SparseFeature(name="a")])
PARTITIONS = 2
PER_MESSAGE = 10
MESSAGES = 200  # 2000 samples, 100 messages per partition
BATCHING = BatchingConfig(batch_size=50, max_batch_delay_ms=50, queue_depth=2)


@pytest.fixture
def kafka_broker(isolated_kafka_broker: KafkaBroker) -> KafkaBroker:
    return isolated_kafka_broker


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for ``cond`` (the timeout only keeps a broken run from hanging; it is not asserted on)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_full_queue_pauses_fetching_keeps_membership_and_loses_nothing(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    metrics_registry: CollectorRegistry,
) -> None:
    kafka_broker.create_topic(unique_topic, PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for m in range(MESSAGES):
        ids = np.arange(m * PER_MESSAGE, (m + 1) * PER_MESSAGE, dtype=np.uint64)
        producer.send(unique_topic, encode_columns(ids % 2, sparse={"a": ids}), partition=m % PARTITIONS)
    producer.flush()
    producer.close()

    # Few records per poll, so the queue fills long before everything is fetched.
    cfg = kafka_config(dead_letter_topic=None, max_poll_records=10)
    reg = metrics_registry

    def metric(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    def records_read() -> float:
        return metric("kelp_consumer_records_total", topic=unique_topic) or 0.0

    src = KafkaSource(cfg, SPEC, BATCHING, reg)
    try:
        # The trainer takes nothing yet: the queue fills and the source pauses (and stays paused:
        # only taking a batch makes room).
        wait_until(lambda: metric("kelp_consumer_paused") == 1)
        assert metric("kelp_consumer_queue_batches") == BATCHING.queue_depth
        assert src.assignment() == {(unique_topic, p) for p in range(PARTITIONS)}
        read_at_pause = records_read()
        assert read_at_pause < MESSAGES  # fetching stopped before the topic was read

        # Sleep past the session timeout and the max poll interval without taking a batch.
        asleep_s = max(cfg.session_timeout_ms, cfg.max_poll_interval_ms) / 1000 + 1.5
        depths, reads = [], []
        end = time.monotonic() + asleep_s
        while time.monotonic() < end:
            depths.append(metric("kelp_consumer_queue_batches"))
            reads.append(records_read())
            time.sleep(0.1)
        assert max(d or 0 for d in depths) == BATCHING.queue_depth  # bounded, and full all along
        assert min(d or 0 for d in depths) == BATCHING.queue_depth
        assert set(reads) == {read_at_pause}  # no record fetched while paused
        assert metric("kelp_consumer_paused") == 1
        assert src.assignment() == {(unique_topic, p) for p in range(PARTITIONS)}

        # The trainer wakes up: every sample arrives once, from the same assignment (no
        # rebalance happened: a new assignment would carry a new epoch), and commits succeed.
        got: list[int] = []
        epochs: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < MESSAGES * PER_MESSAGE and time.monotonic() < deadline:
            batch = src.poll(1.0)
            if batch is None:
                continue
            assert batch.size <= BATCHING.batch_size
            got += batch.sparse["a"].values.tolist()
            epochs |= {(r.partition, r.epoch) for r in batch.sources}
            src.commit(batch, wait=True)
        assert sorted(got) == list(range(MESSAGES * PER_MESSAGE))
        assert len({p for p, _ in epochs}) == PARTITIONS
        assert len(epochs) == PARTITIONS  # one epoch per partition: never revoked, never reassigned
        assert src.poll(0.5) is None  # and nothing is delivered twice
        assert metric("kelp_consumer_paused") == 0
        assert records_read() == MESSAGES
    finally:
        src.close()

    # The group's committed offsets (what a new member would start from) cover every record.
    check = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=cfg.group_id, enable_auto_commit=False
    )
    try:
        committed = [check.committed(TopicPartition(unique_topic, p)) for p in range(PARTITIONS)]
    finally:
        check.close()
    assert committed == [MESSAGES // PARTITIONS] * PARTITIONS
