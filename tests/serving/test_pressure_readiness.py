"""Readiness under pressure: a refused snapshot is named by /readyz, and the ready gauge follows the replica.

A replica whose only snapshot was refused has no model; ``/readyz`` says which
version was refused and why, not only that nothing is loaded. And
``kelp_serving_ready`` is kept from the replica's own state: it reads 1 once a
model serves, with no ``/readyz`` call to set it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kelp.publish import Snapshot, build_snapshot
from kelp.serving import ServingReplica

from .helpers import LiveServer, constant_model, publisher_for, small_config, wait_until

pytestmark = pytest.mark.integration


def _with_other_model_digest(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` as a trainer running other model code would have written it: a valid checksum over a
    manifest whose model digest is not this replica's."""
    model = {**snapshot.manifest.model, "digest": "sha256:" + "0" * 64}
    manifest = dataclasses.replace(snapshot.manifest, model=model, checksum="")
    checksum = hashlib.sha256(manifest.canonical() + b"\n" + snapshot.weights).hexdigest()
    return Snapshot(dataclasses.replace(manifest, checksum=f"sha256:{checksum}"), snapshot.weights)


def test_readyz_names_the_refused_snapshot_while_no_model_is_loaded(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path)
    publisher = publisher_for(cfg)
    try:
        version = publisher.channel.next_version()
        built = build_snapshot(
            constant_model(cfg, 0.0), cfg.features, cfg.trainer, version=version, step=1, offsets={}
        )
        publisher.channel.write(_with_other_model_digest(built))
        replica = ServingReplica(cfg, CollectorRegistry())
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            answer = client.get("/readyz")
            assert answer.status_code == 503
            reason = answer.json()["reason"]
            assert reason.startswith("no model snapshot loaded yet")
            assert f"v{version} rejected (model_digest)" in reason, reason
            assert "source digest" in reason, reason  # the refusal's own message: what differs
    finally:
        publisher.close()


def test_the_ready_gauge_follows_the_replica_without_a_readyz_call(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path)
    replica = ServingReplica(cfg, CollectorRegistry())
    publisher = publisher_for(cfg)
    try:
        with LiveServer(replica):
            ready = lambda: replica.registry.get_sample_value("kelp_serving_ready")  # noqa: E731
            assert ready() == 0  # nothing published yet
            publisher.maybe_publish(constant_model(cfg, 0.0), step=1, offsets={}, force=True)
            wait_until(lambda: ready() == 1, what="kelp_serving_ready to follow the loaded model")
    finally:
        publisher.close()
