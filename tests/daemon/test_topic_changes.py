"""The trainer daemon while its topic is deleted and made again, on the real broker and Redis.

``/readyz`` answers 503 with the reason while the topic is gone (one log line
says so), 200 again once it is back; the recreated topic's samples are all
trained, and the group's committed offsets on it are its own ends, not the
positions reached on the old topic.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from kelp.config import KafkaSourceConfig
from kelp.consumers.produce import file_messages, produce
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker

from .conftest import CRITEO, CRITEO_ROWS, Running, base_config, on_kafka, wait_for

pytestmark = pytest.mark.integration

NEW_PARTITIONS = 4


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _offsets(broker: KafkaBroker, group: str, topic: str, partitions: int) -> tuple[list[int], list[int]]:
    """The group's committed offset per partition (0 where none) and each partition's end offset."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        return [consumer.committed(tp) or 0 for tp in tps], [ends[tp] for tp in tps]
    finally:
        consumer.close()


def test_trainer_is_unready_while_its_topic_is_gone_and_trains_the_recreated_one(
    tmp_path: Path,
    kafka_broker: KafkaBroker,
    criteo_topic: str,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    cfg = on_kafka(base_config(tmp_path), kafka_broker, criteo_topic, redis_url)
    assert isinstance(cfg.source, KafkaSourceConfig)
    cfg.source.metadata_max_age_ms = 1000
    daemon = TrainDaemon(cfg)
    running = Running(daemon)
    port = cfg.metrics.port
    try:
        wait_for(lambda: daemon.report.samples >= CRITEO_ROWS, 120, "the first topic trained")
        wait_for(lambda: _get(port, "/readyz")[0] == 200, 30, "the trainer to be ready")

        kafka_broker.delete_topic(criteo_topic)
        _, body = wait_for(
            lambda: (got := _get(port, "/readyz"))[0] == 503 and got, 30, "readiness to report the topic gone"
        )
        assert body == f"source topic missing from the cluster: {criteo_topic}\n"
        assert _get(port, "/healthz")[0] == 200  # not a restart: the topic comes back on its own

        kafka_broker.create_topic(criteo_topic, NEW_PARTITIONS)
        summary = produce(
            {"bootstrap_servers": kafka_broker.bootstrap},
            criteo_topic,
            file_messages(CRITEO, "criteo_tsv", 1),
            quiet=True,
        )
        assert summary.records == CRITEO_ROWS
        wait_for(lambda: daemon.report.samples >= 2 * CRITEO_ROWS, 120, "the recreated topic trained")
        wait_for(lambda: _get(port, "/readyz") == (200, "ready\n"), 30, "readiness to come back")
        committed, ends = wait_for(
            lambda: (
                (got := _offsets(kafka_broker, cfg.source.group_id, criteo_topic, NEW_PARTITIONS))[0]
                == got[1]
                and got
            ),
            30,
            "the new topic's ends committed",
        )
    finally:
        report = running.stop()
    assert report.samples >= 2 * CRITEO_ROWS  # every sample of both topics, at least once
    assert sum(ends) == CRITEO_ROWS and committed == ends
    gone = [r for r in caplog.records if "is gone from the cluster" in r.getMessage()]
    assert len(gone) == 1 and gone[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if "not found in cluster metadata" in r.getMessage()]
