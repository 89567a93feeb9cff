"""The Open Inference Protocol over gRPC, spoken by Triton's own gRPC client, against ``/v1`` floats.

The replica serves HTTP and ``serving.grpc_port`` together (real uvicorn, real
gRPC server, real Redis); ``tritonclient.grpc`` reads its health and metadata
and scores the rows ``/v1/score`` scores, with the same model, to the last float.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from kelp.consumers.ids import str_id
from kelp.harness import free_port
from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer import build_model

from .helpers import DEPLOYMENT, LiveServer, publisher_for, small_config

pytestmark = pytest.mark.integration

SAMPLES = [
    {"dense": {"I1": 1.0, "I2": 2.0}, "sparse": {"C1": 3, "C2": [7, 8], "C3": "alice"}},
    {"dense": {"I1": 0.0, "I2": -1.0}, "sparse": {"C1": 4, "C2": [], "C3": "11"}},
]


@pytest.fixture
def served(
    redis_url: str, tmp_path: Path
) -> Iterator[tuple[triton.InferenceServerClient, httpx.Client, int]]:
    grpc_port = free_port()
    cfg = small_config(redis_url, tmp_path, serving={"host": "127.0.0.1", "grpc_port": grpc_port})
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store:
        for table, ids in (("ads", [3, 4, 7, 8]), ("C3", [11, str_id("alice")])):
            rows = rng.normal(size=(len(ids), 4)).astype(np.float32)
            store.push(table, np.array(ids, np.uint64), rows, np.zeros(len(ids), np.float32))
    publisher = publisher_for(cfg)
    version = publisher.maybe_publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True)
    with (
        LiveServer(ServingReplica(cfg, CollectorRegistry())) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            yield client, http, version  # type: ignore[misc]
        finally:
            client.close()
    publisher.close()


def _inputs() -> list[triton.InferInput]:
    tensors = [
        ("dense", "FP32", np.array([[1.0, 2.0], [0.0, -1.0]], np.float32)),
        ("C1", "INT64", np.array([3, 4], np.int64)),
        ("C2", "INT64", np.array([7, 8], np.int64)),
        ("C2.lengths", "INT32", np.array([2, 0], np.int32)),
        ("C3", "BYTES", np.array([b"alice", b"11"], dtype=np.object_)),
    ]
    out = []
    for name, datatype, values in tensors:
        tensor = triton.InferInput(name, list(values.shape), datatype)
        tensor.set_data_from_numpy(values)
        out.append(tensor)
    return out


def test_tritonclient_grpc_scores_the_same_floats_as_v1(served) -> None:  # type: ignore[no-untyped-def]
    client, http, version = served
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(DEPLOYMENT)
    assert not client.is_model_ready("another")
    metadata = client.get_model_metadata(DEPLOYMENT, as_json=True)
    assert metadata["versions"] == [str(version)] and metadata["outputs"][0]["name"] == "label"

    expected = np.array(http.post("/v1/score", json={"samples": SAMPLES}).json()["scores"], np.float32)
    result = client.infer(DEPLOYMENT, _inputs(), request_id="g-1")
    np.testing.assert_array_equal(result.as_numpy("label"), expected)
    response = result.get_response(as_json=True)
    assert response["model_version"] == str(version) and response["id"] == "g-1"
    pinned = client.infer(DEPLOYMENT, _inputs(), model_version=str(version))
    np.testing.assert_array_equal(pinned.as_numpy("label"), expected)


def test_grpc_errors_carry_the_reason_and_status(served) -> None:  # type: ignore[no-untyped-def]
    client, _http, version = served

    def refused(
        model: str, inputs: list[triton.InferInput], model_version: str = ""
    ) -> InferenceServerException:
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, inputs, model_version=model_version)
        return caught.value

    wrong_model = refused("nope", _inputs())
    assert wrong_model.status() == "StatusCode.NOT_FOUND" and "unknown_model" in wrong_model.message()
    wrong_version = refused(DEPLOYMENT, _inputs(), str(version + 1))
    assert (
        wrong_version.status() == "StatusCode.NOT_FOUND" and "version_not_loaded" in wrong_version.message()
    )
    negative = triton.InferInput("C1", [1], "INT64")
    negative.set_data_from_numpy(np.array([-5], np.int64))
    bad = refused(DEPLOYMENT, [negative])
    assert bad.status() == "StatusCode.INVALID_ARGUMENT" and bad.message().startswith("bad_id:")


def test_grpc_calls_need_the_bearer_token_when_serving_has_one(redis_url: str, tmp_path: Path) -> None:
    grpc_port = free_port()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = small_config(
        redis_url,
        tmp_path,
        serving={"host": "127.0.0.1", "grpc_port": grpc_port, "auth_token_file": str(token)},
    )
    publisher = publisher_for(cfg)
    publisher.maybe_publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True)
    with LiveServer(ServingReplica(cfg, CollectorRegistry())):
        client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            assert client.is_server_ready()  # health stays open
            with pytest.raises(InferenceServerException) as caught:
                client.infer(DEPLOYMENT, _inputs())
            assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
            scored = client.infer(DEPLOYMENT, _inputs(), headers={"authorization": "Bearer s3cret"})
            assert scored.as_numpy("label").shape == (2,)
        finally:
            client.close()
    publisher.close()
