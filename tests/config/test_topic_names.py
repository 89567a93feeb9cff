"""Kafka topic names are checked with the config, not by the broker at the first rejected record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kelp.config import KafkaSourceConfig

ROOT = Path(__file__).resolve().parents[2]


def _source(**fields: object) -> KafkaSourceConfig:
    return KafkaSourceConfig(bootstrap_servers=["127.0.0.1:9092"], **{"topics": ["events"], **fields})


@pytest.mark.parametrize("name", ["events", "a", "clicks.v2", "dead_letter-1", "x" * 249, "..."])
def test_legal_names_pass(name: str) -> None:
    assert _source(topics=[name], dead_letter_topic=name).dead_letter_topic == name


@pytest.mark.parametrize("name", ["bad topic!", "", ".", "..", "x" * 250, "a/b", "ümlaut", "t:1"])
def test_an_illegal_dead_letter_topic_names_the_field_and_what_is_expected(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        _source(dead_letter_topic=name)
    (error,) = info.value.errors()
    assert error["loc"] == ("dead_letter_topic",)
    assert "expected a Kafka topic name: 1 to 249 of the characters a-z A-Z 0-9 . _ -" in error["msg"]


def test_an_illegal_topic_is_named_with_its_index() -> None:
    with pytest.raises(ValidationError) as info:
        _source(topics=["events", "bad topic!"])
    (error,) = info.value.errors()
    assert error["loc"] == ("topics",)
    assert "topics[1] 'bad topic!': expected a Kafka topic name" in error["msg"]


def test_no_dead_letter_topic_is_still_allowed() -> None:
    assert _source(dead_letter_topic=None).dead_letter_topic is None


def test_kelp_config_validate_fails_in_one_line_with_exit_2(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "criteo-synth.yaml").read_text())
    assert data["source"]["kind"] == "kafka"
    data["source"]["dead_letter_topic"] = "bad topic!"
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "config", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"kelp: error: {path}: source.dead_letter_topic: got 'bad topic!': expected a Kafka topic name: "
        "1 to 249 of the characters a-z A-Z 0-9 . _ -, and not '.' or '..'"
    ]
