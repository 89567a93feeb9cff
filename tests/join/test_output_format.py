"""A join never writes schema-v1 msgpack into a topic its config's trainer reads as JSON.

Such a trainer would dead-letter every labelled event as bad_payload and commit
past it: the labels would be lost. The config is refused instead, in one line,
by every path that loads it (``kelp config validate``, ``kelp join``).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from kelp.config import parse_config
from kelp.errors import ConfigError
from kelp.harness import KafkaBroker

from .helpers import T0, impression, join_config_dict, produce, write_config

TOPICS = {"imp": "requests", "clicks": "clicks", "out": "events", "dlq": "join-dlq"}
MAPPING = {"label_field": "clicked", "dense_fields": ["price"], "sparse_fields": ["user", "item"]}


def _json_trainer(doc: dict[str, Any], **source: Any) -> dict[str, Any]:
    """``doc`` with a JSON source: the trainer reads its topics as JSON objects."""
    doc["source"] = {**doc["source"], "format": "json", "json": MAPPING, **source}
    return doc


def _doc(**source: Any) -> dict[str, Any]:
    return _json_trainer(join_config_dict("127.0.0.1:9092", "redis://127.0.0.1:6379", TOPICS), **source)


def test_a_join_into_the_json_topic_its_trainer_reads_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(_doc(), origin="kelp.yaml")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("kelp.yaml: join.output_topic: 'events' (unset: source.topics[0]) is read")
    assert "(format json); kelp join writes schema-v1 msgpack" in message
    assert "source.topic_formats {<topic>: msgpack}" in message


def test_a_json_topic_named_in_topic_formats_or_read_by_a_decoder_is_refused_too() -> None:
    doc = _doc(format="msgpack", topics=["events", "raw"], topic_formats={"events": "json"})
    with pytest.raises(ConfigError, match=r"'events' .*read as json by source \(topic_formats json\)"):
        parse_config(doc, origin="kelp.yaml")
    doc = _doc(format="msgpack", decoder="json:loads")
    with pytest.raises(ConfigError, match=r"join.output_topic: 'events' .*read by source.decoder json:loads"):
        parse_config(doc, origin="kelp.yaml")


def test_a_msgpack_output_topic_listed_in_topic_formats_passes() -> None:
    doc = _doc(topics=["events", "events-joined"], topic_formats={"events-joined": "msgpack"})
    doc["join"]["output_topic"] = "events-joined"
    cfg = parse_config(doc, origin="kelp.yaml")
    assert cfg.join_output_topic == "events-joined"
    assert cfg.source.topic_format("events-joined") == "msgpack"  # type: ignore[union-attr]
    # A JSON trainer that runs no join is not refused for the join section's defaults.
    trainer_only = _doc()
    del trainer_only["join"]
    assert parse_config(trainer_only, origin="kelp.yaml").join_output_topic == "events"


def test_config_validate_for_join_refuses_it_with_exit_2(tmp_path: Path) -> None:
    path = write_config(tmp_path / "kelp.yaml", _doc())
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "config", "validate", str(path), "--for", "join"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "join.output_topic: 'events' (unset: source.topics[0]) is read as json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_kelp_join_refuses_it_at_start_reading_and_writing_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {k: f"join-fmt-{k}-{tag}" for k in ("imp", "clicks", "out", "dlq")}
    for name in topics.values():
        kafka_broker.create_topic(name)
    topics["group"] = f"join-fmt-{tag}"
    produce(kafka_broker.bootstrap, topics["imp"], [("r0", impression("r0", T0))])
    doc = _json_trainer(join_config_dict(kafka_broker.bootstrap, "redis://127.0.0.1:6379", topics))
    path = write_config(tmp_path / "kelp.yaml", doc)
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "join", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert f"join.output_topic: {topics['out']!r} (unset: source.topics[0]) is read as json" in result.stderr
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=topics["group"])
    try:
        out = TopicPartition(topics["out"], 0)
        assert consumer.end_offsets([out])[out] == 0  # nothing written
        assert consumer.committed(TopicPartition(topics["imp"], 0)) is None  # nothing read and committed
    finally:
        consumer.close()


def test_the_chart_carries_topic_formats_and_output_topic_into_the_config_map() -> None:
    helm = pytest.importorskip("helm_python")
    chart_dir = Path(__file__).resolve().parents[2] / "helm" / "kelp"
    config = {
        "features": {"label": {"name": "click"}, "dense": [{"name": "price"}], "sparse": [{"name": "user"}]},
        "source": {
            "kind": "kafka",
            "bootstrap_servers": ["kafka:9092"],
            "topics": ["clicks-raw", "kelp-joined"],
            "format": "json",
            # The list shorthand of the mapping, as a JSON shop writes it.
            "json": {"label_field": "clicked", "dense_fields": ["price"], "sparse_fields": ["user"]},
            "topic_formats": {"kelp-joined": "msgpack"},
        },
        "store": {"backend": "redis", "urls": ["redis://redis:6379"]},
        "join": {
            "output_topic": "kelp-joined",
            "actions": [{"topic": "clicks", "task": "click", "window_s": 60}],
        },
    }
    with helm.Chart.load(str(chart_dir)) as chart:
        rendered = chart.render({"config": config, "join": {"enabled": True}}, name="kelp", namespace="ml")
    text = next(t for name, t in rendered.items() if name.endswith("configmap.yaml"))
    kelp_yaml = next(d for d in yaml.safe_load_all(text) if d)["data"]["kelp.yaml"]
    cfg = parse_config(yaml.safe_load(kelp_yaml), origin="configmap")
    assert cfg.join_output_topic == "kelp-joined"
    assert cfg.source.topic_format("kelp-joined") == "msgpack"  # type: ignore[union-attr]
    assert cfg.source.topic_format("clicks-raw") == "json"  # type: ignore[union-attr]
