"""Fixtures for consumer tests: Kafka configs with short group timeouts (Tansu joins are slow otherwise)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kelp.config.schema import KafkaConfig

DATA = Path(__file__).parent / "data"


@pytest.fixture
def kafka_config(tansu: Any, unique_topic: str) -> Callable[..., KafkaConfig]:
    """Factory of KafkaConfig for ``unique_topic`` on the session broker; kwargs override fields."""

    def make(**overrides: Any) -> KafkaConfig:
        fields: dict[str, Any] = {
            "bootstrap_servers": [tansu.bootstrap],
            "topics": [unique_topic],
            "group_id": f"g-{unique_topic}",
            "dead_letter_topic": f"{unique_topic}-dlq",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "max_poll_interval_ms": 5000,
        }
        fields.update(overrides)
        return KafkaConfig(**fields)

    return make
