"""Fixtures for consumer tests: Kafka configs with short group timeouts (group joins are slow otherwise)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kelp.config import KafkaSourceConfig

DATA = Path(__file__).parent / "data"


@pytest.fixture
def kafka_config(kafka_broker: Any, unique_topic: str) -> Callable[..., KafkaSourceConfig]:
    """Factory of KafkaSourceConfig for ``unique_topic`` on the session broker; kwargs override fields."""

    def make(**overrides: Any) -> KafkaSourceConfig:
        fields: dict[str, Any] = {
            "bootstrap_servers": [kafka_broker.bootstrap],
            "topics": [unique_topic],
            "group_id": f"g-{unique_topic}",
            "dead_letter_topic": f"{unique_topic}-dlq",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "max_poll_interval_ms": 5000,
            "incremental_fetch_sessions": kafka_broker.fetch_sessions_work,
        }
        fields.update(overrides)
        return KafkaSourceConfig(**fields)

    return make
