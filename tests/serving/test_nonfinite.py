"""Serving never answers a NaN: a non-finite snapshot is refused, a non-finite score is a documented 422.

Real replicas under uvicorn on the real Redis store and snapshot channel. A
non-finite row is injected between the store and the replica (a wrapper over
the real store), so the score guard is tested whatever the store does with
such rows itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from kelp.config import KelpConfig
from kelp.publish import Snapshot, build_snapshot
from kelp.publish.snapshot import _checksum
from kelp.serving import ServingReplica
from kelp.store.base import ReadRows
from kelp.store.factory import build_store

from .conftest import Live
from .helpers import LiveServer, constant_model, publisher_for, wait_until

pytestmark = pytest.mark.integration

POISON = 666


def _nan_snapshot(cfg: KelpConfig, version: int) -> Snapshot:
    """A snapshot whose checksum is right but one weight is NaN (what an older publisher could write)."""
    good = build_snapshot(
        constant_model(cfg, 1.0), cfg.features, cfg.trainer, version=version, step=5, offsets={}
    )
    tensors = st_load(good.weights)
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    weights = st_save(tensors)
    manifest = dataclasses.replace(good.manifest, weights_bytes=len(weights), checksum="")
    return Snapshot(dataclasses.replace(manifest, checksum=_checksum(manifest, weights)), weights)


def _count(replica: ServingReplica, name: str, **labels: str) -> float:
    return replica.registry.get_sample_value(name, labels) or 0.0


def _assert_finite_scores(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    scores = response.json()["scores"]
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores), scores


def test_nan_snapshot_is_refused_and_the_previous_version_served(live: Live) -> None:
    channel = live.publisher.channel
    version = channel.next_version()
    channel.write(_nan_snapshot(live.cfg, version))
    wait_until(lambda: _count(live.replica, "kelp_serving_snapshots_rejected_total", reason="nonfinite") == 1)

    r = live.client.post("/v1/score", json={"samples": [{}, {"sparse": {"C1": 3}}]})
    _assert_finite_scores(r)
    assert r.json()["model_version"] == 1
    assert live.client.get("/v1/model").json()["version"] == 1
    assert live.client.get("/readyz").status_code == 200
    good = live.publish()  # the next good version is taken, the bad one is not re-read
    wait_until(lambda: live.client.get("/v1/model").json()["version"] == good, what="the next good version")
    assert _count(live.replica, "kelp_serving_snapshots_rejected_total", reason="nonfinite") == 1


def test_replica_whose_only_snapshot_is_nan_stays_not_ready(cfg: KelpConfig) -> None:
    publisher = publisher_for(cfg)
    publisher.channel.write(_nan_snapshot(cfg, publisher.channel.next_version()))
    replica = ServingReplica(cfg, CollectorRegistry())
    with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "no model snapshot loaded" in ready.text
        r = client.post("/v1/score", json={"samples": [{}]})
        assert r.status_code == 503 and r.json()["error"] == "no_model"
        assert _count(replica, "kelp_serving_snapshots_rejected_total", reason="nonfinite") == 1
    publisher.close()


class _PoisonedStore:
    """The real store, except that id ``POISON`` reads back as a NaN row in every table."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read_many(self, ids: Mapping[str, np.ndarray]) -> ReadRows:
        got = self._inner.read_many(ids)
        rows = {}
        for table, table_rows in got.rows.items():
            rows[table] = table_rows.copy()
            rows[table][ids[table] == POISON] = np.nan
        return dataclasses.replace(got, rows=rows)


def _poisoned_replica(cfg: KelpConfig) -> ServingReplica:
    registry = CollectorRegistry()
    store = build_store(cfg.store, cfg.features.store_tables(), cfg.deployment, registry)
    return ServingReplica(cfg, registry, store=_PoisonedStore(store))  # type: ignore[arg-type]


def test_nonfinite_embedding_row_is_a_422_never_a_null_score(cfg: KelpConfig) -> None:
    publisher = publisher_for(cfg)
    publisher.publish(constant_model(cfg, 0.5), step=1, offsets={})
    replica = _poisoned_replica(cfg)
    with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="the replica to be ready")
        _assert_finite_scores(client.post("/v1/score", json={"samples": [{"sparse": {"C1": 5}}]}))

        r = client.post(
            "/v1/score", json={"samples": [{"sparse": {"C1": 5}}, {"sparse": {"C2": [4, POISON]}}]}
        )
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error"] == "nonfinite_score"
        assert "item 1 (samples[1] or candidates[1]" in body["detail"] and "1 of 2 items" in body["detail"]

        c = client.post(
            "/v1/score/candidates",
            json={"user": {"sparse": {"C1": 5}}, "candidates": [{"sparse": {"C3": POISON}}, {}, {}]},
        )
        assert c.status_code == 422 and c.json()["error"] == "nonfinite_score"
        assert "item 0" in c.json()["detail"]
        user = client.post(
            "/v1/score/candidates",
            json={"user": {"sparse": {"C3": POISON}}, "candidates": [{}, {"sparse": {"C3": 1}}]},
        )
        assert user.status_code == 422 and "1 of 2 items" in user.json()["detail"]  # candidate 1 overrides C3

        assert _count(replica, "kelp_serving_nonfinite_scores_total") == 3
        assert _count(replica, "kelp_serving_requests_total", endpoint="/v1/score", status="422") == 1
        assert client.get("/readyz").status_code == 200  # the replica is fine; that item's data is not
    publisher.close()


def test_model_whose_output_overflows_is_a_422(cfg: KelpConfig) -> None:
    """Finite weights (so the snapshot loads) whose forward pass overflows to infinity or NaN."""
    model = constant_model(cfg, 0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1e30)
    publisher = publisher_for(cfg)
    publisher.publish(model, step=1, offsets={})
    replica = ServingReplica(cfg, CollectorRegistry())
    with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="the replica to be ready")
        r = client.post("/v1/score", json={"samples": [{"dense": {"I1": 2.0}}]})
        assert r.status_code == 422 and r.json()["error"] == "nonfinite_score", r.text
    publisher.close()
