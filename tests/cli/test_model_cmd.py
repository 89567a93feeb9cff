"""``kelp model list`` shows step, age and quality per version; ``rollback`` never pins the same weights.

On the filesystem channel (the Redis channel shares the code path: both are
read through ``SnapshotChannel``), with ``kelp model`` run in-process.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry
from serving.helpers import small_config

from kelp.cli.main import main
from kelp.config import KelpConfig
from kelp.publish import Publisher, PublisherMetrics, build_snapshot
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.snapshot import Snapshot, _checksum
from kelp.trainer import build_model
from kelp.trainer.evaluation import ProgressiveValidator


def _older_snapshot(cfg: KelpConfig, version: int) -> Snapshot:
    """A snapshot as Kelp wrote it before manifests recorded the weights' digest and the quality."""
    built = build_snapshot(
        build_model(cfg.features, cfg.trainer), cfg.features, cfg.trainer, version=version, step=7, offsets={}
    )
    manifest = dataclasses.replace(built.manifest, dense_sha256=None, quality=None)
    return Snapshot(dataclasses.replace(manifest, checksum=_checksum(manifest, built.weights)), built.weights)


@pytest.fixture
def deployment(tmp_path: Path) -> tuple[KelpConfig, Path]:
    cfg = small_config(
        "redis://127.0.0.1:1", tmp_path, publisher={"channel": "filesystem", "path": str(tmp_path / "snaps")}
    )
    config = tmp_path / "kelp.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return cfg, config


def test_list_shows_step_age_and_quality_and_rollback_skips_a_repeat(
    deployment: tuple[KelpConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, config = deployment
    assert cfg.publisher.path is not None
    channel = FilesystemChannel(cfg.publisher.path)
    channel.write(_older_snapshot(cfg, channel.next_version()))  # v1
    validator = ProgressiveValidator(window_batches=4)
    labels = np.tile(np.array([0.0, 1.0], dtype=np.float32), 32)
    validator.update(labels, labels * 4.0 - 2.0)  # every score on the right side: AUC 1
    publisher = Publisher(
        channel,
        cfg.features,
        cfg.trainer,
        interval_s=60,
        keep_versions=5,
        metrics=PublisherMetrics(CollectorRegistry()),
        validator=validator,
    )
    model = build_model(cfg.features, cfg.trainer)
    assert publisher.publish(model, step=394, offsets={}) == 2
    # v3 repeats v2's weights, as the drain's publish did before the publisher skipped repeats.
    channel.write(
        build_snapshot(model, cfg.features, cfg.trainer, version=channel.next_version(), step=394, offsets={})
    )

    assert main(["model", "list", "--config", str(config)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["version"][:7] == ["version", "created", "(UTC)", "age", "step", "auc", "logloss"]
    assert rows["1"][4:7] == ["7", "-", "-"]  # v, date, time, age, step, auc, logloss: none recorded
    assert rows["2"][4:6] == ["394", "1.0000"] and float(rows["2"][6]) > 0
    assert all(re.fullmatch(r"\d+[smhd]", rows[v][3]) for v in ("1", "2", "3"))  # an age, e.g. 3s
    assert rows["3"][-1] == "latest"

    assert main(["model", "rollback", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "pinned v1 (replicas served v3; skipped v2: same weights as v3)" in out
    assert "embedding rows keep their newest state" in out
    assert channel.pinned_version() == 1
