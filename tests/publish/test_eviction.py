"""A snapshot its Redis evicts is never a successful publish, and an evicting policy is warned about at start.

Each test runs its own redis-server with ``maxmemory-policy allkeys-lfu`` (the
policy docs/store.md recommends for the store's rows), so the shared server's
settings are never touched.

A lone publish cannot evict its own hash: Redis checks memory *before* each
command, and the publish script's arguments are as large as the hash it
stores. Eviction comes from other clients' writes (the store's rows) landing
between the publish script and the next read, which is when the freshly
written, never-read hash (the lowest LFU count) goes first. The test puts
exactly such a write there, on a second connection, by running it when the
channel is about to read the snapshot back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from serving.helpers import small_config

from kelp.config import KelpConfig
from kelp.harness import RedisServer
from kelp.publish import (
    Publisher,
    PublisherMetrics,
    SnapshotMissingError,
    SnapshotNotStoredError,
    build_publisher,
)
from kelp.publish.redis_channel import RedisChannel
from kelp.trainer import build_model

pytestmark = pytest.mark.integration

DEPLOYMENT = "evict"


@pytest.fixture
def lfu_server() -> Iterator[RedisServer]:
    with RedisServer(extra_args=["--maxmemory-policy", "allkeys-lfu"]) as server:
        yield server


@pytest.fixture
def big_cfg(lfu_server: RedisServer, tmp_path: Path) -> KelpConfig:
    """A dense model of about half a megabyte, so its snapshot dwarfs the channel's other keys."""
    return small_config(
        lfu_server.url, tmp_path, trainer={"bottom_mlp": [512, 256]}, publisher={"redis_url": lfu_server.url}
    )


class RowsArriveMeanwhile(RedisChannel):
    """The channel, with another client's writes filling memory right after the publish script."""

    def __init__(self, server: RedisServer, rows_bytes: int) -> None:
        super().__init__(server.client(), DEPLOYMENT, server.url)
        self._server = server
        self._rows_bytes = rows_bytes

    def _check_stored(self, version: int, manifest: bytes | str, weights_bytes: int) -> None:
        other = self._server.client()
        try:
            used = int(other.info("memory")["used_memory"])
            other.config_set("maxmemory", used + self._rows_bytes // 2)  # "tiny": what is in use, and a bit
            with contextlib.suppress(redis.exceptions.ResponseError):  # OOM once nothing is left to evict
                other.set("rows", b"r" * self._rows_bytes)
        finally:
            other.close()
        super()._check_stored(version, manifest, weights_bytes)


def _sample(pub: Publisher, name: str, **labels: str) -> float | None:
    return pub.metrics.registry.get_sample_value(name, labels)


def test_an_evicted_snapshot_is_a_failed_publish(lfu_server: RedisServer, big_cfg: KelpConfig) -> None:
    model = build_model(big_cfg.features, big_cfg.trainer)
    weights_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    channel = RowsArriveMeanwhile(lfu_server, weights_bytes)
    pub = Publisher(
        channel,
        big_cfg.features,
        big_cfg.trainer,
        interval_s=60,
        keep_versions=2,
        metrics=PublisherMetrics(CollectorRegistry()),
    )
    try:
        with pytest.raises(SnapshotNotStoredError) as info:
            pub.publish(model, step=1, offsets={})
        assert info.value.reason == "evicted" and info.value.version == 1
        message = str(info.value)
        assert "v1 was written but" in message and "evicted" in message and "\n" not in message
        assert _sample(pub, "kelp_publisher_snapshots_total", result="ok") is None
        assert _sample(pub, "kelp_publisher_snapshots_total", result="failed") == 1
        assert _sample(pub, "kelp_publisher_failures_total", reason="evicted") == 1
        assert _sample(pub, "kelp_publisher_version") == 0  # the gauge never named the lost version
        assert pub.last_version is None
        with pytest.raises(SnapshotMissingError):  # what a replica would have met
            channel.read(1)
    finally:
        pub.close()


def test_an_evicting_policy_is_warned_about_at_start(
    lfu_server: RedisServer, big_cfg: KelpConfig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kelp.publish"):
        build_publisher(big_cfg, CollectorRegistry()).close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "maxmemory-policy allkeys-lfu" in warnings[0] and "noeviction" in warnings[0]
    assert "\n" not in warnings[0]


def test_no_warning_under_noeviction(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kelp.publish"):
        build_publisher(small_config(redis_url, tmp_path), CollectorRegistry()).close()
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]


def test_a_refused_config_get_is_noted_not_fatal(
    lfu_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A least-privilege ACL user (or a managed Redis) may not read CONFIG: publishing still starts."""
    lfu_server.client().acl_setuser(
        "pub", enabled=True, passwords=["+pub-pw"], keys=["*"], channels=["*"], commands=["+@all", "-config"]
    )
    url = f"redis://pub:pub-pw@127.0.0.1:{lfu_server.port}"
    cfg = small_config(lfu_server.url, tmp_path, publisher={"redis_url": url})
    with caplog.at_level(logging.INFO, logger="kelp.publish"):
        pub = build_publisher(cfg, CollectorRegistry())
    try:
        notes = [r for r in caplog.records if "could not check" in r.getMessage()]
        assert len(notes) == 1 and notes[0].levelno == logging.INFO
        assert "pub-pw" not in notes[0].getMessage()
        assert pub.publish(build_model(cfg.features, cfg.trainer), step=1, offsets={}) == 1
    finally:
        pub.close()
