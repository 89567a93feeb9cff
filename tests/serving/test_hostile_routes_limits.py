"""Cheap requests that would cost the replica dear, and inputs that must get a 4xx, not a 5xx, on ``/v2``
(REST and gRPC) and ``/v1/embeddings``: a real replica under uvicorn with its gRPC port, on real Redis.

* sizes are checked before work: an input's element count against the sample
  cap before its ``BYTES`` elements are read, an embeddings answer's size
  (``serving.max_vector_values``) before rows are read or the encode hook's
  output is converted;
* a binary header length of thousands of digits, inline data nested as deep
  as the JSON parser allows and typed ``FP16`` contents over gRPC are each a
  400 / ``INVALID_ARGUMENT`` naming the reason;
* metadata needs the bearer token on both transports, health checks on neither.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
import torch
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from kelp.harness import free_port
from kelp.serving import ServingReplica
from kelp.trainer import build_model

from .helpers import DEPLOYMENT, LiveServer, publisher_for, small_config

pytestmark = pytest.mark.integration

TOKEN = "t0ken-limits"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)
MAX_VALUES = 100  # serving.max_vector_values here; the ads table has dim 4
INFER = f"/v2/models/{DEPLOYMENT}/infer"


@dataclass
class Guarded:
    replica: ServingReplica
    http: httpx.Client
    grpc: Any  # the protocol's generated stub
    version: int


@pytest.fixture
def guarded(redis_url: str, tmp_path: Path) -> Iterator[Guarded]:
    grpc_port = free_port()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    cfg = small_config(
        redis_url,
        tmp_path,
        serving={
            "host": "127.0.0.1",
            "grpc_port": grpc_port,
            "auth_token_file": str(token),
            "max_vector_values": MAX_VALUES,
        },
    )
    publisher = publisher_for(cfg)
    version = publisher.maybe_publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True)
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        with (
            LiveServer(replica) as server,
            httpx.Client(base_url=server.url, timeout=60) as http,
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
        ):
            yield Guarded(replica, http, service_pb2_grpc.GRPCInferenceServiceStub(channel), version)
    finally:
        publisher.close()


def _one_id(http: httpx.Client) -> None:
    """A small request is answered normally after the abuse."""
    ok = http.post(
        INFER,
        json={"inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": [3]}]},
        headers=AUTH,
    )
    assert ok.status_code == 200, ok.text


def _grpc_error(call: Any, request: Any, metadata: Any = GRPC_AUTH) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, metadata=metadata, timeout=60)
    return caught.value


# -- sizes before work ----------------------------------------------------------------------------


def test_a_bytes_input_too_big_to_score_is_refused_before_its_elements_are_read(guarded: Guarded) -> None:
    """Ten thousand BYTES ids of C2 (64 samples x 3 ids fit): refused on the shape. The elements are
    malformed (the first says it is 4 GiB long): reading them would have answered 400 instead."""
    count = 10_000
    blob = struct.pack("<I", 0xFFFFFFFF) + bytes(4 * (count - 1))
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "C2",
                    "shape": [count],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    )
    r = guarded.http.post(
        INFER,
        content=head + blob,
        headers={
            **AUTH,
            "Inference-Header-Content-Length": str(len(head)),
            "Content-Type": "application/octet-stream",
        },
    )
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error.startswith("too_many_samples: input 'C2': 10000 elements"), error

    request = pb.ModelInferRequest(model_name=DEPLOYMENT)
    request.inputs.add(name="C2", datatype="BYTES", shape=[count])
    request.raw_input_contents.append(blob)
    refused = _grpc_error(guarded.grpc.ModelInfer, request)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
    assert refused.details().startswith("too_many_samples: input 'C2'"), refused.details()
    _one_id(guarded.http)


def test_an_embeddings_answer_is_bounded_and_repeated_ids_are_read_once(guarded: Guarded) -> None:
    over = guarded.http.post(
        "/v1/embeddings", json={"table": "ads", "ids": list(range(MAX_VALUES // 4 + 1))}, headers=AUTH
    )
    assert over.status_code == 413, over.text[:300]
    assert over.json()["error"] == "answer_too_large"
    assert "serving.max_vector_values (100)" in over.json()["detail"]

    repeated = guarded.http.post("/v1/embeddings", json={"table": "ads", "ids": [7] * 25}, headers=AUTH)
    assert repeated.status_code == 200, repeated.text
    body = repeated.json()
    assert body["ids"] == [7] * 25 and len(body["vectors"]) == 25
    assert all(v == body["vectors"][0] for v in body["vectors"])


def test_an_encode_output_over_the_bound_is_refused_on_its_shape(guarded: Guarded) -> None:
    served = guarded.replica.slot.current
    assert served is not None
    samples = {"samples": [{"sparse": {"C1": 1}}, {"sparse": {"C1": 2}}]}

    def huge(batch: Any) -> dict[str, torch.Tensor]:
        size = batch.dense.shape[0]
        return {"user": torch.zeros(size, 2), "item": torch.zeros(size, 1000)}

    served.module.encode = huge  # a plug-in model's hook with outputs far wider than an answer may be
    refused = guarded.http.post("/v1/embeddings", json=samples, headers=AUTH)
    assert refused.status_code == 413, refused.text[:300]
    payload = refused.json()
    assert payload["error"] == "answer_too_large" and "'item' [2, 1000]" in payload["detail"], payload

    served.module.encode = lambda batch: {"user": torch.ones(batch.dense.shape[0], 3)}
    fits = guarded.http.post("/v1/embeddings", json=samples, headers=AUTH)
    assert fits.status_code == 200, fits.text
    assert fits.json()["vectors"] == {"user": [[1.0] * 3] * 2}


# -- 400, not 500 ---------------------------------------------------------------------------------


def test_a_binary_header_length_of_thousands_of_digits_is_400(guarded: Guarded) -> None:
    digits = "9" * 5000  # past Python's int() digit limit
    r = guarded.http.post(INFER, content=b"{}", headers={**AUTH, "Inference-Header-Content-Length": digits})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith("invalid_request: inference-header-content-length must be a byte count"), error
    assert len(error) < 300  # the value is cut, never echoed back whole
    _one_id(guarded.http)


def test_inline_data_nested_as_deep_as_json_allows_is_400(guarded: Guarded) -> None:
    depth = 990  # under orjson's depth limit, past Python's recursion limit
    data = b"[" * depth + b"3" + b"]" * depth
    body = b'{"inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": ' + data + b"}]}"
    r = guarded.http.post(INFER, content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("invalid_request: input 'C1': 'data' is nested deeper"), r.text
    _one_id(guarded.http)


def test_grpc_typed_fp16_contents_are_invalid_argument(guarded: Guarded) -> None:
    request = pb.ModelInferRequest(model_name=DEPLOYMENT)
    request.inputs.add(name="dense", datatype="FP16", shape=[1, 2])
    refused = _grpc_error(guarded.grpc.ModelInfer, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
    assert refused.details().startswith("invalid_request: input 'dense': FP16"), refused.details()
    assert "raw_input_contents" in refused.details()


# -- one token rule for both transports -----------------------------------------------------------


def test_metadata_needs_the_token_on_rest_and_grpc_and_health_checks_do_not(guarded: Guarded) -> None:
    http, stub, version = guarded.http, guarded.grpc, guarded.version
    for path in ("/v2", f"/v2/models/{DEPLOYMENT}", f"/v2/models/{DEPLOYMENT}/versions/{version}"):
        refused = http.get(path)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.json()["error"].startswith("missing_token:"), path
        assert refused.headers["www-authenticate"] == 'Bearer realm="kelp"'
        assert http.get(path, headers=AUTH).status_code == 200, path
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{DEPLOYMENT}/ready"):
        assert http.get(path).status_code == 200, path

    for call, request in (
        (stub.ServerMetadata, pb.ServerMetadataRequest()),
        (stub.ModelMetadata, pb.ModelMetadataRequest(name=DEPLOYMENT)),
    ):
        refused = _grpc_error(call, request, metadata=())
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused.details()
        assert refused.details().startswith("missing_token:")
        call(request, metadata=GRPC_AUTH, timeout=60)
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=60).live
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=60).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name=DEPLOYMENT), timeout=60).ready
