"""Proof that the harness runs the real services, not stand-ins."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from kelp.harness import KafkaBroker, RedisCluster, RedisServer

pytestmark = pytest.mark.integration


def test_standalone_redis_set_get(redis_url: str, redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("kelp:smoke", b"\x00\x01binary")
    assert client.get("kelp:smoke") == b"\x00\x01binary"
    info = client.info("server")
    assert info["redis_version"]  # a real server reports its version
    assert info["tcp_port"] == redis_server.port


def test_cluster_spreads_keys_over_all_three_nodes(clean_redis_cluster: RedisCluster) -> None:
    client = clean_redis_cluster.client()
    keys = [f"kelp:smoke:{i}" for i in range(300)]
    for key in keys:
        client.set(key, key)
    assert [client.get(k).decode() for k in keys] == keys
    per_node = [s.client().dbsize() for s in clean_redis_cluster.servers]
    assert len(per_node) == 3
    assert all(n > 0 for n in per_node), per_node
    assert sum(per_node) == len(keys)
    info = clean_redis_cluster.servers[0].client().execute_command("CLUSTER", "INFO").decode()
    assert "cluster_state:ok" in info
    assert "cluster_known_nodes:3" in info


def test_tansu_consumer_group_with_offset_commit(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    kafka_broker.create_topic(unique_topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    sent = [f"m{i}".encode() for i in range(20)]
    for i, value in enumerate(sent):
        producer.send(unique_topic, value=value, partition=i % 2)
    producer.flush()
    producer.close()

    group = f"g-{unique_topic}"
    consumer = _consumer(kafka_broker, unique_topic, group)
    received = _drain(consumer, len(sent))
    assert sorted(m.value for m in received) == sorted(sent)
    consumer.commit()
    partitions = [TopicPartition(unique_topic, p) for p in (0, 1)]
    committed = {tp.partition: consumer.committed(tp) for tp in partitions}
    consumer.close()
    assert committed == {0: 10, 1: 10}

    # A new member of the same group resumes after the committed offsets: nothing left.
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    producer.send(unique_topic, value=b"after-commit", partition=0)
    producer.flush()
    producer.close()
    consumer = _consumer(kafka_broker, unique_topic, group)
    again = _drain(consumer, 1)
    consumer.close()
    assert [m.value for m in again] == [b"after-commit"]


def _consumer(kafka_broker: KafkaBroker, topic: str, group: str) -> KafkaConsumer:
    return KafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_interval_ms=5000,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )


def _drain(consumer: KafkaConsumer, expected: int, timeout_s: float = 30.0) -> list:
    received = []
    deadline = time.monotonic() + timeout_s
    while len(received) < expected and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            received.extend(records)
    return received
