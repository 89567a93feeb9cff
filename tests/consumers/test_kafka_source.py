"""Kafka source against the real Tansu broker: exactly-once arrival, commits, poison pills, rebalances."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig, SparseFeature
from kelp.consumers import encode_columns, encode_sample, kafka_source
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness.topic_reader import read_topic

from .test_decode import BAD

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(sparse=[SparseFeature(name="a"), SparseFeature(name="b", max_ids=3, table="a")])
BATCHING = BatchingConfig(batch_size=64, max_batch_delay_ms=50, queue_depth=2)


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 1) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i, v in enumerate(values):
        producer.send(topic, v, partition=i % partitions)
    producer.flush()
    producer.close()


def samples(lo: int, hi: int) -> list[bytes]:
    """Single-sample messages whose id `a` is the sample number."""
    return [encode_sample(i % 2, sparse={"a": i}) for i in range(lo, hi)]


def columnar(lo: int, hi: int, per: int) -> list[bytes]:
    out = []
    for s in range(lo, hi, per):
        ids = np.arange(s, min(hi, s + per), dtype=np.uint64)
        out.append(encode_columns(ids % 2, sparse={"a": ids}))
    return out


def drain(src: KafkaSource, expect: int, commit: bool = True, timeout_s: float = 30.0) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expect and time.monotonic() < deadline:
        batch = src.poll(1.0)
        if batch is None:
            continue
        got += batch.sparse["a"].values.tolist()
        if commit:
            src.commit(batch, wait=True)
    return got


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int | None]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return [c.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        c.close()


def test_every_sample_once_commits_on_request_and_restart_resumes(
    kafka_broker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],  # type: ignore[no-untyped-def]
) -> None:
    kafka_broker.create_topic(unique_topic, 2)
    produce(kafka_broker.bootstrap, unique_topic, samples(0, 300) + columnar(300, 1300, 100), partitions=2)
    cfg = kafka_config()
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        got = drain(src, 700, commit=False)
        assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2) == [
            None,
            None,
        ]  # nothing durable yet
    finally:
        src.close()
    # Nothing was committed: a new member re-reads everything, and commits as it goes.
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        first = drain(src, 700)
    finally:
        src.close()
    assert sorted(got) == sorted(set(got)) and len(got) >= 700
    positions = committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2)
    assert all(p is not None for p in positions)
    # The restarted consumer resumes at the commit: the rest arrives, no gap, no repeat.
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        rest = drain(src, 1300 - len(first))
    finally:
        src.close()
    assert sorted(first + rest) == list(range(1300))
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 2) == [155, 155]


def test_poison_pills_go_to_dead_letter_with_reason(
    kafka_broker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],  # type: ignore[no-untyped-def]
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(max_message_bytes=10_000)
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    spec = FeatureSpec(
        dense=[{"name": "x"}, {"name": "y"}],
        sparse=[SparseFeature(name="a"), SparseFeature(name="b", max_ids=3)],
    )
    good = [encode_sample(1, {"x": 1.0}, {"a": i}) for i in range(40)]
    bad = sorted(BAD.items())
    stream: list[bytes] = []
    for i, g in enumerate(good):
        stream.append(g)
        if i < len(bad):
            stream.append(bad[i][1])
    produce(kafka_broker.bootstrap, unique_topic, stream)
    registry = CollectorRegistry()
    src = KafkaSource(cfg, spec, BATCHING, registry)
    try:
        got = drain(src, 40)
    finally:
        src.close()
    assert sorted(got) == list(range(40))
    for reason, _ in bad:
        assert registry.get_sample_value("kelp_records_rejected_total", {"reason": reason}) == 1
    records = read_topic(kafka_broker.bootstrap, cfg.dead_letter_topic)
    by_reason = {dict(r.headers)["reason"].decode(): r for r in records}
    assert set(by_reason) == {reason for reason, _ in bad}
    for reason, value in bad:
        headers = dict(by_reason[reason].headers)
        assert by_reason[reason].value == value
        assert headers["source_topic"].decode() == unique_topic
        assert stream[int(headers["source_offset"])] == value
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) == [len(stream)]


def test_commits_nobody_waits_for_land_without_further_reports(
    kafka_broker,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reports are gathered for up to 100 ms; the last ones must still be committed while running.

    The interval is stretched to 2 s here, so every report after the first arrives inside it
    and only a later pass of the poll loop, with nothing new reported, can commit them.
    """
    monkeypatch.setattr(kafka_source, "_COMMIT_INTERVAL_S", 2.0)
    kafka_broker.create_topic(unique_topic, 1)
    produce(kafka_broker.bootstrap, unique_topic, columnar(0, 2000, 100))
    cfg = kafka_config()
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 2000 and time.monotonic() < deadline:
            batch = src.poll(1.0)
            if batch is not None:
                got += batch.sparse["a"].values.tolist()
                src.commit(batch)  # nobody waits: gathered with the next reports
        assert sorted(got) == list(range(2000))
        deadline = time.monotonic() + 10
        while committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) != [20]:
            assert time.monotonic() < deadline, "durable offsets were never committed"
            time.sleep(0.2)
        assert src.committed_positions() == {(unique_topic, 0): 20}
    finally:
        src.close()
