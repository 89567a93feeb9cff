"""The snapshot format: round trip, checksum over both parts, and clear rejections."""

from __future__ import annotations

import json

import pytest
import torch
from serving.helpers import small_config

from kelp.config import KelpConfig
from kelp.publish import SnapshotRejectedError, build_snapshot, load_model, verify_snapshot
from kelp.trainer import ModelInput, build_model


def _snapshot(cfg: KelpConfig, seed: int = 0):  # type: ignore[no-untyped-def]
    trainer = cfg.trainer.model_copy(update={"seed": seed})  # build_model seeds from the config
    model = build_model(cfg.features, trainer)
    snap = build_snapshot(model, cfg.features, cfg.trainer, version=7, step=40, offsets={("ev", 1): 99})
    return model, snap


def test_round_trip_gives_the_same_model(cfg: KelpConfig) -> None:
    model, snap = _snapshot(cfg)
    again = verify_snapshot(snap.manifest.to_json(), snap.weights)
    assert again.manifest == snap.manifest
    assert again.manifest.offsets == {("ev", 1): 99} and again.manifest.step == 40
    loaded = load_model(again, cfg.features)
    dense = torch.randn(5, 2)
    batch = ModelInput(dense, {f.name: torch.randn(5, 4) for f in cfg.features.sparse})
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch), model(batch), rtol=0, atol=0)
    assert not any(p.requires_grad for p in loaded.parameters())
    assert snap.weights[:8] != b"\x80\x04"  # safetensors, not a pickle stream


@pytest.mark.parametrize(
    "tamper",
    [
        lambda m, w: (m, w[:-10]),  # truncated weights (partial write)
        lambda m, w: (m, w[:100] + bytes([w[100] ^ 1]) + w[101:]),  # one flipped bit
        lambda m, w: (m.replace(b'"step":40', b'"step":41'), w),  # manifest edited
    ],
    ids=["truncated", "bit_flip", "manifest_edit"],
)
def test_corruption_is_a_checksum_rejection(cfg: KelpConfig, tamper) -> None:  # type: ignore[no-untyped-def]
    _, snap = _snapshot(cfg)
    manifest, weights = tamper(snap.manifest.to_json(), snap.weights)
    with pytest.raises(SnapshotRejectedError) as info:
        verify_snapshot(manifest, weights)
    assert info.value.reason == "checksum"


def test_weights_of_another_snapshot_are_rejected(cfg: KelpConfig) -> None:
    _, a = _snapshot(cfg, seed=1)
    _, b = _snapshot(cfg, seed=2)
    assert len(a.weights) == len(b.weights)
    with pytest.raises(SnapshotRejectedError, match="checksum"):
        verify_snapshot(a.manifest.to_json(), b.weights)


@pytest.mark.parametrize("raw", [b"not json", b"[]", json.dumps({"format_version": 99}).encode()])
def test_unreadable_manifest_is_a_format_rejection(raw: bytes) -> None:
    with pytest.raises(SnapshotRejectedError) as info:
        verify_snapshot(raw, b"")
    assert info.value.reason == "format"


def test_snapshot_for_other_features_is_incompatible(cfg: KelpConfig, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, snap = _snapshot(cfg)
    other = small_config("redis://127.0.0.1:1", tmp_path, features={"dense": [{"name": "I9"}]})
    with pytest.raises(SnapshotRejectedError) as info:
        load_model(snap, other.features)
    assert info.value.reason == "incompatible"
