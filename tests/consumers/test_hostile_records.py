"""Hostile records on the real broker: one too big for the dead-letter producer, a dead-letter topic
that refuses, a topic of the wrong format, and a few bad records among good ones."""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson
import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig
from kelp.consumers.errors import SourceUserError
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness.topic_reader import read_topic

from .test_kafka_source import BATCHING, SPEC, committed, drain, samples

pytestmark = pytest.mark.integration

HUGE = 16_000_000


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """One partition, in order; the producer takes records up to 20 MB (the broker allows 32 MiB)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_request_size=20_000_000)
    for v in values:
        producer.send(topic, v, partition=0)
    producer.flush()
    producer.close()


def dead_letters(bootstrap: str, topic: str) -> list[object]:
    return read_topic(bootstrap, topic)


def test_a_record_too_big_for_the_dead_letter_producer_is_sent_truncated_and_the_source_goes_on(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config()
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    huge = bytes(range(256)) * (HUGE // 256)
    assert len(huge) == HUGE
    produce(kafka_broker.bootstrap, unique_topic, [*samples(0, 10), huge, *samples(10, 50)])
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        got = drain(src, 50)
    finally:
        src.close()
    assert sorted(got) == list(range(50))  # the records after the huge one were trained
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) == [51]

    (record,) = dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic)
    headers = {k: v.decode() for k, v in record.headers}
    assert headers["reason"] == "oversize" and headers["source_offset"] == "10"
    assert headers["truncated"] == "true" and headers["original_size"] == str(HUGE)
    # As much as fits the producer's limit, and exactly the record's first bytes.
    assert cfg.max_message_bytes < len(record.value) < HUGE
    assert record.value == huge[: len(record.value)]
    assert registry.get_sample_value("kelp_consumer_dead_letter_truncated_total") == 1
    dropped = registry.get_sample_value("kelp_consumer_dead_letter_dropped_bytes_total")
    assert dropped == HUGE - len(record.value)
    assert registry.get_sample_value("kelp_consumer_dead_letters_total", {"result": "ok"}) == 1
    assert registry.get_sample_value("kelp_records_rejected_total", {"reason": "oversize"}) == 1


def test_a_dead_letter_send_the_broker_refuses_is_counted_and_logged_not_fatal(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(max_message_bytes=1000)
    # Within the producer's limit, above the dead-letter topic's: only the broker can refuse it.
    kafka_broker.create_topic(cfg.dead_letter_topic, 1, config={"max.message.bytes": "2048"})
    big = b"\x00" * 5000
    produce(kafka_broker.bootstrap, unique_topic, [*samples(0, 10), big, *samples(10, 30)])
    registry = CollectorRegistry()
    with caplog.at_level(logging.ERROR, logger="kelp.consumers.deadletter"):
        src = KafkaSource(cfg, SPEC, BATCHING, registry)
        try:
            got = drain(src, 30)
        finally:
            src.close()
    assert sorted(got) == list(range(30))
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) == [31]
    assert registry.get_sample_value("kelp_consumer_dead_letters_total", {"result": "failed"}) == 1
    assert registry.get_sample_value("kelp_consumer_dead_letters_total", {"result": "ok"}) is None
    (line,) = [r for r in caplog.records if r.getMessage().startswith("dead-letter send failed")]
    assert line.reason == "oversize" and line.source == f"{unique_topic}:0:10"
    assert "MessageSizeTooLarge" in line.error
    assert dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic) == []


def test_a_topic_of_json_records_stops_the_source_before_anything_is_committed(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config()
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    produce(
        kafka_broker.bootstrap,
        unique_topic,
        [orjson.dumps({"label": i % 2, "user": f"u{i}", "item": i * 7}) for i in range(300)],
    )
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        with pytest.raises(SourceUserError) as info:
            drain(src, 1)
    finally:
        src.close()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"topic {unique_topic} partition 0: ")
    assert "records were rejected (bad_msgpack " in message
    assert "the rejected records look like JSON, not schema-v1 msgpack events" in message
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) == [None]
    assert dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic) == []  # nothing dead-lettered either


def test_a_few_bad_records_among_good_ones_still_train(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A quarter of the records rejected is a bad producer, not the wrong topic: dead-letter and go on."""
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config()
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    stream: list[bytes] = []
    for i, value in enumerate(samples(0, 300)):
        stream.append(value)
        if i % 3 == 0:
            stream.append(orjson.dumps({"label": 1, "user": f"u{i}"}))
    produce(kafka_broker.bootstrap, unique_topic, stream)
    registry = CollectorRegistry()
    with caplog.at_level(logging.WARNING, logger="kelp.consumers.deadletter"):
        src = KafkaSource(cfg, SPEC, BATCHING, registry)
        try:
            got = drain(src, 300)
        finally:
            src.close()
    assert sorted(got) == list(range(300))
    # The Kafka sink logs rejections as they come too: the first few at once, not one line per record.
    lines = [r for r in caplog.records if r.getMessage() == "rejected record"]
    bad_offsets = [i for i, v in enumerate(stream) if v.startswith(b"{")]
    assert [r.source for r in lines[:5]] == [f"{unique_topic}:0:{o}" for o in bad_offsets[:5]]
    assert len(lines) < 100
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) == [400]
    assert len(dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic)) == 100
    assert (
        registry.get_sample_value(
            "kelp_consumer_rejected_records_total", {"topic": unique_topic, "reason": "bad_msgpack"}
        )
        == 100
    )
    assert registry.get_sample_value("kelp_consumer_records_total", {"topic": unique_topic}) == 400


def test_a_small_transactional_topic_is_not_held_back_by_the_check(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    """Fewer records than the check's sample, ending in a commit marker no consumer ever sees:
    the partition is caught up at its position, not at its last record, so nothing waits forever."""
    kafka_broker.create_topic(unique_topic, 1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, transactional_id=f"tx-{unique_topic}")
    producer.init_transactions()
    producer.begin_transaction()
    for value in samples(0, 20):
        producer.send(unique_topic, value, partition=0)
    producer.commit_transaction()
    producer.close()
    cfg = kafka_config()
    assert cfg.initial_check_records > 20
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        got = drain(src, 20)
    finally:
        src.close()
    assert sorted(got) == list(range(20))
    assert committed(kafka_broker.bootstrap, cfg.group_id, unique_topic, 1) == [20]
