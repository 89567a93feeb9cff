"""Fixtures for consumer tests: Kafka configs with short group timeouts (Tansu joins are slow otherwise)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kelp.config import KafkaSourceConfig
from kelp.errors import MissingBinaryError
from kelp.harness import TansuBroker

DATA = Path(__file__).parent / "data"


@pytest.fixture
def kafka_config(tansu: Any, unique_topic: str) -> Callable[..., KafkaSourceConfig]:
    """Factory of KafkaSourceConfig for ``unique_topic`` on the session broker; kwargs override fields."""

    def make(**overrides: Any) -> KafkaSourceConfig:
        fields: dict[str, Any] = {
            "bootstrap_servers": [tansu.bootstrap],
            "topics": [unique_topic],
            "group_id": f"g-{unique_topic}",
            "dead_letter_topic": f"{unique_topic}-dlq",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "max_poll_interval_ms": 5000,
            "incremental_fetch_sessions": False,  # see KafkaSourceConfig.incremental_fetch_sessions
        }
        fields.update(overrides)
        return KafkaSourceConfig(**fields)

    return make


def private_tansu() -> Iterator[TansuBroker]:
    """A broker of the test's own; modules use it as ``tansu = pytest.fixture(private_tansu, name="tansu")``.

    Tansu keeps broker-side incremental fetch-session state that a consumer which paused its
    partitions leaves in a bad state: a *later* consumer group on the same broker can then never
    receive one of its partitions. Tests that pause, and the group-membership test that is
    sensitive to it, each get a fresh broker so that state cannot leak between them.
    """
    try:
        broker = TansuBroker()
        broker.start()
    except MissingBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield broker
    broker.stop()
