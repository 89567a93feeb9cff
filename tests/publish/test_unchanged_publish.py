"""A version is never a repeat of the last one, and a restarted publisher knows what the channel holds.

The periodic publish and the drain's at one step, or a restart that trained
nothing, used to write a second version of the same weights, which made
``kelp model rollback`` a no-op; and a restarted trainer's
``kelp_publisher_version`` read 0 until it published, while the channel held v9.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from serving.helpers import small_config

from kelp.config import KelpConfig
from kelp.publish import Publisher, PublisherMetrics, SnapshotChannel, build_publisher
from kelp.trainer import build_model
from kelp.trainer.evaluation import ProgressiveValidator

pytestmark = pytest.mark.integration


def _validator() -> ProgressiveValidator:
    """A validator that has scored two batches, so the manifest has an AUC and a log loss to record."""
    rng = np.random.default_rng(0)
    validator = ProgressiveValidator(window_batches=4)
    for _ in range(2):
        labels = rng.integers(0, 2, size=64).astype(np.float32)
        validator.update(labels, labels * 2.0 - 1.0 + rng.normal(size=64))
    return validator


def _publisher(channel: SnapshotChannel, cfg: KelpConfig, registry: CollectorRegistry) -> Publisher:
    publisher = Publisher(
        channel,
        cfg.features,
        cfg.trainer,
        interval_s=60,
        keep_versions=5,
        metrics=PublisherMetrics(registry),
        validator=_validator(),
    )
    publisher.adopt_channel_state()
    return publisher


def _count(registry: CollectorRegistry, result: str) -> float:
    return registry.get_sample_value("kelp_publisher_snapshots_total", {"result": result}) or 0.0


def test_a_publish_identical_to_the_last_is_skipped(channel: SnapshotChannel, cfg: KelpConfig) -> None:
    registry = CollectorRegistry()
    model = build_model(cfg.features, cfg.trainer)
    publisher = _publisher(channel, cfg, registry)
    assert publisher.maybe_publish(model, step=394, offsets={}) == 1  # the periodic publish
    assert publisher.maybe_publish(model, step=394, offsets={}, force=True) == 1  # the drain's: same weights
    assert channel.versions() == [1]
    assert (_count(registry, "ok"), _count(registry, "unchanged")) == (1, 1)
    manifest = channel.read(1).manifest
    assert manifest.dense_sha256 and manifest.quality is not None
    assert 0.0 < manifest.quality["window_auc"] <= 1.0 and manifest.quality["samples"] == 128  # type: ignore[operator]

    restarted = _publisher(channel, cfg, CollectorRegistry())  # a restart that trained nothing
    assert restarted.maybe_publish(model, step=394, offsets={}, force=True) == 1
    assert channel.versions() == [1]
    with torch.no_grad():
        next(model.parameters()).add_(0.5)
    assert restarted.maybe_publish(model, step=394, offsets={}, force=True) == 2  # other weights: published
    assert restarted.maybe_publish(model, step=395, offsets={}, force=True) == 3  # another step: published


def test_the_version_gauge_reads_the_channel_after_a_restart(redis_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = small_config(redis_url, tmp_path)
    first = build_publisher(cfg, CollectorRegistry())
    model = build_model(cfg.features, cfg.trainer)
    for step in (1, 2, 3):
        first.maybe_publish(model, step=step, offsets={}, force=True)
    created = first.channel.read(3).manifest.created_at
    first.close()

    registry = CollectorRegistry()
    restarted = build_publisher(cfg, registry)  # nothing published by this process yet
    try:
        assert registry.get_sample_value("kelp_publisher_version") == 3
        assert registry.get_sample_value("kelp_publisher_last_publish_timestamp_seconds") == created
    finally:
        restarted.close()
