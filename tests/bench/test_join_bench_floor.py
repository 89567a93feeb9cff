"""``kelp bench join``'s floor: a plain read of both input topics, every record, from the first one."""

from __future__ import annotations

import math

import pytest
from kafka import KafkaProducer

from kelp.bench.join import _raw_consume
from kelp.harness import KafkaBroker

pytestmark = pytest.mark.integration


def test_the_raw_consume_reads_every_record_of_both_topics_once_one_is_read_up(
    kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    """A small topic read up first, a bigger one still queued: the read ends with every record."""
    small, big = f"{unique_topic}-clicks", f"{unique_topic}-imp"
    kafka_broker.create_topic(small, 1)
    kafka_broker.create_topic(big, 2)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    try:
        for i in range(20):
            producer.send(small, value=b"c%d" % i)
        for i in range(400):
            producer.send(big, value=bytes(4096), partition=i % 2)
        producer.flush(30)
    finally:
        producer.close()
    seconds = _raw_consume(kafka_broker.bootstrap, [big, small], 420)
    assert math.isfinite(seconds) and seconds >= 0.0
