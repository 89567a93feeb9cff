"""Fixtures for trainer-daemon tests: configs on the Criteo fixture, a produced topic, group offsets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer, TopicPartition

from kelp.config import FileSourceConfig, KafkaSourceConfig, KelpConfig, StoreConfig, load_config
from kelp.consumers.produce import file_messages, produce
from kelp.daemon.train import TrainDaemon, TrainReport
from kelp.harness import KafkaBroker, free_port

ROOT = Path(__file__).resolve().parents[2]
CRITEO = Path(__file__).parent / "data" / "criteo-2000.tsv"
CRITEO_ROWS = 2000
PARTITIONS = 2


@pytest.fixture
def kafka_broker(isolated_kafka_broker: KafkaBroker) -> KafkaBroker:
    """The trainer pauses partitions under back-pressure; on Tansu that state must not leak
    into later consumer groups, so there each test gets a broker of its own (tests/conftest.py)."""
    return isolated_kafka_broker


def base_config(tmp_path: Path, **trainer: Any) -> KelpConfig:
    """The shipped Criteo config on the 2000-row fixture, with checkpoints under ``tmp_path``."""
    cfg = load_config(ROOT / "examples" / "criteo-kaggle.yaml")
    assert isinstance(cfg.source, FileSourceConfig)
    cfg.source.path = CRITEO
    cfg.trainer.checkpoint_dir = tmp_path / "checkpoints"
    cfg.trainer.log_every_s = 1.0
    cfg.publisher.enabled = False
    cfg.metrics.port = free_port()
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    return cfg


def on_kafka(cfg: KelpConfig, broker: KafkaBroker, topic: str, redis_url: str) -> KelpConfig:
    """Move a config onto the production path: the topic on ``broker`` and a Redis store."""
    cfg.source = KafkaSourceConfig(
        bootstrap_servers=[broker.bootstrap],
        topics=[topic],
        group_id=f"trainer-{topic}",
        dead_letter_topic=None,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_interval_ms=5000,
        incremental_fetch_sessions=broker.fetch_sessions_work,
    )
    cfg.store = StoreConfig(
        backend="redis",
        urls=[redis_url],
        retry={"attempts": 2, "base_delay_s": 0.01, "max_delay_s": 0.05},
        socket_timeout_s=1.0,
        connect_timeout_s=1.0,
    )
    return cfg


def write_config(cfg: KelpConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return path


@pytest.fixture
def criteo_topic(kafka_broker: KafkaBroker) -> Iterator[str]:
    """The 2000-row fixture produced one sample per record over two partitions."""
    topic = f"criteo-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    summary = produce(
        {"bootstrap_servers": kafka_broker.bootstrap},
        topic,
        file_messages(CRITEO, "criteo_tsv", 1),
        quiet=True,
    )
    assert summary.records == CRITEO_ROWS
    yield topic


def group_offsets(broker: KafkaBroker, group: str, topic: str) -> list[int]:
    """The group's committed offset per partition (0 where nothing is committed)."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return [consumer.committed(TopicPartition(topic, p)) or 0 for p in range(PARTITIONS)]
    finally:
        consumer.close()


class Running:
    """A daemon's ``run()`` on a thread, with its report or its exception."""

    def __init__(self, daemon: TrainDaemon) -> None:
        self.daemon = daemon
        self.report: TrainReport | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.report = self.daemon.run()
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout_s: float = 60) -> TrainReport:
        self.daemon.request_stop("test")
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "daemon did not stop"
        if self.error is not None:
            raise self.error
        assert self.report is not None
        return self.report


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
