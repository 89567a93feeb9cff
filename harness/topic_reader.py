"""Every record on a topic when asked: read up to its end offsets, for tests and benchmarks.

A consumer iterated until nothing came for a few seconds waits those seconds
every time, and on a loaded machine can stop before its first fetch returned,
answering with less than the topic holds. Reading to the end offsets taken at
the call is exact and returns as soon as the records are in.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["assign_from_beginning", "read_topic"]


def assign_from_beginning(consumer: Any, topics: list[str]) -> list[Any]:
    """Assign ``consumer`` every partition of ``topics`` (no group) at its first offset; the partitions."""
    from kafka.structs import TopicPartition

    partitions = [
        TopicPartition(topic, p)
        for topic in topics
        for p in sorted(consumer.partitions_for_topic(topic) or ())
    ]
    if partitions:
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
    return partitions


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0, **settings: Any) -> list[Any]:
    """The records of every partition of ``topic``, from the beginning to the end offsets at the call.

    ``settings`` are extra ``KafkaConsumer`` settings (security, for instance). A topic
    with no partitions (not made) reads as empty; not reaching the end within
    ``timeout_s`` raises ``TimeoutError`` naming the offsets.
    """
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, allow_auto_create_topics=False, **settings
    )
    try:
        partitions = assign_from_beginning(consumer, [topic])
        if not partitions:
            return []
        ends = consumer.end_offsets(partitions)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end offsets {ends} within {timeout_s:g} s")
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        records.sort(key=lambda r: (r.partition, r.offset))
        return records
    finally:
        consumer.close()
