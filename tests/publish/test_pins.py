"""Pins on both snapshot channels, on real backends: what replicas follow, what pruning keeps, notices."""

from __future__ import annotations

import pytest

from kelp.config import KelpConfig
from kelp.publish import ChannelStateError, Publisher, SnapshotChannel, SnapshotMissingError
from kelp.publish.base import ServingTarget
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.redis_channel import RedisChannel
from kelp.trainer import build_model

pytestmark = pytest.mark.integration


def _publish(channel: SnapshotChannel, cfg: KelpConfig, count: int, keep: int = 3) -> list[int]:
    publisher = Publisher(channel, cfg.features, cfg.trainer, interval_s=60, keep_versions=keep)
    model = build_model(cfg.features, cfg.trainer)
    return [publisher.maybe_publish(model, step=s, offsets={}, force=True) for s in range(count)]  # type: ignore[misc]


def test_the_target_is_the_pin_while_there_is_one(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    assert channel.target() == ServingTarget(None, False)
    _publish(channel, cfg, 3)
    assert channel.pinned_version() is None
    assert channel.target() == ServingTarget(3, False)
    channel.set_pin(2)
    assert channel.target() == ServingTarget(2, True)
    _publish(channel, cfg, 1)  # a publish moves latest, not the pin
    assert channel.latest_version() == 4 and channel.target() == ServingTarget(2, True)
    channel.set_pin(None)
    assert channel.target() == ServingTarget(4, False)
    channel.set_pin(None)  # lifting no pin is fine


def test_a_version_that_is_not_stored_cannot_be_pinned(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    _publish(channel, cfg, 2)
    with pytest.raises(SnapshotMissingError):
        channel.set_pin(7)
    assert channel.pinned_version() is None


def test_pruning_keeps_the_pinned_version(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    _publish(channel, cfg, 3, keep=3)
    channel.set_pin(1)
    _publish(channel, cfg, 3, keep=3)
    assert channel.versions() == [1, 4, 5, 6]
    channel.set_pin(None)
    _publish(channel, cfg, 1, keep=3)
    assert channel.versions() == [5, 6, 7]


def test_delete_skips_a_pin_set_after_the_caller_looked(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    _publish(channel, cfg, 3)
    channel.set_pin(1)
    channel.delete([1, 2])
    assert channel.versions() == [1, 3]


def test_subscribers_hear_a_pin_and_an_unpin(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    _publish(channel, cfg, 2)
    sub = channel.subscribe()
    sub.wait(0.05)  # let a Redis subscription register first
    channel.set_pin(1)
    assert sub.wait(5.0)
    channel.set_pin(None)
    assert sub.wait(5.0)
    sub.close()


def test_a_garbled_pin_is_a_channel_state_error_naming_the_repair(
    channel: SnapshotChannel, cfg: KelpConfig
) -> None:
    _publish(channel, cfg, 1)
    if isinstance(channel, RedisChannel):
        channel._client.set(channel._key("pin"), b"two")
    else:
        assert isinstance(channel, FilesystemChannel)
        (channel.path / "pin").write_text("two")
    with pytest.raises(ChannelStateError, match="kelp model pin N"):
        channel.target()
