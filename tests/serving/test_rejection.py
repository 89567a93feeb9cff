"""A corrupt or incompatible snapshot is refused: the replica keeps serving, and the reason is counted."""

from __future__ import annotations

import pytest

from kelp.publish import Snapshot, build_snapshot
from kelp.publish.redis_channel import RedisChannel, channel_prefix

from .conftest import Live
from .helpers import DEPLOYMENT, constant_model, small_config, wait_until

pytestmark = pytest.mark.integration


def _rejected(live: Live, reason: str) -> float:
    value = live.replica.registry.get_sample_value(
        "kelp_serving_snapshots_rejected_total", {"reason": reason}
    )
    return value or 0.0


def test_checksum_mismatch_keeps_the_previous_version(live: Live) -> None:
    channel = live.publisher.channel
    assert isinstance(channel, RedisChannel)
    version = channel.next_version()
    snap = build_snapshot(
        constant_model(live.cfg, 3.0),
        live.cfg.features,
        live.cfg.trainer,
        version=version,
        step=9,
        offsets={},
    )
    weights = bytearray(snap.weights)
    weights[-5] ^= 0xFF  # corrupted in transit or at rest
    channel.write(Snapshot(snap.manifest, bytes(weights)))
    assert channel._client.hget(f"{channel_prefix(DEPLOYMENT)}:v:{version:012d}", "weights") == bytes(weights)
    wait_until(lambda: _rejected(live, "checksum") == 1, what="the rejection")
    r = live.client.post("/v1/score", json={"samples": [{}]})
    assert r.status_code == 200 and r.json()["model_version"] == 1
    assert live.client.get("/v1/model").json()["version"] == 1
    # the bad version is not re-read on every poll, and the next good version is taken
    good = live.publish()
    wait_until(lambda: live.client.get("/v1/model").json()["version"] == good, what="the next good version")
    assert _rejected(live, "checksum") == 1


def test_snapshot_for_other_features_is_incompatible(live: Live, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = small_config(live.cfg.store.urls[0], tmp_path, features={"dense": [{"name": "I1"}]})
    version = live.publisher.channel.next_version()
    snap = build_snapshot(
        constant_model(other, 0.0), other.features, other.trainer, version=version, step=1, offsets={}
    )
    live.publisher.channel.write(snap)
    wait_until(lambda: _rejected(live, "incompatible") == 1, what="the rejection")
    assert live.client.post("/v1/score", json={"samples": [{}]}).json()["model_version"] == 1
