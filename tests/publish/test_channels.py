"""Both snapshot channels against real backends: versions, pruning, notification, corruption."""

from __future__ import annotations

import threading

import pytest
import redis
import torch

from kelp.config import KelpConfig
from kelp.publish import Publisher, SnapshotChannel, SnapshotMissingError, SnapshotRejectedError
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.redis_channel import RedisChannel, channel_prefix
from kelp.trainer import build_model

pytestmark = pytest.mark.integration


def _publisher(channel: SnapshotChannel, cfg: KelpConfig, keep: int = 3) -> Publisher:
    return Publisher(channel, cfg.features, cfg.trainer, interval_s=60, keep_versions=keep)


def test_round_trip_and_keep_versions(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    pub = _publisher(channel, cfg, keep=3)
    model = build_model(cfg.features, cfg.trainer)
    versions = [pub.maybe_publish(model, step=s, offsets={("t", 0): s}, force=True) for s in range(6)]
    assert versions == [1, 2, 3, 4, 5, 6]
    assert channel.latest_version() == 6
    assert channel.versions() == [4, 5, 6]
    snap = channel.read(6)
    assert snap.manifest.step == 5 and snap.manifest.offsets == {("t", 0): 5}
    with pytest.raises(SnapshotMissingError):
        channel.read(1)


def test_versions_stay_monotonic_across_publisher_restarts(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    model = build_model(cfg.features, cfg.trainer)
    first = _publisher(channel, cfg, keep=1).maybe_publish(model, step=1, offsets={}, force=True)
    second = _publisher(channel, cfg, keep=1).maybe_publish(model, step=2, offsets={}, force=True)
    assert first is not None and second is not None and second > first
    assert channel.versions() == [second]


def test_latest_never_moves_back(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    from kelp.publish import ChannelStateError, build_snapshot

    model = build_model(cfg.features, cfg.trainer)
    written = []
    for step in range(2):
        version = channel.next_version()
        channel.write(
            build_snapshot(model, cfg.features, cfg.trainer, version=version, step=step, offsets={})
        )
        written.append(version)
    # a slow publisher finishing an older version after a newer one: refused, nothing moves back
    with pytest.raises(ChannelStateError):
        channel.write(
            build_snapshot(model, cfg.features, cfg.trainer, version=written[0], step=9, offsets={})
        )
    assert channel.latest_version() == written[1]
    assert channel.read(written[0]).manifest.step == 0
    assert channel.next_version() > written[1]


def test_subscription_hears_a_publish(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    sub = channel.subscribe()
    sub.wait(0.05)  # let a Redis subscription register before the publish
    pub = _publisher(channel, cfg)
    model = build_model(cfg.features, cfg.trainer)
    timer = threading.Timer(0.2, lambda: pub.maybe_publish(model, step=1, offsets={}, force=True))
    timer.start()
    try:
        assert sub.wait(10.0)
    finally:
        timer.join()
        sub.close()


def _corrupt(channel: SnapshotChannel, version: int) -> None:
    _manifest, weights = channel.read_raw(version)
    bad = weights[:-1] + bytes([weights[-1] ^ 0xFF])
    if isinstance(channel, RedisChannel):
        channel._client.hset(f"{channel_prefix('pubtest')}:v:{version:012d}", "weights", bad)
    else:
        assert isinstance(channel, FilesystemChannel)
        (channel.path / f"snap-{version:012d}.safetensors").write_bytes(bad)


def test_corrupt_stored_snapshot_is_rejected(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    pub = _publisher(channel, cfg)
    version = pub.maybe_publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True)
    assert version is not None
    _corrupt(channel, version)
    with pytest.raises(SnapshotRejectedError) as info:
        channel.read(version)
    assert info.value.reason == "checksum"


def test_redis_keys_are_namespaced_by_deployment(redis_url: str, cfg: KelpConfig) -> None:
    channel = RedisChannel(redis.Redis.from_url(redis_url), "dep-a")
    _publisher(channel, cfg).maybe_publish(
        build_model(cfg.features, cfg.trainer), step=1, offsets={}, force=True
    )
    keys = sorted(k.decode() for k in redis.Redis.from_url(redis_url).keys("*"))
    assert keys == [
        "{k1:dep-a:model}:latest",
        "{k1:dep-a:model}:seq",
        "{k1:dep-a:model}:v:000000000001",
        "{k1:dep-a:model}:versions",
    ]
    assert RedisChannel(redis.Redis.from_url(redis_url), "dep-b").latest_version() is None


def test_redis_cluster_channel(clean_redis_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from serving.helpers import small_config

    from kelp.publish import build_channel

    cfg = small_config(
        "redis://unused:1", tmp_path, store={"backend": "redis-cluster", "urls": clean_redis_cluster.urls}
    )
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel:
        pub = _publisher(channel, cfg, keep=2)
        model = build_model(cfg.features, cfg.trainer)
        torch.manual_seed(0)
        for step in range(3):
            pub.maybe_publish(model, step=step, offsets={}, force=True)
        assert channel.versions() == [2, 3]
        assert channel.read(3).manifest.step == 2
        channel.warn_about_eviction()  # CONFIG GET through a cluster client: says something, never raises
        # a lost seq is re-created inside the allocation script, its probe staying in the one slot
        channel._client.delete(f"{channel.prefix}:seq")
        assert pub.maybe_publish(model, step=3, offsets={}, force=True) == 4
        assert channel.read(4).manifest.step == 3
