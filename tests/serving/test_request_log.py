"""The request log on a real Kafka broker: records on the topic, and scoring untouched with Kafka down.

A replica with ``serving.request_log`` on scores through ``/v1`` and ``/v2``;
each record on the topic is read back and compared with the response it
belongs to: the id, the version, every score, the features as sent. Each
request is logged under an id of its own, even when a client reuses its
``X-Request-Id`` (kept in the record as ``request.client_id``). Then a replica starts
while its broker is stopped: it scores every request, keeps ``queue_requests``
records, counts the rest as dropped, and sends the kept ones once the broker
is back. With no broker to send to, or a broker lost after the log connected,
large requests fill ``queue_bytes``, never more.
"""

from __future__ import annotations

import subprocess
import sys
import time
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

from kelp.config import KafkaSourceConfig, KelpConfig, parse_config
from kelp.consumers.ids import str_id
from kelp.harness import KafkaBroker, free_port, make_broker
from kelp.serving import ScoreResult, ServingMetrics, ServingReplica
from kelp.serving.features import RequestParser
from kelp.serving.request_log import RequestLog

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
        # A client that reuses its id (a retry, a constant header): a second impression, not a duplicate.
        again = c.post("/v1/score", json={"samples": SAMPLES[:1]}, headers={"X-Request-Id": "req-1"})
        answers = [first, second, third, again]
        logged = [r.headers["kelp-request-id"] for r in answers]
        assert len(set(logged)) == 4, logged  # one id per request, whatever the client sent
        for response in (first, second, again):
            assert response.json()["request_id"] == response.headers["kelp-request-id"]
        assert "req-1" not in logged and "oip-7" not in logged
        # The Open Inference Protocol echoes the client's id; the logged one is a parameter and the header.
        assert third.json()["id"] == "oip-7"
        assert third.json()["parameters"]["kelp_request_id"] == third.headers["kelp-request-id"]

        records = _records(kafka_broker.bootstrap, unique_topic, 4)
        registry = server.replica.registry
        wait_until(
            lambda: (
                registry.get_sample_value("kelp_serving_request_log_records_total", {"result": "sent"}) == 4
            ),
            what="four acknowledged records",
        )

    by_id = {}
    client_ids = {}
    for message in records:
        headers = dict(message.headers)
        assert headers["schema"] == b"kelp-request-v1"
        body = msgpack.unpackb(message.value, raw=False)
        assert message.key.decode() == body["request"]["id"]
        by_id[body["request"]["id"]] = body
        client_ids[body["request"]["id"]] = body["request"].get("client_id")
    assert set(by_id) == set(logged)
    # The client's own id, when it is a usable one, travels beside the logged id.
    assert [client_ids[i] for i in logged] == ["req-1", None, "oip-7", "req-1"]

    record = by_id[logged[0]]
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

    oip = by_id[logged[2]]
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
            assert counted("kelp_serving_request_log_dropped_total", {"reason": "queue_requests"}) == 6
            assert counted("kelp_serving_request_log_queue") == 4

            broker.restart()
            kept = _records(broker.bootstrap, "served", 4)
            assert [m.key.decode() for m in kept] == [r.json()["request_id"] for r in scores[:4]]
        _lost_after_start_is_bounded_too(redis_url, tmp_path, broker)
    finally:
        broker.cleanup()


BOUND = 1024 * 1024  # the smallest queue_bytes allowed
LARGE = 1024  # candidates in one request: a record of about 64 KB with small_config's features
RECORDS = 64  # about four times BOUND


