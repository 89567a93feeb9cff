"""Two members of one consumer group split the partitions; the survivor takes over uncommitted records.

Runs on a broker of its own (see ``private_tansu``): on a broker shared with tests whose consumers
paused partitions, Tansu's fetch-session state can starve one partition of a later group.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig
from kelp.consumers.kafka_source import KafkaSource

from .conftest import private_tansu
from .test_kafka_source import BATCHING, SPEC, committed, produce, samples

pytestmark = pytest.mark.integration

tansu = pytest.fixture(private_tansu, name="tansu")


def test_two_members_split_and_survivor_takes_over(
    tansu,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],  # type: ignore[no-untyped-def]
) -> None:
    """``a`` trains and commits what it gets; ``b`` takes batches, never makes them durable, and leaves.

    Every record ``b`` took must come back to ``a`` (it was never committed), and between them
    nothing is lost. Records ``a`` took stay ``a``'s responsibility: a partition it keeps through
    the rebalance is not re-read, so they are not expected twice.
    """
    tansu.create_topic(unique_topic, 4)
    cfg = kafka_config()
    produce(tansu.bootstrap, unique_topic, samples(0, 400), partitions=4)
    a = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    b = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    durable_by_a: set[int] = set()
    taken_by_b: set[int] = set()
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not (a.assignment() and b.assignment()):
            batch = a.poll(0.2)
            if batch is not None:
                durable_by_a.update(batch.sparse["a"].values.tolist())
                a.commit(batch, wait=True)
            batch = b.poll(0.2)
            if batch is not None:
                taken_by_b.update(batch.sparse["a"].values.tolist())  # never committed
        assert a.assignment() and b.assignment()
        assert not a.assignment() & b.assignment()
    finally:
        b.close()
    remaining = set(range(400)) - durable_by_a
    try:
        taken_over: set[int] = set()
        deadline = time.monotonic() + 60
        while not remaining <= taken_over and time.monotonic() < deadline:
            batch = a.poll(1.0)
            if batch is not None:
                taken_over.update(batch.sparse["a"].values.tolist())
                a.commit(batch, wait=True)
    finally:
        a.close()
    assert taken_by_b <= taken_over  # b's uncommitted records came back to the survivor
    assert durable_by_a | taken_over == set(range(400))  # nothing lost
    assert sum(p or 0 for p in committed(tansu.bootstrap, cfg.group_id, unique_topic, 4)) == 400
