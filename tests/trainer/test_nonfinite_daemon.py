"""A dense model that turns NaN mid-run: training goes on, every step is skipped, nothing is written.

The real ``kelp train`` daemon on the 2000-row Criteo file, a real Redis store
and a real Redis snapshot channel. A NaN is put into one dense parameter after
step 6 (standing in for a diverged model, which the step guard cannot catch
because no single step's gradient was non-finite).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from kelp.config import FileSourceConfig, StoreConfig, load_config
from kelp.daemon.train import TrainDaemon
from kelp.publish import build_channel, load_model
from kelp.trainer.checkpoint import load_latest
from kelp.trainer.models import build_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ROOT / "tests" / "daemon" / "data" / "criteo-2000.tsv"
POISON_AFTER = 6


def test_nan_model_is_never_checkpointed_or_published(tmp_path: Path, redis_url: str) -> None:
    cfg = load_config(ROOT / "examples" / "criteo-kaggle.yaml")
    assert isinstance(cfg.source, FileSourceConfig)
    cfg.source.path = CRITEO
    cfg.deployment = "nonfinite"
    cfg.store = StoreConfig(backend="redis", urls=[redis_url])
    cfg.metrics.enabled = False
    cfg.batching.batch_size = 128  # 16 steps
    cfg.trainer.checkpoint_dir = tmp_path / "checkpoints"
    cfg.trainer.checkpoint_every_steps = 4
    cfg.publisher.enabled = True
    cfg.publisher.channel = "redis"
    cfg.publisher.interval_s = 0.01

    def on_step(step: int, _batch: Any, result: Any) -> None:
        if step == POISON_AFTER:
            assert result.skipped is None
            with torch.no_grad():
                next(daemon.step.model.parameters()).view(-1)[0] = float("nan")

    daemon = TrainDaemon(cfg, on_step=on_step)
    report = daemon.run()
    value = daemon.registry.get_sample_value

    assert report.stopped_by == "source exhausted"  # the trainer never stopped for it
    assert report.steps == POISON_AFTER
    skipped = value("kelp_trainer_steps_skipped_total", {"reason": "nonfinite_loss"})
    assert skipped == 16 - POISON_AFTER
    # Their samples were read and committed, never trained: counted, and said in the summary.
    assert report.samples == POISON_AFTER * 128
    skipped_samples = 2000 - report.samples  # the file's rows, none rejected
    assert value("kelp_trainer_samples_skipped_total", {"reason": "nonfinite_loss"}) == skipped_samples
    assert report.summary is not None
    lines = report.summary.lines()
    line = f"steps skipped, not trained (NaN or inf loss/gradient): {16 - POISON_AFTER}"
    assert any(line in text for text in lines)
    line = f"samples skipped, not trained (their step was skipped): {skipped_samples:,} (nonfinite_loss"
    assert any(line in text for text in lines)
    assert report.summary.skipped_samples == {"nonfinite_loss": skipped_samples}
    assert math.isfinite(report.summary.log_loss)  # skipped batches are not scored

    # Checkpoints: step 4 was written; every later one was refused; `latest` still names step 4.
    assert value("kelp_trainer_checkpoints_total", {"result": "refused_nonfinite"}) >= 2
    restored = build_model(cfg.features, cfg.trainer)
    info = load_latest(cfg.trainer.checkpoint_dir, restored)
    assert info is not None and info.step == 4
    assert all(bool(torch.isfinite(t).all()) for t in restored.state_dict().values())

    # Snapshots: refused once the model is NaN; the channel's latest is the last good one.
    assert value("kelp_publisher_snapshots_total", {"result": "refused_nonfinite"}) >= 1
    assert (value("kelp_publisher_snapshots_total", {"result": "ok"}) or 0) >= 1
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel:
        latest = channel.latest_version()
        assert latest is not None
        snapshot = channel.read(latest)
    assert snapshot.manifest.step < POISON_AFTER  # poisoned before step 6's publish
    served = load_model(snapshot, cfg.features)  # finite, or load_model would reject it
    assert all(bool(torch.isfinite(t).all()) for t in served.state_dict().values())
