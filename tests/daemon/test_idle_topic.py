"""A trainer on a topic gone quiet keeps its periodic work: publish, checkpoint, progress record, gauges.

A burst is trained, then nothing more arrives. The model trained by the burst's
last step must still reach serving, the checkpoint and the run's record within
their intervals, and the AUC gauge must be exported, although no batch
follows that step. On real Kafka and redis-server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kelp.config import PublisherConfig, load_config
from kelp.daemon.progress_log import PROGRESS_FILE
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.snapshot import SnapshotManifest
from kelp.trainer.checkpoint import read_checkpoint

from .conftest import CRITEO_ROWS, Running, base_config, group_offsets, on_kafka, wait_for, write_config
from .test_train_group import _all_committed, _group_config, _launch, _stop

pytestmark = pytest.mark.integration


class _LastStep:
    """The step number and wall time of the last step trained (``on_step`` runs on the loop's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.step = 0
        self.at = 0.0

    def __call__(self, step: int, _batch: Any, _result: Any) -> None:
        with self._lock:
            self.step, self.at = step, time.time()


def _published_step(channel: FilesystemChannel) -> tuple[int, float] | None:
    """The step and creation time of the latest snapshot; None before the first."""
    version = channel.latest_version()
    if version is None:
        return None
    manifest = SnapshotManifest.from_json(channel.read_raw(version)[0])
    return manifest.step, manifest.created_at


def _checkpoint_step(directory: Path) -> int | None:
    latest = directory / "latest"
    return json.loads(latest.read_text())["step"] if latest.exists() else None


def _last_point(directory: Path) -> dict[str, Any] | None:
    path = directory / PROGRESS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else None


def test_after_a_burst_the_idle_trainer_publishes_checkpoints_records_and_exports_auc(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    cfg = base_config(tmp_path, checkpoint_every_steps=10_000, checkpoint_every_s=1.0, progress_every_s=1.0)
    cfg = on_kafka(cfg, kafka_broker, criteo_topic, redis_url)
    cfg.publisher = PublisherConfig(channel="filesystem", path=tmp_path / "snapshots", interval_s=1.0)
    checkpoints = cfg.trainer.checkpoint_dir
    last = _LastStep()
    daemon = TrainDaemon(cfg, on_step=last)
    running = Running(daemon)
    try:
        wait_for(lambda: daemon.report.samples >= CRITEO_ROWS, 120, "the burst trained")
        final, trained_at = last.step, last.at
        channel = FilesystemChannel(cfg.publisher.path)

        published = wait_for(
            lambda: (got := _published_step(channel)) and got[0] == final and got,
            60,
            f"a snapshot of step {final}, the burst's last",
        )
        assert published[1] >= trained_at
        wait_for(lambda: _checkpoint_step(checkpoints) == final, 60, f"a checkpoint at step {final}")
        point = wait_for(
            lambda: (p := _last_point(checkpoints)) and p["samples"] == CRITEO_ROWS and p,
            60,
            "a progress record of the whole burst",
        )
        assert point["step"] == final and point["t"] >= round(trained_at, 3) - 0.001

        def exported(series: str) -> str | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{cfg.metrics.port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
            return found.group(1) if found else None

        wait_for(
            lambda: exported('kelp_trainer_samples_per_second{rank="0"}') == "0.0",
            60,
            "the throughput gauge to say the trainer is idle",
        )
        # Read once the trainer is idle: the gauge may still take the burst's last evaluation
        # until then; after it, idle progress ticks must leave it as it is.
        auc = wait_for(lambda: exported('kelp_trainer_auc{rank="0",window="window"}'), 60, "the AUC exported")
        assert 0.0 < float(auc) < 1.0
        time.sleep(3 * cfg.trainer.progress_every_s)
        assert exported('kelp_trainer_auc{rank="0",window="window"}') == auc  # the last AUC stays
        assert daemon.report.samples == CRITEO_ROWS and last.step == final  # the topic stayed idle
        assert daemon.readiness() == (True, "ready")
    finally:
        report = running.stop()
    assert report.steps == final


def _whole_topic_checkpoint(directory: Path) -> dict[str, Any] | None:
    """The latest checkpoint's metadata once its trained-through offsets cover every record."""
    latest = directory / "latest"
    if not latest.exists():
        return None
    _, meta = read_checkpoint(directory / json.loads(latest.read_text())["file"])
    return meta if sum(o["offset"] for o in meta["offsets"]) == CRITEO_ROWS else None


def test_an_idle_group_agrees_on_its_clock_checkpoint(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    """Two ranks, only the clock checkpoints: the model after the last batch is checkpointed while idle.

    Every rank must reach the checkpoint's gather at the same round although
    none has a batch, and the replicas it records must be equal.
    """
    config = _group_config(tmp_path, kafka_broker, criteo_topic, redis_url)
    cfg = load_config(config)
    cfg.trainer.checkpoint_every_steps = 10_000
    cfg.trainer.checkpoint_every_s = 1.0
    write_config(cfg, config)
    log_path = tmp_path / "group.log"
    proc = _launch(config, log_path)
    try:
        wait_for(
            lambda: _all_committed(kafka_broker, cfg.source.group_id, criteo_topic, proc), 150, "every record"
        )
        meta = wait_for(
            lambda: _whole_topic_checkpoint(cfg.trainer.checkpoint_dir) or proc.poll() is not None,
            60,
            "a checkpoint of the whole topic before the drain",
        )
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert [r["rank"] for r in meta["ranks"]] == [0, 1]
        assert len({r["dense_sha256"] for r in meta["ranks"]}) == 1, meta["ranks"]
        assert sum(group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)) == CRITEO_ROWS
        assert _stop(proc) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
