"""Consumer groups on the real broker: static membership, cooperative rebalancing, ``start_from``.

What each member's rebalance listener saw is read from its own registry
(``kelp_consumer_partitions_assigned_total`` / ``..._revoked_total``, per
partition): those count the listener calls themselves, so "never revoked" is a
statement about real revocation events, not about where partitions ended up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness import ApacheKafka, KafkaBroker

from .test_kafka_source import BATCHING, SPEC, committed, produce, samples

pytestmark = pytest.mark.integration

Taken = dict[str, list[int]]


@pytest.fixture
def kafka_broker(kafka_broker: KafkaBroker) -> KafkaBroker:
    if not isinstance(kafka_broker, ApacheKafka):
        pytest.skip(
            "static membership and cooperative rebalancing need Apache Kafka (the Tansu fallback runs)"
        )
    return kafka_broker


def events(src: KafkaSource, what: str, topic: str, partitions: int = 4) -> dict[int, int]:
    """How often ``src``'s listener saw each partition ``assigned`` or ``revoked``."""
    name = f"kelp_consumer_partitions_{what}_total"
    return {
        p: int(src.metrics.registry.get_sample_value(name, {"topic": topic, "partition": str(p)}) or 0)
        for p in range(partitions)
    }


def partitions(src: KafkaSource) -> set[int]:
    return {p for _t, p in src.assignment()}


def pump(
    members: dict[str, KafkaSource],
    taken: Taken,
    until: Callable[[], bool],
    timeout_s: float = 60.0,
) -> None:
    """Poll every member in turn, committing each batch at once, until ``until()`` (fail at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "timed out: " + "; ".join(
            f"{n} owns {sorted(s.assignment())}, commit positions {s.committed_positions()}"
            for n, s in members.items()
        )
        for name, src in members.items():
            batch = src.poll(0.1)
            if batch is not None:
                taken.setdefault(name, []).extend(batch.sparse["a"].values.tolist())
                src.commit(batch, wait=True)


def handed_out(taken: Taken) -> set[int]:
    return {v for values in taken.values() for v in values}


def total_committed(kafka_broker: KafkaBroker, cfg: KafkaSourceConfig, topic: str, n: int = 4) -> int:
    return sum(p or 0 for p in committed(kafka_broker.bootstrap, cfg.group_id, topic, n))


# ------------------------------------------------------------------ static membership (KIP-345)


@pytest.mark.parametrize("assignment", ["range", "cooperative-sticky"])
def test_restarted_static_member_takes_its_partitions_back_and_moves_nobody_elses(
    kafka_broker: KafkaBroker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    assignment: str,
) -> None:
    """``a`` closes and restarts under its instance id well inside the session timeout.

    Under ``range`` (eager) any rebalance would revoke every partition of ``b`` first, so ``b``
    seeing no revocation and no new assignment means the restart caused no rebalance at all.
    """
    kafka_broker.create_topic(unique_topic, 4)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 400), partitions=4)
    common = {"partition_assignment": assignment, "session_timeout_ms": 10_000}
    cfg_a = kafka_config(group_instance_id="member-a", **common)
    cfg_b = kafka_config(group_instance_id="member-b", **common)
    taken: Taken = {}
    a = KafkaSource(cfg_a, SPEC, BATCHING, CollectorRegistry())
    b = KafkaSource(cfg_b, SPEC, BATCHING, CollectorRegistry())
    a2: KafkaSource | None = None
    try:
        pump(
            {"a": a, "b": b},
            taken,
            lambda: len(partitions(a)) == 2 and len(partitions(b)) == 2 and len(handed_out(taken)) == 400,
        )
        mine, theirs = partitions(a), partitions(b)
        assert mine | theirs == {0, 1, 2, 3}
        b_revoked, b_assigned = events(b, "revoked", unique_topic), events(b, "assigned", unique_topic)

        a.close()
        assert {p for p, n in events(a, "revoked", unique_topic).items() if n} >= mine  # a let go locally
        a2 = KafkaSource(cfg_a, SPEC, BATCHING, CollectorRegistry())
        produce(kafka_broker.bootstrap, unique_topic, samples(400, 800), partitions=4)
        pump(
            {"a": a2, "b": b},
            taken,
            lambda: (
                handed_out(taken) >= set(range(800))
                and total_committed(kafka_broker, cfg_a, unique_topic) == 800
            ),
        )

        assert partitions(a2) == mine  # its own partitions back...
        assert {p for p, n in events(a2, "assigned", unique_topic).items() if n} == mine
        assert partitions(b) == theirs  # ...and b kept its own without a rebalance
        assert events(b, "revoked", unique_topic) == b_revoked
        assert events(b, "assigned", unique_topic) == b_assigned
        assert handed_out(taken) == set(range(800))
    finally:
        for src in (a, b, a2):
            if src is not None:
                src.close()


# ------------------------------------------------------------------ cooperative rebalancing (KIP-429)


def test_cooperative_rebalance_revokes_only_the_partitions_that_move(
    kafka_broker: KafkaBroker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    """``a`` owns all 4 partitions; ``b`` joins. ``a`` loses exactly what ``b`` gains and nothing else.

    A partition ``a`` keeps is never revoked (so never re-assigned: one assignment event each), its
    commits keep working (its epoch is unchanged), and between them every sample is handed out and
    committed.
    """
    kafka_broker.create_topic(unique_topic, 4)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 400), partitions=4)
    cfg = kafka_config()
    assert cfg.partition_assignment == "cooperative-sticky"  # the default
    taken: Taken = {}
    a = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    b: KafkaSource | None = None
    try:
        pump({"a": a}, taken, lambda: partitions(a) == {0, 1, 2, 3} and len(handed_out(taken)) >= 100)
        b = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
        produce(kafka_broker.bootstrap, unique_topic, samples(400, 800), partitions=4)
        joined = b
        # Until the commits reach the end, not only until every sample was seen: a batch `a` took from
        # a partition that then moved is not committed by `a` (its epoch ended); `b` reads it again.
        pump(
            {"a": a, "b": joined},
            taken,
            lambda: (
                bool(partitions(joined))
                and len(partitions(a) | partitions(joined)) == 4
                and handed_out(taken) >= set(range(800))
                and total_committed(kafka_broker, cfg, unique_topic) == 800
            ),
        )
        moved, kept = partitions(joined), partitions(a)
        assert moved and kept and not moved & kept
        revoked_from_a = {p for p, n in events(a, "revoked", unique_topic).items() if n}
        assert revoked_from_a == moved
        assert all(events(a, "revoked", unique_topic)[p] == 1 for p in moved)
        assert {p: events(a, "assigned", unique_topic)[p] for p in kept} == dict.fromkeys(kept, 1)
        assert {p for p, n in events(joined, "assigned", unique_topic).items() if n} == moved
        assert events(joined, "revoked", unique_topic) == dict.fromkeys(range(4), 0)
        assert handed_out(taken) == set(range(800))  # nothing lost
    finally:
        for src in (b, a):
            if src is not None:
                src.close()


# ------------------------------------------------------------------ start_from


def _produce_at(bootstrap: str, topic: str, values: Iterable[tuple[bytes, int]], partitions: int) -> None:
    """Records with explicit create times (epoch ms), spread round-robin over ``partitions``."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i, (value, ts) in enumerate(values):
        producer.send(topic, value, partition=i % partitions, timestamp_ms=ts)
    producer.flush()
    producer.close()


