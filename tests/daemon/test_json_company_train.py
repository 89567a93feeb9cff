"""A company's own JSON click events train through the trainer with no decoder written by the user:
boolean labels, ISO-8601 times, numbers sent as strings, string ids and nested objects, read by the
mapping's declared casts; the rows land under the string ids a user then inspects as typed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from consumers.test_json_company_topic import MAPPING, click  # tests/ is on sys.path: its packages
from kafka import KafkaProducer

from kelp.cli.main import main as kelp_main
from kelp.config import FeatureSpec, KafkaSourceConfig
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker

from .conftest import Running, base_config, on_kafka, wait_for, write_config

pytestmark = pytest.mark.integration


EVENTS = 400


def test_company_json_events_train_and_their_string_ids_are_inspectable(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"company-{tmp_path.name}"
    kafka_broker.create_topic(topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    for i in range(EVENTS):
        producer.send(topic, click(i))
    producer.flush()
    producer.close()

    cfg = on_kafka(base_config(tmp_path), kafka_broker, topic, redis_url)
    cfg.deployment = f"company{abs(hash(tmp_path.name)) % 10**6}"
    cfg.features = FeatureSpec(
        dense=[{"name": "price"}, {"name": "mobile"}],
        sparse=[{"name": "user"}, {"name": "page", "max_ids": 4}],
    )
    assert isinstance(cfg.source, KafkaSourceConfig)
    source = {**cfg.source.model_dump(mode="json", by_alias=True), "format": "json", "json": MAPPING}
    cfg = type(cfg).model_validate({**cfg.model_dump(mode="json", by_alias=True), "source": source})
    cfg.batching.batch_size = 64
    cfg.batching.max_batch_delay_ms = 50

    trained = [0]

    def on_step(_step: int, batch: Any, _result: Any) -> None:
        trained[0] += batch.size

    daemon = TrainDaemon(cfg, on_step=on_step)
    running = Running(daemon)
    try:
        wait_for(lambda: trained[0] >= EVENTS, 120, "every event trained")
    finally:
        report = running.stop()
    assert report.samples == EVENTS
    for reason in ("bad_type", "bad_label", "bad_payload", "bad_json"):
        assert daemon.registry.get_sample_value(
            "kelp_consumer_rejected_records_total", {"topic": topic, "reason": reason}
        ) in (None, 0.0)

    config = write_config(cfg, tmp_path / "kelp.yaml")
    capsys.readouterr()
    assert kelp_main(["store", "inspect", "--config", str(config), "user", "3f2c-0", "3f2c-1", "nobody"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [line["given"] for line in lines] == ["3f2c-0", "3f2c-1", "nobody"]
    assert lines[0]["stored"] and lines[1]["stored"] and not lines[2]["stored"]
