"""The HTTP contract: score, candidates, freshness fields, model info, health, readiness, metrics."""

from __future__ import annotations

import math

import httpx
import msgpack
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.harness import RedisServer
from kelp.publish import build_snapshot
from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer import build_model

from .conftest import Live
from .helpers import LiveServer, constant_model, logit_for, publisher_for, small_config, wait_until

pytestmark = pytest.mark.integration


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_score_returns_one_score_per_sample_and_the_version(live: Live) -> None:
    body = {
        "samples": [
            {"dense": {"I1": 3, "I2": None}, "sparse": {"C1": 5, "C2": [1, 2]}},
            {},
            {"sparse": {"C3": []}},
        ]
    }
    r = live.client.post("/v1/score", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_version"] == 1
    assert out["scores"] == pytest.approx([_sigmoid(logit_for(1))] * 3)
    assert out["model_age_s"] >= 0 and out["model_created_at"] > 0
    assert out["embedding_age_s"] == {"max": None, "mean": None}  # nothing stored yet
    assert out["default_row_rate"] == 1.0


def test_stored_rows_report_their_age_and_default_rate(live: Live) -> None:
    store = live.replica.store
    store.push("ads", np.array([5], np.uint64), np.ones((1, 4), np.float32), np.zeros(1, np.float32))
    body = {"samples": [{"sparse": {"C1": 5, "C2": [5, 6]}}, {"sparse": {"C1": 5}}]}
    out = live.client.post("/v1/score", json=body).json()
    # unique (table, id) pairs: ads {5, 6}; 5 is stored, 6 is not
    assert out["default_row_rate"] == pytest.approx(0.5)
    assert out["embedding_age_s"]["max"] is not None and 0 <= out["embedding_age_s"]["max"] < 3600
    assert out["embedding_age_s"]["mean"] <= out["embedding_age_s"]["max"]


def test_candidates_equal_merged_samples(live: Live) -> None:
    """Candidate features override the user's per feature; the result equals scoring the merged samples."""
    live.replica.store.push(
        "ads",
        np.arange(1, 9, dtype=np.uint64),
        np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32),
        np.zeros(8, np.float32),
    )
    version = live.publish()  # a non-constant model, so feature merging matters

    torch.manual_seed(3)
    model = build_model(live.cfg.features, live.cfg.trainer)
    version = live.publisher.channel.next_version()
    live.publisher.channel.write(
        build_snapshot(model, live.cfg.features, live.cfg.trainer, version=version, step=1, offsets={})
    )
    wait_until(lambda: live.client.get("/v1/model").json()["version"] == version, what="the swap")
    user = {"dense": {"I1": 2.0, "I2": 7.0}, "sparse": {"C1": 1, "C2": [2, 3], "C3": 9}}
    cands = [{"sparse": {"C1": 4}}, {"dense": {"I2": 0.5}, "sparse": {"C2": [5]}}, {}]
    merged = [
        {"dense": {"I1": 2.0, "I2": 7.0}, "sparse": {"C1": 4, "C2": [2, 3], "C3": 9}},
        {"dense": {"I1": 2.0, "I2": 0.5}, "sparse": {"C1": 1, "C2": [5], "C3": 9}},
        user,
    ]
    a = live.client.post("/v1/score/candidates", json={"user": user, "candidates": cands}).json()
    b = live.client.post("/v1/score", json={"samples": merged}).json()
    assert a["model_version"] == b["model_version"] == version
    assert a["scores"] == pytest.approx(b["scores"], rel=1e-6)
    assert len(set(np.round(a["scores"], 6))) == 3  # the candidates really differ


def test_model_info_health_and_metrics(live: Live) -> None:
    info = live.client.get("/v1/model").json()
    assert info["version"] == 1 and info["checksum"].startswith("sha256:")
    assert set(info) >= {"version", "created_at", "step", "offsets", "checksum"}
    assert live.client.get("/healthz").json() == {"status": "ok"}
    ready = live.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["model_version"] == 1
    live.client.post("/v1/score", json={"samples": [{}]})
    text = live.client.get("/metrics").text
    assert 'kelp_serving_requests_total{endpoint="/v1/score",status="200"} 1.0' in text
    assert "kelp_serving_model_version 1.0" in text
    assert "kelp_serving_ready 1.0" in text
    assert "kelp_serving_store_fetch_seconds_count" in text
    spec = live.client.get("/openapi.json").json()
    assert {"/v1/score", "/v1/score/candidates", "/readyz", "/v1/model"} <= set(spec["paths"])


