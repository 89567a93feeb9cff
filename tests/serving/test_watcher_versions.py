"""The watcher never goes back to a lower version, and a broken ``latest`` is said once, not every poll.

Both channels on real backends (redis-server, a directory). The channel's keys
or files are wiped or garbled the way eviction or a hand edit would; the
replica keeps serving its model, counts the problem in
``kelp_serving_snapshots_rejected_total{reason}`` and logs one line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.publish import ChannelStateError, Publisher, PublisherMetrics, SnapshotChannel
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.redis_channel import RedisChannel, channel_prefix
from kelp.serving.metrics import ServingMetrics
from kelp.serving.model import ModelSlot
from kelp.serving.watcher import SnapshotWatcher

from .helpers import DEPLOYMENT, constant_model, logit_for, wait_until

pytestmark = pytest.mark.integration

PREFIX = channel_prefix(DEPLOYMENT)


class Channels:
    """A publisher's channel and a replica's own channel on the same backend, and ways to damage it."""

    def __init__(self, kind: str, redis_url: str, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "redis":
            self.client = redis.Redis.from_url(redis_url)
            self.trainer: SnapshotChannel = RedisChannel(
                redis.Redis.from_url(redis_url), DEPLOYMENT, redis_url
            )
            self.replica: SnapshotChannel = RedisChannel(
                redis.Redis.from_url(redis_url), DEPLOYMENT, redis_url
            )
        else:
            self.dir = tmp_path / "snapshots"
            self.trainer = FilesystemChannel(self.dir)
            self.replica = FilesystemChannel(self.dir)

    def wipe(self) -> None:
        """Every key or file of the channel gone (allkeys eviction, FLUSHDB, a wiped volume)."""
        if self.kind == "redis":
            self.client.flushdb()
        else:
            for f in self.dir.iterdir():
                f.unlink()

    def set_latest(self, raw: bytes) -> None:
        if self.kind == "redis":
            self.client.set(f"{PREFIX}:latest", raw)
        else:
            (self.dir / "latest").write_bytes(raw)

    def set_latest_version(self, version: int) -> None:
        self.set_latest(str(version).encode() if self.kind == "redis" else b'{"version": %d}' % version)

    def close(self) -> None:
        self.trainer.close()
        self.replica.close()


@pytest.fixture(params=["redis", "filesystem"])
def channels(request: pytest.FixtureRequest, tmp_path: Path) -> Channels:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    made = Channels(request.param, url, tmp_path)
    request.addfinalizer(made.close)
    return made


def _publisher(channel: SnapshotChannel, cfg: KelpConfig) -> Publisher:
    metrics = PublisherMetrics(CollectorRegistry())
    return Publisher(channel, cfg.features, cfg.trainer, interval_s=60, keep_versions=2, metrics=metrics)


def _publish(pub: Publisher, cfg: KelpConfig, step: int) -> int:
    """A constant model whose logit says which publish it came from (``logit_for(step)``)."""
    return pub.publish(constant_model(cfg, logit_for(step)), step=step, offsets={})


def _watcher(channel: SnapshotChannel, cfg: KelpConfig, poll_interval_s: float = 60.0) -> SnapshotWatcher:
    return SnapshotWatcher(
        channel, cfg.features, ModelSlot(), ServingMetrics(CollectorRegistry()), poll_interval_s
    )


def _rejected(watcher: SnapshotWatcher, reason: str) -> float:
    value = watcher.metrics.registry.get_sample_value(
        "kelp_serving_snapshots_rejected_total", {"reason": reason}
    )
    return value or 0.0


def _served(watcher: SnapshotWatcher) -> tuple[int, int]:
    """``(version, step)`` of the served model: the step tells two snapshots with one number apart."""
    current = watcher.slot.current
    assert current is not None
    return current.version, current.manifest.step


def test_every_key_lost_the_replica_never_goes_back(
    channels: Channels, cfg: KelpConfig, caplog: pytest.LogCaptureFixture
) -> None:
    pub = _publisher(channels.trainer, cfg)
    for step in range(3):
        _publish(pub, cfg, step)
    watcher = _watcher(channels.replica, cfg)
    assert watcher.check_once()
    assert _served(watcher) == (3, 2)

    channels.wipe()
    with pytest.raises(ChannelStateError, match="already published v3"):  # this publisher remembers v3
        _publish(pub, cfg, 10)
    assert not watcher.check_once() and _served(watcher) == (3, 2)

    # A restarted trainer has no memory: the empty channel looks new and numbering starts at 1 again.
    restarted = _publisher(channels.trainer, cfg)
    served = []
    with caplog.at_level(logging.WARNING, logger="kelp.serving"):
        for step in range(20, 24):
            _publish(restarted, cfg, step)
            watcher.check_once()
            served.append(_served(watcher))
    assert [v for v, _ in served] == [3, 3, 3, 4]  # v1 and v2 refused; the new v4 is taken
    assert served[-1] == (4, 23)
    assert _rejected(watcher, "older") == 2
    behind = [r for r in caplog.records if r.name == "kelp.serving" and "below the served" in r.getMessage()]
    assert len(behind) == 1, [r.getMessage() for r in caplog.records]


def test_a_garbage_latest_keeps_the_model_and_is_said_once(
    channels: Channels, cfg: KelpConfig, caplog: pytest.LogCaptureFixture
) -> None:
    pub = _publisher(channels.trainer, cfg)
    _publish(pub, cfg, 0)
    watcher = _watcher(channels.replica, cfg)
    assert watcher.check_once()

    channels.set_latest(b"garbage")
    with caplog.at_level(logging.WARNING, logger="kelp.serving"):
        for _ in range(5):
            assert watcher.check_once() is False  # never raises
    assert _served(watcher) == (1, 0)
    assert _rejected(watcher, "pointer") == 1
    lines = [
        r.getMessage() for r in caplog.records if r.name == "kelp.serving" and r.levelno >= logging.WARNING
    ]
    assert len(lines) == 1 and "'garbage'" in lines[0] and "still serving v1" in lines[0], lines

    channels.set_latest(b"other garbage")  # a new value is a new line
    watcher.check_once()
    assert _rejected(watcher, "pointer") == 2

    channels.set_latest_version(99)  # a number, but of a version the channel does not hold
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kelp.serving"):
        for _ in range(3):
            assert watcher.check_once() is False
    assert _rejected(watcher, "pointer") == 3
    assert [
        r.getMessage() for r in caplog.records if "v99, which the channel does not hold" in r.getMessage()
    ]
    assert _served(watcher) == (1, 0)

    channels.set_latest_version(1)  # repaired: the next publish is taken as usual
    assert _publish(pub, cfg, 5) == 2
    assert watcher.check_once() and _served(watcher) == (2, 5)


def test_the_watcher_thread_logs_a_garbage_latest_once(
    channels: Channels, cfg: KelpConfig, caplog: pytest.LogCaptureFixture
) -> None:
    _publish(_publisher(channels.trainer, cfg), cfg, 0)
    watcher = _watcher(channels.replica, cfg, poll_interval_s=0.05)
    reads = []
    read_latest = channels.replica.latest_version

    def counted() -> int | None:
        reads.append(1)
        return read_latest()

    channels.replica.latest_version = counted  # type: ignore[method-assign]
    channels.set_latest(b"garbage")
    with caplog.at_level(logging.WARNING):
        watcher.start()
        try:
            wait_until(lambda: len(reads) >= 10, what="ten polls of latest")
            assert watcher.last_error is not None and "'garbage'" in watcher.last_error
        finally:
            watcher.stop()
    ours = [r for r in caplog.records if r.name == "kelp.serving"]
    assert [r.levelno for r in ours] == [logging.WARNING], [r.getMessage() for r in ours]
    assert all(r.exc_info is None for r in ours)  # no traceback
    assert _rejected(watcher, "pointer") == 1
    assert watcher.slot.current is None  # nothing was ever loadable: the first check saw the garbage
