"""The Open Inference Protocol (KServe v2) on a real replica, spoken by Triton's own client.

``tritonclient[http]`` was written by NVIDIA for Triton, not for Kelp: if it
can find the server, read the model's metadata and get the same floats as
``/v1/score`` for the same rows, binary and JSON, Kelp speaks the protocol.
The replica runs under real uvicorn on the real Redis, with a model of random
weights and stored rows, so every score differs and equality means the same
rows went through the same model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from kelp.config import KelpConfig
from kelp.consumers.ids import str_id
from kelp.publish import Publisher
from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer import build_model

from .helpers import DEPLOYMENT, LiveServer, publisher_for

pytestmark = pytest.mark.integration

# Three samples: C2 is multi-hot (lengths 2, 0, 1), C3 comes as strings, one of them digits.
SAMPLES = [
    {"dense": {"I1": 1.0, "I2": 2.0}, "sparse": {"C1": 3, "C2": [7, 8], "C3": "alice"}},
    {"dense": {"I1": 0.0, "I2": -1.0}, "sparse": {"C1": 4, "C2": [], "C3": "11"}},
    {"dense": {"I1": 5.5, "I2": 0.25}, "sparse": {"C1": 3, "C2": [9], "C3": "bob"}},
]


@dataclass
class Oip:
    url: str
    client: triton.InferenceServerClient
    http: httpx.Client
    version: int
    publisher: Publisher


@pytest.fixture
def oip(cfg: KelpConfig) -> Iterator[Oip]:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    store = build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry())
    for table, ids in (("ads", [3, 4, 7, 8, 9]), ("C3", [11, str_id("alice"), str_id("bob")])):
        rows = rng.normal(size=(len(ids), 4)).astype(np.float32)
        store.push(table, np.array(ids, np.uint64), rows, np.zeros(len(ids), np.float32))
    store.close()
    publisher = publisher_for(cfg)
    version = publisher.maybe_publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True)
    replica = ServingReplica(cfg, CollectorRegistry())
    with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            yield Oip(server.url, client, http, version, publisher)
        finally:
            client.close()
    publisher.close()


def _triton_inputs(binary: bool) -> list[triton.InferInput]:
    dense = np.array([[s["dense"]["I1"], s["dense"]["I2"]] for s in SAMPLES], np.float32)
    c1 = np.array([s["sparse"]["C1"] for s in SAMPLES], np.int64)
    c2 = np.array([i for s in SAMPLES for i in s["sparse"]["C2"]], np.int64)
    c2_lengths = np.array([len(s["sparse"]["C2"]) for s in SAMPLES], np.int32)
    c3 = np.array([s["sparse"]["C3"].encode() for s in SAMPLES], dtype=np.object_)
    tensors = [
        ("dense", "FP32", dense),
        ("C1", "INT64", c1),
        ("C2", "INT64", c2),
        ("C2.lengths", "INT32", c2_lengths),
        ("C3", "BYTES", c3),
    ]
    inputs = []
    for name, datatype, values in tensors:
        tensor = triton.InferInput(name, list(values.shape), datatype)
        tensor.set_data_from_numpy(values, binary_data=binary)
        inputs.append(tensor)
    return inputs


def test_tritonclient_scores_the_same_floats_as_v1_binary_and_json(oip: Oip) -> None:
    v1 = oip.http.post("/v1/score", json={"samples": SAMPLES}).json()
    expected = np.array(v1["scores"], np.float32)
    assert len(set(v1["scores"])) == len(SAMPLES)  # random weights and rows: every score differs

    binary = oip.client.infer(DEPLOYMENT, _triton_inputs(binary=True), request_id="r-1")
    assert binary.get_response()["id"] == "r-1"
    assert binary.get_response()["model_version"] == str(oip.version)
    np.testing.assert_array_equal(binary.as_numpy("label"), expected)

    as_json = oip.client.infer(
        DEPLOYMENT,
        _triton_inputs(binary=False),
        outputs=[triton.InferRequestedOutput("label", binary_data=False)],
    )
    assert as_json.get_response()["outputs"][0]["data"] == v1["scores"]  # to the last float
    np.testing.assert_array_equal(as_json.as_numpy("label"), expected)

    pinned = oip.client.infer(DEPLOYMENT, _triton_inputs(binary=True), model_version=str(oip.version))
    np.testing.assert_array_equal(pinned.as_numpy("label"), expected)


def test_tritonclient_health_and_metadata(oip: Oip) -> None:
    client = oip.client
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(DEPLOYMENT)
    assert client.is_model_ready(DEPLOYMENT, str(oip.version))
    assert not client.is_model_ready(DEPLOYMENT, str(oip.version + 1))
    assert not client.is_model_ready("another-model")
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]

    metadata = client.get_model_metadata(DEPLOYMENT)
    assert metadata["name"] == DEPLOYMENT and metadata["versions"] == [str(oip.version)]
    assert metadata["outputs"] == [{"name": "label", "datatype": "FP32", "shape": [-1]}]
    names = [t["name"] for t in metadata["inputs"]]
    assert names == ["dense", "C1", "C1.lengths", "C2", "C2.lengths", "C3", "C3.lengths"]
    assert metadata["inputs"][0]["shape"] == [-1, 2]


def _error_of(call, status: str = "400") -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() == status, caught.value.message()
    return str(caught.value.message())


def test_errors_name_the_reason_in_the_protocols_shape(oip: Oip) -> None:
    client = oip.client

    def infer_with(name: str, datatype: str, values: np.ndarray, model: str = DEPLOYMENT, version: str = ""):  # type: ignore[no-untyped-def]
        tensor = triton.InferInput(name, list(values.shape), datatype)
        tensor.set_data_from_numpy(values)
        return lambda: client.infer(model, [tensor], model_version=version)

    ids = np.array([1, 2], np.int64)
    assert _error_of(infer_with("C1", "INT64", ids, model="nope"), "404").startswith("unknown_model:")
    assert _error_of(infer_with("C1", "INT64", ids, version=str(oip.version + 1)), "404").startswith(
        "version_not_loaded:"
    )
    assert _error_of(infer_with("C9", "INT64", ids)).startswith("unknown_input: input 'C9'")
    assert _error_of(infer_with("C1", "INT64", np.array([-1, 2], np.int64))).startswith("bad_id:")
    assert _error_of(infer_with("C1", "FP32", ids.astype(np.float32))).startswith("bad_id:")
    assert _error_of(infer_with("C2", "INT64", np.ones((2, 4), np.int64))).startswith("too_many_ids:")
    assert _error_of(infer_with("dense", "FP32", np.ones((2, 3), np.float32))).startswith("bad_shape:")
    nan = np.array([[np.nan, 1.0]], np.float32)
    assert _error_of(infer_with("dense", "FP32", nan)).startswith("bad_dense:")
    assert _error_of(infer_with("C1", "INT64", np.arange(65, dtype=np.int64)), "413").startswith(
        "too_many_samples:"
    )

    statuses = {
        "unknown output": oip.http.post(
            f"/v2/models/{DEPLOYMENT}/infer",
            json={
                "inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": [1]}],
                "outputs": [{"name": "ctr"}],
            },
        ),
        "not JSON": oip.http.post(f"/v2/models/{DEPLOYMENT}/infer", content=b"{"),
        "data and shape disagree": oip.http.post(
            f"/v2/models/{DEPLOYMENT}/infer",
            json={"inputs": [{"name": "C1", "shape": [3], "datatype": "INT64", "data": [1]}]},
        ),
        "lengths without their ids": oip.http.post(
            f"/v2/models/{DEPLOYMENT}/infer",
            json={
                "inputs": [
                    {"name": "C1", "shape": [1], "datatype": "INT64", "data": [1]},
                    {"name": "C2.lengths", "shape": [1], "datatype": "INT32", "data": [1]},
                ]
            },
        ),
        "binary header past the body": oip.http.post(
            f"/v2/models/{DEPLOYMENT}/infer", content=b"{}", headers={"Inference-Header-Content-Length": "99"}
        ),
    }
    for what, response in statuses.items():
        assert response.status_code == 400, what
        assert set(response.json()) == {"error"}, what


def test_nested_json_data_and_per_feature_dense_inputs_score_like_v1(oip: Oip) -> None:
    body = {
        "inputs": [
            {"name": "I2", "shape": [2, 1], "datatype": "FP64", "data": [[2.0], [-1.0]]},
            {"name": "C1", "shape": [2, 1], "datatype": "UINT64", "data": [[3], [4]]},
            {"name": "C3", "shape": [2], "datatype": "BYTES", "data": ["alice", "11"]},
        ]
    }
    oip_scores = oip.http.post(f"/v2/models/{DEPLOYMENT}/infer", json=body).json()["outputs"][0]["data"]
    v1 = oip.http.post(
        "/v1/score",
        json={
            "samples": [
                {"dense": {"I2": 2.0}, "sparse": {"C1": 3, "C3": "alice"}},
                {"dense": {"I2": -1.0}, "sparse": {"C1": 4, "C3": 11}},
            ]
        },
    ).json()["scores"]
    assert oip_scores == v1


def test_request_metrics_are_labelled_by_route_template(oip: Oip) -> None:
    oip.client.infer(DEPLOYMENT, _triton_inputs(binary=True))
    oip.client.is_model_ready(DEPLOYMENT, str(oip.version))
    text = oip.http.get("/metrics").text
    assert 'endpoint="/v2/models/{name}/infer",status="200"' in text
    assert 'endpoint="/v2/models/{name}/versions/{version}/ready",status="200"' in text
    assert DEPLOYMENT + "/infer" not in text  # the model name is not a label value