def test_not_ready_without_a_model_then_ready_after_publish(cfg, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    replica = ServingReplica(cfg, CollectorRegistry())
    with LiveServer(replica) as server, httpx.Client(base_url=server.url) as client:
        r = client.get("/readyz")
        assert r.status_code == 503 and "no model" in r.json()["reason"]
        assert client.post("/v1/score", json={"samples": [{}]}).json()["error"] == "no_model"
        assert client.get("/v1/model").status_code == 503
        pub = publisher_for(cfg)
        pub.maybe_publish(constant_model(cfg, 0.0), step=1, offsets={})
        wait_until(lambda: client.get("/readyz").status_code == 200, what="readiness")
        assert client.post("/v1/score", json={"samples": [{}]}).json()["scores"] == [0.5]
        pub.close()


def test_not_ready_when_the_store_is_down(cfg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The model is there, the store is not: /readyz says which; scoring answers 503, not a crash."""
    with RedisServer() as store_redis:
        down_cfg = small_config(store_redis.url, tmp_path, publisher={"redis_url": cfg.store.urls[0]})
        pub = publisher_for(down_cfg)
        pub.maybe_publish(constant_model(down_cfg, 0.0), step=1, offsets={})
        replica = ServingReplica(down_cfg, CollectorRegistry())
        with LiveServer(replica) as server, httpx.Client(base_url=server.url) as client:
            assert client.get("/readyz").status_code == 200
            store_redis.stop()
            r = client.get("/readyz")
            assert r.status_code == 503 and "store unavailable" in r.json()["reason"]
            r = client.post("/v1/score", json={"samples": [{"sparse": {"C1": 1}}]})
            assert r.status_code == 503 and r.json()["error"] == "store_unavailable"
        pub.close()


def test_memory_store_replica_reads_defaults(tmp_path, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    """Unknown ids read the default row (never an error), whatever the backend."""
    cfg = small_config(
        redis_url, tmp_path, store={"backend": "memory", "urls": []}, publisher={"redis_url": redis_url}
    )
    replica = ServingReplica(
        cfg, CollectorRegistry(), store=build_store(cfg.store, list(cfg.features.tables))
    )
    assert replica.fetcher.fetch({"ads": np.array([1, 2], np.uint64)}).default == 2
    replica.close()


def test_msgpack_bodies_and_replies_score_like_json(live: Live) -> None:
    """The compact form: a msgpack body with packed id columns, a msgpack reply; same scores as JSON."""
    user = {"dense": {"I1": 2.0}, "sparse": {"C2": [2, 3], "C3": 9}}
    rows = [{"sparse": {"C1": c}} for c in (4, 5, 6)]
    columns = {"count": 3, "sparse": {"C1": np.array([4, 5, 6], "<u8").tobytes()}}
    as_json = live.client.post("/v1/score/candidates", json={"user": user, "candidates": rows})
    as_msgpack = live.client.post(
        "/v1/score/candidates",
        content=msgpack.packb({"user": user, "candidates": columns}),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert as_json.status_code == as_msgpack.status_code == 200, as_msgpack.text
    assert as_msgpack.headers["content-type"] == "application/msgpack"
    reply = msgpack.unpackb(as_msgpack.content)
    assert reply["scores"] == pytest.approx(as_json.json()["scores"], rel=1e-6)
    assert reply["model_version"] == as_json.json()["model_version"]


def test_a_broken_msgpack_body_is_a_422(live: Live) -> None:
    r = live.client.post("/v1/score", content=b"\xc1", headers={"content-type": "application/msgpack"})
    assert r.status_code == 422 and r.json()["error"] == "bad_msgpack"
