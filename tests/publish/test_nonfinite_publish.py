"""Weights holding NaN or an infinity are never published, and never loaded from a channel."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from prometheus_client import CollectorRegistry
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from kelp.config import KelpConfig
from kelp.publish import Publisher, PublisherMetrics, SnapshotChannel, SnapshotRejectedError, build_snapshot
from kelp.publish.snapshot import Snapshot, _checksum, load_model
from kelp.trainer import build_model
from kelp.trainer.finite import NonFiniteError


def _poison(model: torch.nn.Module) -> str:
    name, tensor = list(model.state_dict().items())[2]
    with torch.no_grad():
        tensor.view(-1)[0] = float("nan")
    return name


def test_nonfinite_snapshot_is_refused_and_latest_stays(cfg: KelpConfig, channel: SnapshotChannel) -> None:
    registry = CollectorRegistry()
    pub = Publisher(
        channel,
        cfg.features,
        cfg.trainer,
        interval_s=5.0,
        keep_versions=3,
        metrics=PublisherMetrics(registry),
    )
    model = build_model(cfg.features, cfg.trainer)
    assert pub.publish(model, step=1, offsets={}) == 1
    bad = _poison(model)

    assert pub.publish(model, step=2, offsets={}) is None
    assert pub.maybe_publish(model, step=3, offsets={}, force=True) is None  # the drain's publish too

    assert channel.latest_version() == 1 and channel.versions() == [1]
    assert pub.publish(build_model(cfg.features, cfg.trainer), step=4, offsets={}) == 2  # no version burnt
    assert registry.get_sample_value("kelp_publisher_snapshots_total", {"result": "refused_nonfinite"}) == 2
    assert registry.get_sample_value("kelp_publisher_snapshots_total", {"result": "ok"}) == 2
    assert registry.get_sample_value("kelp_publisher_snapshots_total", {"result": "failed"}) is None
    served = load_model(channel.read(1), cfg.features)
    assert bool(torch.isfinite(served.state_dict()[bad]).all())


def test_build_snapshot_names_the_bad_tensor(cfg: KelpConfig) -> None:
    model = build_model(cfg.features, cfg.trainer)
    bad = _poison(model)
    with pytest.raises(NonFiniteError, match=f"snapshot v7 \\(step 3\\) refused: tensor '{bad}'"):
        build_snapshot(model, cfg.features, cfg.trainer, version=7, step=3, offsets={})


def test_load_model_rejects_nonfinite_weights(cfg: KelpConfig) -> None:
    """A snapshot that reached a channel some other way (an older publisher, a hand copy) never loads."""
    model = build_model(cfg.features, cfg.trainer)
    good = build_snapshot(model, cfg.features, cfg.trainer, version=4, step=1, offsets={})
    tensors = st_load(good.weights)
    name = sorted(tensors)[0]
    tensors[name].view(-1)[-1] = float("-inf")
    weights = st_save(tensors)
    manifest = replace(good.manifest, weights_bytes=len(weights), checksum="")
    snapshot = Snapshot(replace(manifest, checksum=_checksum(manifest, weights)), weights)

    with pytest.raises(
        SnapshotRejectedError, match=f"snapshot v4: tensor '{name}' holds a non-finite"
    ) as caught:
        load_model(snapshot, cfg.features)
    assert caught.value.reason == "nonfinite"