def _large_log(redis_url: str, tmp_path: Path, bootstrap: str) -> tuple[RequestLog, CollectorRegistry, Any]:
    """A request log bounded by :data:`BOUND` bytes (and 10,000 records), and a request of :data:`LARGE`
    candidates with its scores, to record as often as a test likes."""
    cfg = _logging_config(redis_url, tmp_path, bootstrap, "served", queue_bytes=BOUND)
    serving = cfg.serving.model_copy(update={"max_samples_per_request": LARGE})
    cfg = cfg.model_copy(update={"serving": serving})
    assert isinstance(cfg.source, KafkaSourceConfig)
    candidates = [{"sparse": {"C2": [i, i + 1, i + 2], "C3": f"item-{i}"}} for i in range(LARGE)]
    batch = RequestParser(cfg.features, cfg.serving).candidates(
        {"user": {"dense": {"I1": 1.0}, "sparse": {"C1": 3}}, "candidates": candidates}
    )
    scored = (batch, ScoreResult([0.5] * LARGE, 1, 0.0, 0.0, None, None, 0.0))
    registry = CollectorRegistry()
    request_log = RequestLog(cfg.serving.request_log, cfg.source, ("label",), ServingMetrics(registry))
    return request_log, registry, scored


def _fill_past_the_bound(
    request_log: RequestLog, registry: CollectorRegistry, scored: Any, pace_s: float = 0.0
) -> None:
    """:data:`RECORDS` large records (four times :data:`BOUND`): the bytes held never pass it, the rest is
    counted."""
    counted = registry.get_sample_value
    dropped_before = counted("kelp_serving_request_log_records_total", {"result": "dropped"})
    for i in range(RECORDS):
        request_log.record(f"r{i}", *scored)
        assert counted("kelp_serving_request_log_queue_bytes") <= BOUND
        time.sleep(pace_s)
    dropped = counted("kelp_serving_request_log_dropped_total", {"reason": "queue_bytes"})
    assert dropped >= 1
    all_dropped = counted("kelp_serving_request_log_records_total", {"result": "dropped"})
    assert all_dropped - dropped_before == dropped
    held = counted("kelp_serving_request_log_queue")
    assert held >= 1
    # What is held is the encoded records, each counted by its size: the bound is filled, not passed.
    record_bytes = counted("kelp_serving_request_log_queue_bytes") / held
    assert BOUND - record_bytes < held * record_bytes <= BOUND


def test_with_no_broker_the_queue_holds_at_most_queue_bytes_and_counts_the_rest(
    redis_url: str, tmp_path: Path
) -> None:
    closed = f"127.0.0.1:{free_port()}"  # nothing listens: no record can leave
    request_log, registry, scored = _large_log(redis_url, tmp_path, closed)
    try:
        _fill_past_the_bound(request_log, registry, scored)
        counted = registry.get_sample_value
        dropped = counted("kelp_serving_request_log_records_total", {"result": "dropped"})
        assert counted("kelp_serving_request_log_queue") + dropped == RECORDS
    finally:
        request_log.close()


def _lost_after_start_is_bounded_too(redis_url: str, tmp_path: Path, broker: KafkaBroker) -> None:
    """A broker lost once the log has sent: the producer's own batches count against ``queue_bytes``
    (kafka-python holds them for minutes with no byte bound of its own)."""
    request_log, registry, scored = _large_log(redis_url, tmp_path, broker.bootstrap)
    try:
        request_log.record("first", *scored)
        sent = lambda: registry.get_sample_value(  # noqa: E731
            "kelp_serving_request_log_records_total", {"result": "sent"}
        )
        wait_until(lambda: sent() == 1, timeout_s=60, what="the first record acknowledged")
        broker.stop()
        # Paced, so the sender hands each record to the producer before the next comes: the
        # producer's batches, not the queue, are what fills the bound.
        _fill_past_the_bound(request_log, registry, scored, pace_s=0.01)
    finally:
        request_log.close()


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


def test_a_record_that_cannot_be_encoded_is_counted_failed_and_never_raises(
    redis_url: str, tmp_path: Path
) -> None:
    """The request was answered before its record is made: a record that cannot be encoded (here the
    log expects a task the scores lack) is counted as failed, and ``record`` returns as usual."""
    closed = f"127.0.0.1:{free_port()}"
    request_log, registry, (batch, result) = _large_log(redis_url, tmp_path, closed)
    request_log.tasks = ("label", "not_scored")
    try:
        request_log.record("unencodable", batch, result)
        counted = registry.get_sample_value
        assert counted("kelp_serving_request_log_records_total", {"result": "failed"}) == 1
        assert counted("kelp_serving_request_log_queue") == 0
    finally:
        request_log.close()
