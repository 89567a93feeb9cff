"""Trainer to replica: TrainStep on a real Redis store, the Publisher, and a live replica.

Shows the two paths to serving: dense weights arrive by snapshot within the
publish interval, while a sparse row pushed to the store changes scores at once,
with no publish at all.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.consumers.batch import MicroBatch
from kelp.publish import build_publisher
from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer import TrainStep, build_model

from .helpers import LiveServer, wait_until

pytestmark = pytest.mark.integration


def _batch(cfg, rng: np.random.Generator, n: int = 256) -> MicroBatch:  # type: ignore[no-untyped-def]
    ids = rng.integers(0, 50, size=(n, 3)).astype(np.uint64)
    dense = rng.lognormal(size=(n, 2)).astype(np.float32)
    labels = ((ids[:, 0] % 3 == 0) ^ (rng.random(n) < 0.1)).astype(np.float32)
    return MicroBatch.from_columns(
        cfg.features, labels=labels, dense=dense, sparse={"C1": ids[:, 0], "C2": ids[:, 1], "C3": ids[:, 2]}
    )


def test_trained_model_is_served_and_store_pushes_change_scores_without_publish(cfg) -> None:  # type: ignore[no-untyped-def]
    import httpx

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    store = build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry())
    step = TrainStep(build_model(cfg.features, cfg.trainer), cfg.features, cfg.trainer, torch.device("cpu"))
    publisher = build_publisher(cfg, CollectorRegistry())
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        with LiveServer(replica) as server, httpx.Client(base_url=server.url) as client:
            assert client.get("/readyz").status_code == 503  # nothing published yet
            versions = []
            for i in range(4):
                batch = _batch(cfg, rng)
                result = step(batch, store.pull_many({t: x.unique_ids for t, x in batch.tables.items()}))
                store.push_many(result.updates)
                v = publisher.maybe_publish(
                    step.model, step=i + 1, offsets={("events", 0): 256 * (i + 1)}, force=True
                )
                versions.append(v)
            last = versions[-1]
            # the replica follows the channel (notification, else the poll) to the newest version
            wait_until(
                lambda: client.get("/v1/model").json().get("version") == last, what="the published version"
            )
            info = client.get("/v1/model").json()
            assert info["step"] == 4 and info["offsets"] == [
                {"topic": "events", "partition": 0, "offset": 1024}
            ]

            sample = {"dense": {"I1": 1.0, "I2": 2.0}, "sparse": {"C1": 3, "C2": [7], "C3": 11}}
            before = client.post("/v1/score", json={"samples": [sample]}).json()
            assert before["model_version"] == last and before["default_row_rate"] == 0.0
            assert before["embedding_age_s"]["max"] is not None

            # a trainer pushes a new row for C3 id 11: the next request sees it, same model version
            store.push(
                "C3", np.array([11], np.uint64), np.full((1, 4), 5.0, np.float32), np.zeros(1, np.float32)
            )
            after = client.post("/v1/score", json={"samples": [sample]}).json()
            assert after["model_version"] == last
            assert after["scores"][0] != pytest.approx(before["scores"][0], abs=1e-6)
    finally:
        publisher.close()
        store.close()
