"""The request log on a real Kafka broker: records on the topic, and scoring untouched with Kafka down.

A replica with ``serving.request_log`` on scores through ``/v1`` and ``/v2``;
each record on the topic is read back and compared with the response it
belongs to: the id, the version, every score, the features as sent. Then a
replica starts while its broker is stopped: it scores every request, keeps
``queue_requests`` records, counts the rest as dropped, and sends the kept ones
once the broker is back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
import yaml
from kafka import KafkaConsumer
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig, parse_config
from kelp.consumers.ids import str_id
from kelp.harness import KafkaBroker, make_broker
from kelp.serving import ServingReplica

from .helpers import DEPLOYMENT, LiveServer, constant_model, publisher_for, small_config, wait_until

pytestmark = pytest.mark.integration

SAMPLES = [
    {"dense": {"I1": 1.0, "I2": 2.0}, "sparse": {"C1": 3, "C2": [7, 8], "C3": "alice"}},
    {"dense": {"I1": 5.0}, "sparse": {"C1": 4}},
]


def _logging_config(
    redis_url: str, tmp_path: Path, bootstrap: str, topic: str, **request_log: Any
) -> KelpConfig:
    base = small_config(redis_url, tmp_path).model_dump(mode="json", exclude_none=True)
    base["source"] = {"kind": "kafka", "bootstrap_servers": [bootstrap], "topics": ["events"]}
    base["serving"]["request_log"] = {"enabled": True, "topic": topic, "linger_ms": 5, **request_log}
    return parse_config(base, origin="test")


def _records(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=20_000
    )
    try:
        found = []
        for message in consumer:
            found.append(message)
            if len(found) == count:
                break
        return found
    finally:
        consumer.close()


@pytest.fixture
def published(redis_url: str, tmp_path: Path) -> Iterator[None]:
    cfg = small_config(redis_url, tmp_path)
    publisher = publisher_for(cfg)
    publisher.maybe_publish(constant_model(cfg, 0.3), step=1, offsets={}, force=True)
    yield
    publisher.close()


def test_each_scored_request_reaches_the_topic_as_scored(
    published: None, redis_url: str, tmp_path: Path, kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    kafka_broker.create_topic(unique_topic)
    cfg = _logging_config(redis_url, tmp_path, kafka_broker.bootstrap, unique_topic)
    with (
        LiveServer(ServingReplica(cfg, CollectorRegistry())) as server,
        httpx.Client(base_url=server.url) as c,
    ):
        first = c.post("/v1/score", json={"samples": SAMPLES}, headers={"X-Request-Id": "req-1"})
        second = c.post(
            "/v1/score", json={"samples": SAMPLES[:1]}, headers={"X-Request-Id": "bad id with spaces"}
        )
        third = c.post(
            f"/v2/models/{DEPLOYMENT}/infer",
            json={"id": "oip-7", "inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": [4]}]},
        )
        answers = {"req-1": first, second.headers["kelp-request-id"]: second, "oip-7": third}
        assert first.json()["request_id"] == "req-1" and first.headers["kelp-request-id"] == "req-1"
        assert second.json()["request_id"] != "bad id with spaces"  # not a usable id: a new one
        assert third.json()["id"] == "oip-7"

        records = _records(kafka_broker.bootstrap, unique_topic, 3)
        registry = server.replica.registry
        wait_until(
            lambda: (
                registry.get_sample_value("kelp_serving_request_log_records_total", {"result": "sent"}) == 3
            ),
            what="three acknowledged records",
        )

    by_id = {}
    for message in records:
        assert dict(message.headers)["schema"] == b"kelp-request-v1"
        body = msgpack.unpackb(message.value, raw=False)
        assert message.key.decode() == body["request"]["id"]
        by_id[body["request"]["id"]] = body
    assert set(by_id) == set(answers)

    record = by_id["req-1"]
    assert record["v"] == 1 and record["batch"] == 2 and "label" not in record
    assert record["request"]["model_version"] == first.json()["model_version"]
    scores = np.frombuffer(record["request"]["scores"]["label"], "<f4")
    np.testing.assert_array_equal(scores, np.array(first.json()["scores"], np.float32))
    dense = np.frombuffer(record["dense"], "<f4").reshape(2, 2)
    np.testing.assert_array_equal(dense, [[1.0, 2.0], [5.0, 1.5]])  # as sent, I2's default filled in
    c2 = record["sparse"]["C2"]
    assert np.frombuffer(c2["values"], "<u8").tolist() == [7, 8]
    assert np.frombuffer(c2["lengths"], "<i4").tolist() == [2, 0]
    assert np.frombuffer(record["sparse"]["C3"]["values"], "<u8").tolist() == [str_id("alice")]

    oip = by_id["oip-7"]
    assert np.frombuffer(oip["sparse"]["C1"]["values"], "<u8").tolist() == [4]
    np.testing.assert_array_equal(
        np.frombuffer(oip["request"]["scores"]["label"], "<f4"),
        np.array(third.json()["outputs"][0]["data"], np.float32),
    )


def test_scoring_goes_on_with_the_broker_down_and_the_queue_is_sent_when_it_returns(
    published: None, redis_url: str, tmp_path: Path
) -> None:
    broker = make_broker()
    broker.start()
    try:
        broker.create_topic("served")
        broker.stop()
        cfg = _logging_config(redis_url, tmp_path, broker.bootstrap, "served", queue_requests=4)
        replica = ServingReplica(cfg, CollectorRegistry())
        with LiveServer(replica) as server, httpx.Client(base_url=server.url) as client:
            scores = [client.post("/v1/score", json={"samples": SAMPLES}) for _ in range(10)]
            assert all(r.status_code == 200 for r in scores)
            assert len({tuple(r.json()["scores"]) for r in scores}) == 1  # the same answer every time
            counted = replica.registry.get_sample_value
            assert counted("kelp_serving_request_log_records_total", {"result": "dropped"}) == 6
            assert counted("kelp_serving_request_log_queue") == 4

            broker.restart()
            kept = _records(broker.bootstrap, "served", 4)
            assert [m.key.decode() for m in kept] == [r.json()["request_id"] for r in scores[:4]]
    finally:
        broker.cleanup()


def test_serving_validates_without_kafka_secrets_unless_it_logs(tmp_path: Path) -> None:
    sasl = {
        "kind": "kafka",
        "bootstrap_servers": ["b:9093"],
        "topics": ["events"],
        "security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "kelp"},
    }
    config = {
        "deployment": "svc",
        "source": sasl,
        "features": {
            "dense": [{"name": "I1"}],
            "sparse": [{"name": "C1"}],
            "tables": [{"name": "C1", "dim": 4}],
        },
        "publisher": {"channel": "filesystem", "path": str(tmp_path / "snap")},
    }

    def validate(role: str, cfg: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "kelp.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return subprocess.run(
            [sys.executable, "-m", "kelp.cli", "config", "validate", str(path), "--for", role],
            capture_output=True,
            text=True,
            check=False,
        )

    assert validate("serve", config).returncode == 0
    refused = validate("train", config)
    assert refused.returncode == 2 and "source.security: sasl_mechanism SCRAM-SHA-512 needs" in refused.stderr
    logging_on = {**config, "serving": {"request_log": {"enabled": True}}}
    refused = validate("serve", logging_on)
    assert refused.returncode == 2 and "source.security" in refused.stderr
