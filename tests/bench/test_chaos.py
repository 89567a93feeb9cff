"""The chaos bench's pieces on a real broker: the offset-regression watcher and the record books.

The bench itself (``kelp bench chaos``) is not part of the suite: it kills and
restarts processes for minutes. These tests check its instruments, so that a
0 it reports means something: a backwards commit is seen, an uncommitted or
vanished record is counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kelp.bench.chaos import schedule
from kelp.bench.chaos_checks import OffsetWatcher, account_records, regressions_in
from kelp.harness import KafkaBroker

pytestmark = pytest.mark.integration


def _commit(consumer: KafkaConsumer, tp: TopicPartition, offset: int) -> None:
    consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})


def _wait(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.1)
    assert predicate()


def test_regressions_are_reads_below_an_earlier_read_of_the_same_partition() -> None:
    history = [(0.0, 0, 3), (1.0, 1, 4), (2.0, 0, 3), (3.0, 0, 8), (4.0, 1, 2), (5.0, 0, -1), (6.0, 0, 9)]
    assert regressions_in(history) == [(4.0, 1, 2, 4), (5.0, 0, -1, 8)]
    assert regressions_in([(0.0, 0, 1), (1.0, 0, 1), (2.0, 0, 2)]) == []
    # one backwards move read three times is one regression; moving back again is another
    reread = [(0.0, 0, 9), (1.0, 0, 3), (2.0, 0, 3), (3.0, 0, 3), (4.0, 0, 5), (5.0, 0, 4)]
    assert regressions_in(reread) == [(1.0, 0, 3, 9), (5.0, 0, 4, 9)]


def test_the_watcher_sees_a_backwards_commit_and_the_books_count_what_was_not_committed(
    kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    kafka_broker.create_topic(unique_topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks=1)
    acked: list[set[int]] = [set(), set()]
    for i in range(12):
        meta = producer.send(unique_topic, b"r%d" % i, partition=i % 2).get(10)
        acked[meta.partition].add(meta.offset)
    producer.close()
    group = f"g-{unique_topic}"
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False
    )
    tp0, tp1 = TopicPartition(unique_topic, 0), TopicPartition(unique_topic, 1)
    consumer.assign([tp0, tp1])
    watcher = OffsetWatcher(kafka_broker.bootstrap, group, unique_topic, 2, interval_s=0.1)
    watcher.start()
    try:
        _commit(consumer, tp0, 5)
        _commit(consumer, tp1, 6)
        _wait(lambda: watcher.latest() == [5, 6])
        assert watcher.regressions() == []
        _commit(consumer, tp0, 3)  # what a trainer must never do: its next incarnation re-reads 3..4
        _wait(lambda: watcher.latest() == [3, 6])
    finally:
        watcher.finish()
        consumer.close()
    found = watcher.regressions()
    assert [(p, off, high) for _, p, off, high in found] == [(0, 3, 5)]

    books = account_records(kafka_broker.bootstrap, unique_topic, acked, watcher.latest())
    assert books.acked == 12 and books.acked_end == [6, 6]
    assert books.missing_from_broker == 0
    assert books.uncommitted_by_partition == [3, 0]  # offsets 3, 4, 5 of partition 0
    assert books.lost == 3


def test_the_quick_schedule_has_three_kills_and_every_other_fault() -> None:
    quick, full = schedule(quick=True), schedule(quick=False)
    assert quick.count("trainer_kill9") == 3 and len(quick) >= 6
    kinds = {"trainer_kill9", "redis_restart", "redis_stall", "broker_restart", "replica_store_away"}
    assert set(quick) == kinds | {"poisoned_rows", "join_future_action", "join_nonfinite_impression"}
    assert full.count("trainer_kill9") >= 10 and set(full) == set(quick)
    # a trainer kill follows every poisoning: the next incarnation reads the rows from Redis, not its hot tier
    for schedule_ in (quick, full):
        after = [schedule_[i + 1] for i, kind in enumerate(schedule_) if kind == "poisoned_rows"]
        assert after and set(after) == {"trainer_kill9"}
