"""A group rejoin that a short poll cuts short still completes.

kafka-python 3 awaits a rejoin's JoinGroup/SyncGroup inside ``poll`` and, when the
poll's time runs out first, resumes it at the next poll only if the member still
"needs" to rejoin. A rejoin started by new partition metadata stops needing one as
soon as the leader assigned them, before the SyncGroup answer arrives: the next
poll then skipped the join, the answer was never applied, heartbeats stayed off,
and the member lost its place in the group for good (a joiner that never got its
partitions on a loaded machine). :func:`~kelp.consumers.kafka_client.keep_rejoin_going`
asks for the rejoin again while one is under way.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaConsumer

from kelp.consumers.kafka_client import keep_rejoin_going
from kelp.harness import KafkaBroker

pytestmark = pytest.mark.integration


def _assignment_after_growth(broker: KafkaBroker) -> set[int]:
    topic = f"rejoin-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=f"g-{topic}",
        enable_auto_commit=False,
        metadata_max_age_ms=300,
        allow_auto_create_topics=False,
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        assert consumer.assignment(), "the group never formed"
        broker.create_partitions(topic, 2)
        deadline = time.monotonic() + 20
        while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
            keep_rejoin_going(consumer)
            consumer.poll(timeout_ms=0)  # never long enough to await a JoinGroup/SyncGroup answer
            time.sleep(0.01)
        return {tp.partition for tp in consumer.assignment()}
    finally:
        consumer.close()


def test_new_partitions_are_assigned_through_polls_too_short_for_a_rejoin(kafka_broker: KafkaBroker) -> None:
    """Without :func:`keep_rejoin_going`, kafka-python 3 leaves the member on partition 0."""
    assert _assignment_after_growth(kafka_broker) == {0, 1}
