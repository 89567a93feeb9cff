"""Versions are never reused: a lowered or garbled ``seq`` or a wiped directory makes publishing refuse.

Runs on a real redis-server (and a real directory): the keys are deleted or
rewritten the way eviction, a FLUSHDB or a hand edit would, then the next
publish must refuse with :class:`ChannelStateError`, count ``result="failed"``,
and leave ``latest`` and every stored version exactly as they were. A ``seq``
that is only *missing* beside stored versions is re-created above every
number the channel or the publisher knows, and publishing goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.publish import (
    ChannelStateError,
    Publisher,
    PublisherMetrics,
    SnapshotChannel,
    build_snapshot,
)
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.redis_channel import RedisChannel, channel_prefix
from kelp.trainer import build_model

pytestmark = pytest.mark.integration

PREFIX = channel_prefix("pubtest")


def _publisher(channel: SnapshotChannel, cfg: KelpConfig, keep: int = 2) -> Publisher:
    metrics = PublisherMetrics(CollectorRegistry())
    return Publisher(channel, cfg.features, cfg.trainer, interval_s=60, keep_versions=keep, metrics=metrics)


def _failed(pub: Publisher) -> float:
    return (
        pub.metrics.registry.get_sample_value("kelp_publisher_snapshots_total", {"result": "failed"}) or 0.0
    )


def _dump(client: redis.Redis) -> dict[bytes, object]:
    """Every key of the channel with its value: what "nothing changed" is checked against."""
    out: dict[bytes, object] = {}
    for key in sorted(client.keys(f"{PREFIX}:*")):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = client.get(key)
    return out


@pytest.fixture
def redis_channel(redis_url: str) -> RedisChannel:
    return RedisChannel(redis.Redis.from_url(redis_url), "pubtest", redis_url)


def _publish_three(channel: SnapshotChannel, cfg: KelpConfig) -> Publisher:
    pub = _publisher(channel, cfg)
    model = build_model(cfg.features, cfg.trainer)
    assert [pub.publish(model, step=s, offsets={}) for s in range(3)] == [1, 2, 3]
    return pub


@pytest.mark.parametrize("fresh_publisher", [False, True], ids=["same-publisher", "restarted-publisher"])
def test_a_deleted_seq_is_recreated_above_every_stored_version(
    redis_url: str,
    redis_channel: RedisChannel,
    cfg: KelpConfig,
    fresh_publisher: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pub = _publish_three(redis_channel, cfg)
    client = redis_channel._client
    client.delete(f"{PREFIX}:seq")
    v3 = f"{PREFIX}:v:000000000003"
    stored = client.hgetall(v3)
    if fresh_publisher:  # no memory of its own: the channel's keys alone must say where numbering is
        pub = _publisher(redis_channel, cfg)
    model = build_model(cfg.features, cfg.trainer)
    with caplog.at_level(logging.WARNING, logger="kelp.publish"):
        assert pub.publish(model, step=10, offsets={}) == 4
        assert client.hgetall(v3) == stored  # nothing stored was rewritten
        assert pub.publish(model, step=11, offsets={}) == 5
    healed = [r for r in caplog.records if "seq was missing" in r.getMessage()]
    assert len(healed) == 1 and "re-created it at v3" in healed[0].getMessage()
    assert _failed(pub) == 0
    replica = RedisChannel(redis.Redis.from_url(redis_url), "pubtest", redis_url)
    try:
        assert replica.target().version == 5
        assert replica.read(5).manifest.step == 11
    finally:
        replica.close()


def test_a_deleted_seq_is_recreated_above_a_version_hash_the_pointers_lost(
    redis_channel: RedisChannel, cfg: KelpConfig
) -> None:
    """``latest`` and ``versions`` lowered too: the version hash above them still holds its number."""
    _publish_three(redis_channel, cfg)
    client = redis_channel._client
    client.delete(f"{PREFIX}:seq")
    client.set(f"{PREFIX}:latest", 2)
    client.zrem(f"{PREFIX}:versions", "3")
    assert (
        _publisher(redis_channel, cfg).publish(build_model(cfg.features, cfg.trainer), step=9, offsets={})
        == 4
    )
    assert redis_channel.read(3).manifest.step == 2  # v3 kept its weights, not reused
    assert redis_channel.latest_version() == 4


def test_a_deleted_seq_is_recreated_above_what_this_publisher_wrote(
    redis_channel: RedisChannel, cfg: KelpConfig
) -> None:
    """The stored keys lag behind the publisher's memory (v3's keys lost): its floor counts too."""
    pub = _publish_three(redis_channel, cfg)
    client = redis_channel._client
    client.delete(f"{PREFIX}:seq", f"{PREFIX}:v:000000000003")
    client.set(f"{PREFIX}:latest", 2)
    client.zrem(f"{PREFIX}:versions", "3")
    assert pub.publish(build_model(cfg.features, cfg.trainer), step=9, offsets={}) == 4


def test_a_garbage_seq_refuses(redis_channel: RedisChannel, cfg: KelpConfig) -> None:
    """A ``seq`` somebody wrote is wrong, not lost: the operator decides, nothing is re-created."""
    pub = _publish_three(redis_channel, cfg)
    redis_channel._client.set(f"{PREFIX}:seq", b"oops")
    before = _dump(redis_channel._client)
    with pytest.raises(ChannelStateError, match=r"seq holds 'oops', not a version counter"):
        pub.publish(build_model(cfg.features, cfg.trainer), step=9, offsets={})
    assert _dump(redis_channel._client) == before
    assert _failed(pub) == 1
    failures = pub.metrics.registry.get_sample_value("kelp_publisher_failures_total", {"reason": "state"})
    assert failures == 1


def test_a_lowered_seq_refuses(redis_channel: RedisChannel, cfg: KelpConfig) -> None:
    _publish_three(redis_channel, cfg)
    redis_channel._client.set(f"{PREFIX}:seq", 1)
    before = _dump(redis_channel._client)
    with pytest.raises(ChannelStateError, match=r"seq is 1, below v3"):
        _publisher(redis_channel, cfg).publish(build_model(cfg.features, cfg.trainer), step=9, offsets={})
    assert _dump(redis_channel._client) == before


def test_every_key_gone_the_same_publisher_refuses(redis_channel: RedisChannel, cfg: KelpConfig) -> None:
    pub = _publish_three(redis_channel, cfg)
    client = redis_channel._client
    client.flushdb()  # eviction of everything, or a FLUSHDB: the channel looks brand new
    with pytest.raises(ChannelStateError, match=r"already published v3 but .*seq is missing"):
        pub.publish(build_model(cfg.features, cfg.trainer), step=9, offsets={})
    assert client.keys("*") == []  # nothing allocated, nothing written
    assert _failed(pub) == 1


def test_a_version_is_written_once(redis_channel: RedisChannel, cfg: KelpConfig) -> None:
    _publish_three(redis_channel, cfg)
    client = redis_channel._client
    before = _dump(client)
    model = build_model(cfg.features, cfg.trainer)
    # every pointer lowered by hand to v2 as if v3 had never been: only v3's own hash remembers it
    client.set(f"{PREFIX}:seq", 2)
    client.set(f"{PREFIX}:latest", 2)
    client.zrem(f"{PREFIX}:versions", "3")
    version = redis_channel.next_version()
    assert version == 3
    with pytest.raises(ChannelStateError, match=r"v3 already exists and versions are written once"):
        redis_channel.write(build_snapshot(model, cfg.features, cfg.trainer, version=3, step=99, offsets={}))
    assert client.hgetall(f"{PREFIX}:v:000000000003") == before[f"{PREFIX}:v:000000000003".encode()]
    assert redis_channel.latest_version() == 2


def test_a_stale_version_is_not_written(redis_channel: RedisChannel, cfg: KelpConfig) -> None:
    model = build_model(cfg.features, cfg.trainer)
    slow, fast = redis_channel.next_version(), redis_channel.next_version()
    redis_channel.write(build_snapshot(model, cfg.features, cfg.trainer, version=fast, step=2, offsets={}))
    with pytest.raises(ChannelStateError, match=rf"v{slow} is not above v{fast}"):
        redis_channel.write(
            build_snapshot(model, cfg.features, cfg.trainer, version=slow, step=1, offsets={})
        )
    assert redis_channel.versions() == [fast] and redis_channel.latest_version() == fast


def test_pruning_never_deletes_latest_or_above(redis_channel: RedisChannel, cfg: KelpConfig) -> None:
    _publish_three(redis_channel, cfg)
    redis_channel.delete([1, 2, 3])  # a pruner that lost track of latest
    assert redis_channel.versions() == [3]
    assert redis_channel.read(3).manifest.step == 2


def test_a_garbage_latest_is_reported_then_replaced_by_the_next_publish(
    redis_channel: RedisChannel, cfg: KelpConfig, caplog: pytest.LogCaptureFixture
) -> None:
    pub = _publish_three(redis_channel, cfg)
    redis_channel._client.set(f"{PREFIX}:latest", b"not-a-version")
    with pytest.raises(ChannelStateError, match=r"latest holds 'not-a-version', not a version number"):
        redis_channel.latest_version()
    with caplog.at_level(logging.WARNING, logger="kelp.publish"):
        assert pub.publish(build_model(cfg.features, cfg.trainer), step=9, offsets={}) == 4
    assert redis_channel.latest_version() == 4
    assert any(
        "'not-a-version'" in r.getMessage() and "replaced it" in r.getMessage() for r in caplog.records
    )


def test_a_new_channel_says_it_starts_at_one(
    redis_channel: RedisChannel, cfg: KelpConfig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kelp.publish"):
        assert redis_channel.next_version() == 1
        assert redis_channel.next_version() == 2
    starts = [r for r in caplog.records if "numbering starts at v1" in r.getMessage()]
    assert len(starts) == 1


# -- the filesystem channel -------------------------------------------------------------------------


def test_filesystem_never_overwrites_a_version(tmp_path: Path, cfg: KelpConfig) -> None:
    channel = FilesystemChannel(tmp_path / "snap")
    _publish_three(channel, cfg)
    model = build_model(cfg.features, cfg.trainer)
    weights = (channel.path / "snap-000000000003.safetensors").read_bytes()
    with pytest.raises(ChannelStateError, match=r"v3 already exists"):
        channel.write(build_snapshot(model, cfg.features, cfg.trainer, version=3, step=99, offsets={}))
    (channel.path / "latest").unlink()  # a missing pointer: the files still say where numbering is
    assert channel.next_version() == 4
    (channel.path / "snap-000000000003.json").unlink()  # a crash's orphan weights still hold v3
    assert channel.next_version() == 4
    assert (channel.path / "snap-000000000003.safetensors").read_bytes() == weights


def test_filesystem_wiped_directory_refuses_the_same_publisher(tmp_path: Path, cfg: KelpConfig) -> None:
    channel = FilesystemChannel(tmp_path / "snap")
    pub = _publish_three(channel, cfg)
    for f in channel.path.iterdir():
        f.unlink()
    with pytest.raises(ChannelStateError, match=r"already published v3 but the directory holds nothing"):
        pub.publish(build_model(cfg.features, cfg.trainer), step=9, offsets={})
    assert list(channel.path.iterdir()) == []
    assert _failed(pub) == 1


def test_filesystem_garbage_latest_is_reported_then_replaced(tmp_path: Path, cfg: KelpConfig) -> None:
    channel = FilesystemChannel(tmp_path / "snap")
    pub = _publish_three(channel, cfg)
    (channel.path / "latest").write_bytes(b"\x00garbage")
    with pytest.raises(ChannelStateError, match=r"latest holds .*garbage"):
        channel.latest_version()
    assert pub.publish(build_model(cfg.features, cfg.trainer), step=9, offsets={}) == 4
    assert channel.latest_version() == 4


def test_the_publisher_refuses_a_number_it_already_published(tmp_path: Path, cfg: KelpConfig) -> None:
    """Its own memory backs up any channel: one that hands out an old number again is refused."""

    class Forgetful(FilesystemChannel):
        def next_version(self, floor: int = 0) -> int:
            return 1  # ignores floor, as a channel that lost its record would

    channel = Forgetful(tmp_path / "snap")
    pub = _publisher(channel, cfg)
    model = build_model(cfg.features, cfg.trainer)
    assert pub.publish(model, step=1, offsets={}) == 1
    with pytest.raises(ChannelStateError, match=r"handed out v1, not above v1"):
        pub.publish(model, step=2, offsets={})
    assert _failed(pub) == 1
    assert channel.read(1).manifest.step == 1
