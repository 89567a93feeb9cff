"""Publisher: interval and force, metrics, failures, and what build_publisher accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from serving.helpers import small_config

from kelp.config import KelpConfig
from kelp.errors import UserError
from kelp.harness import free_port
from kelp.publish import ChannelUnavailableError, Publisher, PublisherMetrics, build_publisher
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.redis_channel import RedisChannel
from kelp.trainer import build_model


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_interval_and_force(tmp_path: Path, cfg: KelpConfig) -> None:
    clock = Clock()
    registry = CollectorRegistry()
    pub = Publisher(
        FilesystemChannel(tmp_path / "s"),
        cfg.features,
        cfg.trainer,
        interval_s=5.0,
        keep_versions=2,
        metrics=PublisherMetrics(registry),
        clock=clock,
    )
    model = build_model(cfg.features, cfg.trainer)
    assert pub.maybe_publish(model, step=1, offsets={}) == 1  # the first call publishes
    clock.now += 4.9
    assert pub.maybe_publish(model, step=2, offsets={}) is None
    assert pub.maybe_publish(model, step=3, offsets={}, force=True) == 2  # shutdown
    clock.now += 5.0
    assert pub.maybe_publish(model, step=4, offsets={}) == 3
    assert _value(registry, "kelp_publisher_snapshots_total", result="ok") == 3
    assert _value(registry, "kelp_publisher_version") == 3
    assert (_value(registry, "kelp_publisher_snapshot_bytes") or 0) > 0
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "latest",
        "snap-000000000002.json",
        "snap-000000000002.safetensors",
        "snap-000000000003.json",
        "snap-000000000003.safetensors",
    ]


def test_unreachable_redis_is_retriable_and_not_retried_until_due(tmp_path: Path) -> None:
    cfg = small_config(f"redis://127.0.0.1:{free_port()}", tmp_path)
    registry = CollectorRegistry()
    clock = Clock()
    pub = build_publisher(cfg, registry)
    pub._clock = clock
    model = build_model(cfg.features, cfg.trainer)
    with pytest.raises(ChannelUnavailableError) as info:
        pub.maybe_publish(model, step=1, offsets={})
    assert info.value.retriable
    assert _value(registry, "kelp_publisher_snapshots_total", result="failed") == 1
    assert _value(registry, "kelp_publisher_failures_total", reason="unavailable") == 1
    assert pub.maybe_publish(model, step=2, offsets={}) is None  # waits an interval, no hot loop
    pub.close()


def test_build_publisher_channels(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path)
    pub = build_publisher(cfg, CollectorRegistry())
    assert isinstance(pub.channel, RedisChannel) and pub.channel.deployment == cfg.deployment
    pub.close()
    fs = small_config(redis_url, tmp_path, publisher={"channel": "filesystem", "path": str(tmp_path / "p")})
    assert isinstance(build_publisher(fs, CollectorRegistry()).channel, FilesystemChannel)


def test_memory_store_with_redis_channel_needs_a_url(tmp_path: Path, redis_url: str) -> None:
    # Refused when the config is loaded (kelp config validate says so too), not when publishing starts.
    with pytest.raises(UserError, match=r"publisher\.channel: .*publisher\.redis_url is not set"):
        small_config("redis://x:1", tmp_path, store={"backend": "memory", "urls": []})
    ok = small_config(
        "redis://x:1", tmp_path, store={"backend": "memory", "urls": []}, publisher={"redis_url": redis_url}
    )
    pub = build_publisher(ok, CollectorRegistry())
    assert pub.maybe_publish(build_model(ok.features, ok.trainer), step=1, offsets={}) == 1
    pub.close()