def _take(src: KafkaSource, expect: set[int], timeout_s: float = 60.0) -> list[int]:
    """Everything ``src`` hands out until ``expect`` has all come (committing as it goes).

    Within a partition records come in offset order, so a record before the start position would
    have come before the last expected one: the result holds any extra.
    """
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while not expect <= set(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} of {len(expect)}"
        batch = src.poll(0.2)
        if batch is not None:
            got += batch.sparse["a"].values.tolist()
            src.commit(batch, wait=True)
    return got


def _wait_assigned(src: KafkaSource, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(src.assignment()) < n:
        assert time.monotonic() < deadline, "never assigned"
        assert src.poll(0.1) is None, "a record came before the start position was set"


HOUR_MS = 3_600_000


@pytest.fixture
def two_halves(kafka_broker: KafkaBroker, unique_topic: str) -> int:
    """200 samples stamped two hours ago, then 200 stamped one hour ago; returns the time between."""
    now = int(time.time() * 1000)
    kafka_broker.create_topic(unique_topic, 2)
    _produce_at(kafka_broker.bootstrap, unique_topic, ((v, now - 2 * HOUR_MS) for v in samples(0, 200)), 2)
    _produce_at(kafka_broker.bootstrap, unique_topic, ((v, now - HOUR_MS) for v in samples(200, 400)), 2)
    return now - 3 * HOUR_MS // 2


@pytest.mark.parametrize("as_iso", [False, True])
def test_start_from_a_time_hands_out_exactly_the_later_records(
    kafka_broker: KafkaBroker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    two_halves: int,
    as_iso: bool,
) -> None:
    at = datetime.fromtimestamp(two_halves / 1000, tz=UTC).isoformat() if as_iso else two_halves
    cfg = kafka_config(start_from=at)
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        got = _take(src, set(range(200, 400)))
    finally:
        src.close()
    assert sorted(got) == list(range(200, 400))
    assert total_committed(kafka_broker, cfg, unique_topic, 2) == 400  # offsets, so the end of both halves


def test_start_from_a_time_after_the_last_record_starts_at_the_end(
    kafka_broker: KafkaBroker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    two_halves: int,
) -> None:
    src = KafkaSource(kafka_config(start_from=int(time.time() * 1000)), SPEC, BATCHING, CollectorRegistry())
    try:
        _wait_assigned(src, 2)
        produce(kafka_broker.bootstrap, unique_topic, samples(400, 450), partitions=2)
        got = _take(src, set(range(400, 450)))
    finally:
        src.close()
    assert sorted(got) == list(range(400, 450))


def test_start_from_earliest_replays_a_committed_group_and_latest_skips_the_backlog(
    kafka_broker: KafkaBroker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    two_halves: int,
) -> None:
    """``committed`` resumes after the commit; ``earliest`` replays all; ``latest`` only what comes next."""
    cfg = kafka_config()
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        assert sorted(_take(src, set(range(400)))) == list(range(400))
    finally:
        src.close()
    produce(kafka_broker.bootstrap, unique_topic, samples(400, 500), partitions=2)

    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())  # start_from: committed
    try:
        assert sorted(_take(src, set(range(400, 500)))) == list(range(400, 500))
    finally:
        src.close()

    src = KafkaSource(kafka_config(start_from="earliest"), SPEC, BATCHING, CollectorRegistry())
    try:
        assert sorted(_take(src, set(range(500)))) == list(range(500))
    finally:
        src.close()

    src = KafkaSource(kafka_config(start_from="latest"), SPEC, BATCHING, CollectorRegistry())
    try:
        _wait_assigned(src, 2)
        produce(kafka_broker.bootstrap, unique_topic, samples(500, 550), partitions=2)
        assert sorted(_take(src, set(range(500, 550)))) == list(range(500, 550))
    finally:
        src.close()
    assert total_committed(kafka_broker, cfg, unique_topic, 2) == 550
