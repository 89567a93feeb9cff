"""``source.start_from``, ``group_instance_id`` and ``partition_assignment``: checks and what they become.

The behaviour on a broker is in tests/consumers/test_rebalance.py; these pin the config side.
"""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor

from kelp.cli.main import main
from kelp.config import KafkaSourceConfig, parse_config
from kelp.consumers.kafka_client import consumer_settings
from kelp.errors import ConfigError

BASE = {"kind": "kafka", "bootstrap_servers": "b:9092", "topics": "events"}


def source(**fields: object) -> KafkaSourceConfig:
    return KafkaSourceConfig.model_validate({**BASE, **fields})


@pytest.mark.parametrize(
    ("given", "expected_ms"),
    [
        ("committed", None),
        ("earliest", None),
        ("latest", None),
        ("2024-05-01T00:00:00Z", 1_714_521_600_000),
        ("2024-05-01T02:00:00+02:00", 1_714_521_600_000),
        ("1714521600000", 1_714_521_600_000),
        (1_714_521_600_000, 1_714_521_600_000),  # a YAML integer
        (0, 0),
    ],
)
def test_start_from_accepts_the_keywords_and_times(given: object, expected_ms: int | None) -> None:
    cfg = source(start_from=given)
    assert cfg.start_timestamp_ms == expected_ms
    assert cfg.start_from == str(given)


@pytest.mark.parametrize(
    "given",
    ["yesterday", "", "2024-05-01T00:00:00", "2024-05-01", "-5", "1.5e12", True, "1969-12-31T00:00:00Z"],
)
def test_start_from_refusals_name_the_field_and_what_was_expected(given: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"source": {**BASE, "start_from": given}}, "kelp.yaml")
    assert str(caught.value) == (
        f"kelp.yaml: source.start_from: got {given!r}: expected committed, earliest, latest, "
        "an ISO-8601 time with a zone, or epoch milliseconds"
    )


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("", "non-empty"),
        ("..", "non-empty id other than '.' or '..'"),
        ("pod 0", "letters, digits, '.', '_' and '-' only"),
        ("trainer/0", "letters, digits"),
        ("x" * 250, "at most 249 characters"),
    ],
)
def test_group_instance_id_must_be_an_id_the_broker_accepts(given: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"source": BASE}, "kelp.yaml", {"KELP_SOURCE__GROUP_INSTANCE_ID": given})
    message = str(caught.value)
    assert message.startswith("kelp.yaml: source.group_instance_id: got ")
    assert "(from env KELP_SOURCE__GROUP_INSTANCE_ID)" in message and reason in message


def test_each_rank_of_a_group_gets_its_own_instance_id() -> None:
    cfg = source(group_instance_id="kelp-trainer-1")
    assert cfg.for_rank(0, 1) is cfg  # alone: the id as given
    assert [cfg.for_rank(r, 3).group_instance_id for r in range(3)] == [
        "kelp-trainer-1-0",
        "kelp-trainer-1-1",
        "kelp-trainer-1-2",
    ]
    assert cfg.group_instance_id == "kelp-trainer-1"  # the shared config is not changed
    dynamic = source()
    assert dynamic.for_rank(2, 3) is dynamic
    with pytest.raises(ValueError, match=r"source\.group_instance_id: rank 10's id .*at most 249"):
        source(group_instance_id="x" * 248).for_rank(10, 12)


def test_settings_reach_kafka_python() -> None:
    default = consumer_settings(source())
    assert default["partition_assignment_strategy"] == (CooperativeStickyAssignor,)
    assert "group_instance_id" not in default  # dynamic membership unless asked
    static = consumer_settings(source(group_instance_id="pod-0", partition_assignment="range"))
    assert static["group_instance_id"] == "pod-0"
    assert static["partition_assignment_strategy"] == (RangePartitionAssignor,)
    assert not set(static) - set(KafkaConsumer.DEFAULT_CONFIG)
    for name in ("cooperative-sticky", "sticky", "range", "roundrobin"):
        (assignor,) = consumer_settings(source(partition_assignment=name))["partition_assignment_strategy"]
        assert assignor.name == name


def test_partition_assignment_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"source\.partition_assignment: got 'cooperative': expected "):
        parse_config({"source": {**BASE, "partition_assignment": "cooperative"}}, "kelp.yaml")


def test_train_start_from_flag_is_checked_like_the_field(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "kelp.yaml"
    config.write_text(
        "source: {kind: kafka, bootstrap_servers: [127.0.0.1:9], topics: [t]}\n"
        "features: {sparse: [{name: a}]}\npublisher: {channel: filesystem, path: snapshots}\n",
        encoding="utf-8",
    )
    status = main(["train", "--config", str(config), "--start-from", "yesterday"])
    assert status == 2
    assert "--start-from: got 'yesterday': expected committed, earliest, latest" in capsys.readouterr().err
