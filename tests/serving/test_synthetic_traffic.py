"""Synthetic traffic stays out of the request log (real Redis, real Kafka, real HTTP and gRPC).

A request marked ``X-Kelp-Synthetic`` (``/v1``, ``/v2`` REST, gRPC metadata),
and ``kelp probe``'s score request, are scored as any other and never logged:
``kelp join`` would otherwise turn them into negatives. They are counted as
``result="synthetic"``. An unmarked request is logged, and the replica's own
warm-up never is: the one record on the topic is the unmarked request's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from prometheus_client import CollectorRegistry

from kelp.cli.commands import probe_cmd
from kelp.harness import KafkaBroker, free_port
from kelp.serving import ServingReplica

from .helpers import DEPLOYMENT, LiveServer, constant_model, publisher_for, small_config, wait_until
from .test_request_log import _logging_config, _records

pytestmark = pytest.mark.integration

SAMPLES = {"samples": [{"dense": {"I1": 1.0}, "sparse": {"C1": 3, "C3": "alice"}}]}
OIP = {"inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": [3]}]}


def _grpc_infer(port: int) -> None:
    """One gRPC inference marked synthetic in its metadata."""
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        ids = triton.InferInput("C1", [1], "INT64")
        ids.set_data_from_numpy(np.array([3], np.int64))
        result = client.infer(DEPLOYMENT, [ids], headers={"x-kelp-synthetic": "1"})
        assert "kelp_request_id" not in result.get_response(as_json=True).get("parameters", {})
    finally:
        client.close()


def test_marked_requests_and_the_probe_are_scored_but_never_logged(
    redis_url: str, tmp_path: Path, kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    kafka_broker.create_topic(unique_topic)
    grpc_port = free_port()
    cfg = _logging_config(redis_url, tmp_path, kafka_broker.bootstrap, unique_topic)
    cfg = cfg.model_copy(
        update={"serving": cfg.serving.model_copy(update={"host": "127.0.0.1", "grpc_port": grpc_port})}
    )
    config = tmp_path / "kelp.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    publisher = publisher_for(small_config(redis_url, tmp_path))
    publisher.maybe_publish(constant_model(cfg, 0.3), step=1, offsets={}, force=True)
    try:
        with (
            LiveServer(ServingReplica(cfg, CollectorRegistry())) as server,
            httpx.Client(base_url=server.url, timeout=60) as c,
        ):
            marked = c.post("/v1/score", json=SAMPLES, headers={"X-Kelp-Synthetic": "1"})
            oip = c.post(f"/v2/models/{DEPLOYMENT}/infer", json=OIP, headers={"X-Kelp-Synthetic": "true"})
            _grpc_infer(grpc_port)
            probe = argparse.Namespace(config=str(config), url=server.url, timeout=60.0)
            assert probe_cmd._probe(probe) == 0
            typo = c.post("/v1/score", json=SAMPLES, headers={"X-Kelp-Synthetic": "maybe"})
            real = c.post("/v1/score", json=SAMPLES)
            # The only request the log may hold comes last: had any before it been logged, it would be first.
            records = _records(kafka_broker.bootstrap, unique_topic, 1)
            counted = server.replica.registry.get_sample_value
            name = "kelp_serving_request_log_records_total"
            wait_until(lambda: counted(name, {"result": "sent"}) == 1, what="the real request acknowledged")
            assert counted(name, {"result": "synthetic"}) == 4  # /v1, /v2, gRPC and the probe
    finally:
        publisher.close()

    assert marked.status_code == 200 and marked.json()["scores"] == real.json()["scores"]
    assert "request_id" not in marked.json() and "kelp-request-id" not in marked.headers
    assert oip.status_code == 200 and "kelp_request_id" not in oip.json()["parameters"]
    assert typo.status_code == 422 and typo.json()["error"] == "bad_header"
    assert "X-Kelp-Synthetic" in typo.json()["detail"]
    assert [m.key.decode() for m in records] == [real.headers["kelp-request-id"]]
