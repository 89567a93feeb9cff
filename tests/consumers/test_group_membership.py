"""Two members of one consumer group split the partitions; the survivor takes over uncommitted records.

On Tansu this runs on a broker of its own (``isolated_kafka_broker``): on a broker shared with tests
whose consumers paused partitions, Tansu's fetch-session state can starve one partition of a later group.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig
from kelp.consumers import kafka_source
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness import KafkaBroker

from .test_kafka_source import BATCHING, SPEC, committed, produce, samples

pytestmark = pytest.mark.integration


@pytest.fixture
def kafka_broker(isolated_kafka_broker: KafkaBroker) -> KafkaBroker:
    return isolated_kafka_broker


def test_two_members_split_and_survivor_takes_over(
    kafka_broker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],  # type: ignore[no-untyped-def]
) -> None:
    """``a`` trains and commits what it gets; ``b`` takes batches, never makes them durable, and leaves.

    Every record ``b`` took must come back to ``a`` (it was never committed), and between them
    nothing is lost. Records ``a`` took stay ``a``'s responsibility: a partition it keeps through
    the rebalance is not re-read, so they are not expected twice.
    """
    kafka_broker.create_topic(unique_topic, 4)
    cfg = kafka_config()
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 400), partitions=4)
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

    def committed_total() -> int:
        return sum(p or 0 for p in committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 4))

    try:
        taken_over: set[int] = set()
        deadline = time.monotonic() + 60
        # A commit ``a`` made while a partition was moving to ``b`` may not have landed (the revocation
        # commit can fail on a loaded broker): that partition is then read again from its last commit,
        # so ``a`` goes on until every partition's commit is at its end, not only until it saw every id.
        while time.monotonic() < deadline and not (remaining <= taken_over and committed_total() == 400):
            batch = a.poll(1.0)
            if batch is not None:
                taken_over.update(batch.sparse["a"].values.tolist())
                a.commit(batch, wait=True)
    finally:
        a.close()
    assert taken_by_b <= taken_over  # b's uncommitted records came back to the survivor
    assert durable_by_a | taken_over == set(range(400))  # nothing lost
    assert committed_total() == 400


@pytest.mark.parametrize("assignment", ["range", "cooperative-sticky"])
def test_revocation_commits_what_is_durable(
    kafka_broker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    assignment: str,
) -> None:
    """Reports gathered but not yet committed are committed when a rebalance takes the partitions.

    Commits are held back (interval stretched to 60 s), so only the commit on revocation can
    bring the group's offsets up to what ``a`` reported. kafka-python 3 calls the listener on its
    IO thread, where a blocking commit raises: that commit used to fail on every revocation.
    An eager assignor (range) revokes both partitions; a cooperative one only the one that moves
    to ``b``, so the partition ``a`` keeps is still held back.
    """
    monkeypatch.setattr(kafka_source, "_COMMIT_INTERVAL_S", 60.0)
    kafka_broker.create_topic(unique_topic, 2)
    cfg = kafka_config(partition_assignment=assignment)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 400), partitions=2)
    a = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    reported: set[int] = set()
    b = None
    try:
        deadline = time.monotonic() + 30
        while len(reported) < 200 and time.monotonic() < deadline:
            batch = a.poll(1.0)
            if batch is not None:
                # The first commit is waited for, so it goes out at once and starts the interval;
                # every later one is held back by it.
                a.commit(batch, wait=not reported)
                reported.update(batch.sparse["a"].values.tolist())
        assert len(reported) >= 200
        time.sleep(0.5)  # a's poll thread takes in the last reports
        # Sample i went to partition i % 2 at offset i // 2; a read each partition in order.
        want = [max(i // 2 for i in reported if i % 2 == p) + 1 for p in range(2)]
        assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2) != want  # still held back
        b = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
        deadline = time.monotonic() + 40
        while not (a.assignment() and b.assignment()) and time.monotonic() < deadline:
            a.poll(0.1)  # taken, never reported: a keeps polling (not paused) through the rebalance
            b.poll(0.1)
        assert a.assignment() and b.assignment()
        got = committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2)
        if assignment == "range":
            assert got == want
        else:
            (moved,) = {p for _t, p in b.assignment()}
            assert got[moved] == want[moved]
            assert got[1 - moved] != want[1 - moved]  # kept, so never revoked: still held back
    finally:
        if b is not None:
            b.close()
        a.close()
