"""KServe's own v2 REST client against a real replica, run by a Python that has the ``kserve`` package.

``kserve`` pulls in the Kubernetes client, pandas, grpcio-tools and more, so it
is not a dev dependency: this test runs when ``KELP_KSERVE_PYTHON`` names an
interpreter where ``pip install kserve`` was done, and is skipped otherwise.
The client there scores the rows ``/v1/score`` scores; the floats must match.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer import build_model

from .helpers import DEPLOYMENT, LiveServer, publisher_for, small_config

pytestmark = pytest.mark.integration

KSERVE_PYTHON = os.environ.get("KELP_KSERVE_PYTHON")

CLIENT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceRESTClient, RESTConfig, InferRequest, InferInput

async def main(url, model):
    dense = InferInput("dense", [2, 2], "FP32")
    dense.set_data_from_numpy(np.array([[1, 2], [0, -1]], np.float32))
    ids = InferInput("C1", [2], "INT64")
    ids.set_data_from_numpy(np.array([3, 4], np.int64))
    client = InferenceRESTClient(RESTConfig(protocol="v2"))
    request = InferRequest(model_name=model, infer_inputs=[dense, ids])
    response = await client.infer(url, request, model_name=model)
    ready = await client.is_model_ready(url, model)
    await client.close()
    out = response.outputs[0]
    print(json.dumps({"ready": ready, "name": out.name, "scores": out.as_numpy().tolist()}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.skipif(KSERVE_PYTHON is None, reason="set KELP_KSERVE_PYTHON to a Python with kserve installed")
def test_kserve_client_scores_the_same_floats_as_v1(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path)
    torch.manual_seed(0)
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store:
        rows = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
        store.push("ads", np.array([3, 4], np.uint64), rows, np.zeros(2, np.float32))
    publisher = publisher_for(cfg)
    publisher.maybe_publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True)
    samples = [
        {"dense": {"I1": 1.0, "I2": 2.0}, "sparse": {"C1": 3}},
        {"dense": {"I1": 0.0, "I2": -1.0}, "sparse": {"C1": 4}},
    ]
    with (
        LiveServer(ServingReplica(cfg, CollectorRegistry())) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        expected = http.post("/v1/score", json={"samples": samples}).json()["scores"]
        done = subprocess.run(
            [str(KSERVE_PYTHON), "-c", CLIENT, server.url, DEPLOYMENT],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    publisher.close()
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["ready"] is True and answer["name"] == "label"
    np.testing.assert_array_equal(np.array(answer["scores"], np.float32), np.array(expected, np.float32))
