"""One train-then-serve pass with given store settings, for the ACL and TLS tests.

The trainer side is the real TrainStep pulling and pushing rows through the
store and the real Publisher writing snapshots to the Redis channel; the
serving side is a real :class:`~kelp.serving.ServingReplica` under uvicorn on
a loopback port, scored over HTTP. Both sides take their Redis credentials and
TLS files from ``store.*`` only, as the two processes of a deployment would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig, parse_config
from kelp.consumers.batch import MicroBatch
from kelp.harness.asgi_thread import AsgiThreadServer
from kelp.publish import build_publisher
from kelp.serving import ServingReplica, create_app
from kelp.store import build_store
from kelp.trainer import TrainStep, build_model

__all__ = ["flow_config", "serve_and_score", "train_and_publish"]


def flow_config(deployment: str, store: dict[str, Any], tmp_path: Path) -> KelpConfig:
    """Two sparse features over two tables (one with a TTL, so the ``buckets`` scripts run), one dense."""
    return parse_config(
        {
            "deployment": deployment,
            "source": {"kind": "file", "path": str(tmp_path / "none.msgpack"), "format": "msgpack"},
            "features": {
                "dense": [{"name": "I1"}],
                "sparse": [{"name": "C1", "table": "ads"}, {"name": "C2"}],
                "tables": [{"name": "ads", "dim": 4, "eviction": {"ttl_s": 3600}}, {"name": "C2", "dim": 4}],
            },
            "store": store,
            "trainer": {"bottom_mlp": [4], "top_mlp": [8], "device": "cpu"},
            "publisher": {"interval_s": 0.1, "keep_versions": 2},
            "serving": {"poll_interval_s": 0.2},
        },
        origin="secure_flow",
    )


def _batch(cfg: KelpConfig, rng: np.random.Generator, n: int = 64) -> MicroBatch:
    ids = rng.integers(0, 20, size=(n, 2)).astype(np.uint64)
    labels = (ids[:, 0] % 2 == 0).astype(np.float32)
    dense = rng.random((n, 1)).astype(np.float32)
    return MicroBatch.from_columns(
        cfg.features, labels=labels, dense=dense, sparse={"C1": ids[:, 0], "C2": ids[:, 1]}
    )


def train_and_publish(cfg: KelpConfig, steps: int = 3) -> int:
    """Train ``steps`` batches through the store and publish; returns the published version."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    store = build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry())
    step = TrainStep(build_model(cfg.features, cfg.trainer), cfg.features, cfg.trainer, torch.device("cpu"))
    publisher = build_publisher(cfg, CollectorRegistry())
    try:
        version = 0
        for i in range(steps):
            batch = _batch(cfg, rng)
            result = step(batch, store.pull_many({t: x.unique_ids for t, x in batch.tables.items()}))
            store.push_many(result.updates)
            version = publisher.maybe_publish(
                step.model, step=i + 1, offsets={("events", 0): i + 1}, force=True
            )
        return int(version)
    finally:
        publisher.close()
        store.close()


def serve_and_score(cfg: KelpConfig, version: int) -> dict[str, Any]:
    """Start a replica, wait (bounded) until it serves ``version``, score one sample; the response body."""
    replica = ServingReplica(cfg, CollectorRegistry())
    with AsgiThreadServer(create_app(replica)) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        deadline = time.monotonic() + 20
        while client.get("/v1/model").json().get("version") != version:
            if time.monotonic() > deadline:
                raise AssertionError(f"the replica never served v{version}: {client.get('/readyz').text}")
            time.sleep(0.05)
        sample = {"dense": {"I1": 0.5}, "sparse": {"C1": 4, "C2": 7}}
        answer = client.post("/v1/score", json={"samples": [sample]})
        assert answer.status_code == 200, answer.text
        return answer.json()
