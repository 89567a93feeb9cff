"""``kelp train`` on a topic of the wrong format stops with one line and exit 2, committing nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from kelp.harness import KafkaBroker

from .conftest import base_config, on_kafka, write_config

pytestmark = pytest.mark.integration


def test_kelp_train_on_a_json_topic_exits_2_with_one_line_and_commits_nothing(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topic = f"json-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for i in range(500):  # what a JSON producer writes for the Criteo features
        producer.send(topic, orjson.dumps({"label": i % 2, "I1": i, "C1": f"{i:08x}"}))
    producer.flush()
    producer.close()
    cfg = on_kafka(base_config(tmp_path), kafka_broker, topic, redis_url)
    config = write_config(cfg, tmp_path / "kelp.yaml")

    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("kelp: error:")]
    assert line.startswith(f"kelp: error: topic {topic} partition 0: "), line
    assert "records were rejected (bad_msgpack " in line
    assert "the rejected records look like JSON, not schema-v1 msgpack events" in line
    assert "Stopped without committing" in line

    consumer = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=cfg.source.group_id, enable_auto_commit=False
    )
    try:
        assert consumer.committed(TopicPartition(topic, 0)) is None
    finally:
        consumer.close()
