"""The trainer's row-snapshot schedule (``snapshots.rows.every_s``).

The schedule's rules (full every ``full_every``-th, never two at once, a
failure counted and retried) on its own; then the whole loop on real Redis and
Kafka: a snapshot taken while training, ``FLUSHALL``, ``kelp store restore``,
and training resumes where the snapshot was, with no record lost.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis
from prometheus_client import CollectorRegistry

from kelp.cli.main import main
from kelp.config import StoreConfig
from kelp.daemon.row_snapshot_schedule import RowSnapshotSchedule
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker
from kelp.store.snapshots.catalog import list_snapshots
from kelp.store.snapshots.storage import open_storage
from kelp.trainer import build_model
from kelp.trainer.checkpoint import save_checkpoint

from .conftest import (
    CRITEO_ROWS,
    Running,
    base_config,
    group_offsets,
    on_kafka,
    wait_for,
    write_config,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Manifest:
    def __init__(self, n: int) -> None:
        self.snapshot_id = f"snap-{n}"
        self.shards = [type("Shard", (), {"rows": 10})()]


def _checkpoint(tmp_path: Path, step: int) -> Path:
    cfg = base_config(tmp_path)
    model = build_model(cfg.features, cfg.trainer)
    offsets = {("events", 0): 100 + step}
    return save_checkpoint(tmp_path / "ckpt", model, None, step=step, config_hash="x", offsets=offsets)


def test_full_every_nth_never_two_at_once_and_a_failure_is_retried(tmp_path: Path) -> None:
    cfg = base_config(tmp_path)
    cfg.snapshots.rows.url = str(tmp_path / "snaps")
    cfg.snapshots.rows.every_s = 10.0
    cfg.snapshots.rows.full_every = 2
    calls: list[dict[str, Any]] = []
    release = threading.Event()
    fail_next = [False]

    def take(_cfg: Any, **kwargs: Any) -> _Manifest:
        release.wait(30)
        if fail_next[0]:
            fail_next[0] = False
            raise RuntimeError("storage unreachable")
        calls.append(kwargs)
        return _Manifest(len(calls))

    registry = CollectorRegistry()
    clock = _Clock()
    pruned: list[object] = []
    schedule = RowSnapshotSchedule(cfg, registry, take=take, prune=pruned.append, clock=clock)
    assert not schedule.due()
    clock.now = 10.0
    assert schedule.due()
    assert schedule.start(5, 1, _checkpoint(tmp_path, 5)) is not None
    clock.now = 25.0
    assert not schedule.due()  # one is running: never a second
    release.set()
    assert schedule.wait(30)
    assert schedule.due()
    schedule.start(9, 1, _checkpoint(tmp_path, 9))
    assert schedule.wait(30)
    fail_next[0] = True
    clock.now = 40.0
    schedule.start(12, 1, _checkpoint(tmp_path, 12))
    assert schedule.wait(30)
    assert schedule.last_error == "storage unreachable"
    clock.now = 55.0
    schedule.start(14, 1, _checkpoint(tmp_path, 14))  # retried the next period: still the full one's turn
    assert schedule.wait(30)

    assert [c["incremental"] for c in calls] == [False, True, False]
    assert [c["barrier"]["step"] for c in calls] == [5, 9, 14]
    assert calls[0]["offsets"] == [{"topic": "events", "partition": 0, "offset": 105}]  # the checkpoint's
    assert len(pruned) == 3
    value = registry.get_sample_value
    assert value("kelp_row_snapshots_total", {"outcome": "ok"}) == 3
    assert value("kelp_row_snapshots_total", {"outcome": "failed"}) == 1
    assert value("kelp_row_snapshot_rows") == 10
    assert (value("kelp_row_snapshot_last_success_timestamp_seconds") or 0) > 0
    schedule.close()


def test_snapshot_while_training_flushall_restore_resume(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    window = 8
    cfg = on_kafka(base_config(tmp_path), kafka_broker, criteo_topic, redis_url)
    cfg.batching.batch_size = 32  # ~63 steps over the fixture
    cfg.snapshots.rows.url = str(tmp_path / "snaps")
    cfg.snapshots.rows.every_s = 0.5
    cfg.trainer.max_steps = 30
    first = Running(TrainDaemon(cfg, http=False))
    first.thread.join(120)  # max_steps, then the drain (which lets a running snapshot finish)
    scratch = first.stop()
    storage = open_storage(cfg.snapshots.rows.url)
    snapshots = list_snapshots(storage, cfg.deployment)
    assert snapshots, "no snapshot was taken while training"
    snap = snapshots[-1]
    barrier = snap.consistency["barrier_step"]
    assert 0 < barrier <= scratch.steps
    assert snap.checkpoint is not None
    offsets = sum(o["offset"] for o in snap.offsets)
    assert 0 < offsets < CRITEO_ROWS

    redis.Redis.from_url(redis_url).flushall()  # every row gone
    config = write_config(cfg, tmp_path / "kelp.yaml")
    assert main(["store", "restore", "--config", str(config), "--snapshot", "latest", "--replace"]) == 0

    cfg.trainer.max_steps = None
    resumed = Running(TrainDaemon(cfg, http=False))
    group = cfg.source.group_id  # type: ignore[union-attr]
    wait_for(lambda: sum(group_offsets(kafka_broker, group, criteo_topic)) >= CRITEO_ROWS, 120, "the rest")
    report = resumed.stop()
    assert report.first_step == barrier  # the trainer resumed from the snapshot's checkpoint
    assert report.samples == CRITEO_ROWS - offsets  # from the snapshot's offsets: none lost, none skipped
    # The resumed model starts where the snapshot was, not from scratch.
    assert np.mean(report.losses[:window]) < np.mean(scratch.losses[:window])


def test_inline_writer_with_a_working_copy_flushes_at_the_barrier(tmp_path: Path, redis_url: str) -> None:
    """``prefetch_batches: 0`` has no writer thread: the barrier writes the working copy back itself."""
    cfg = base_config(tmp_path, prefetch_batches=0)
    cfg.store = StoreConfig(backend="redis", urls=[redis_url], hot_cache={"enabled": True})
    cfg.batching.batch_size = 64
    cfg.snapshots.rows.url = str(tmp_path / "snaps")
    cfg.snapshots.rows.every_s = 0.2
    cfg.metrics.enabled = False
    daemon = TrainDaemon(cfg, http=False, on_step=lambda *_: time.sleep(0.02))  # a few periods long
    daemon.run()
    value = daemon.registry.get_sample_value
    assert (value("kelp_row_snapshots_total", {"outcome": "ok"}) or 0) >= 1
    assert value("kelp_row_snapshots_total", {"outcome": "failed"}) == 0
    (first, *_) = list_snapshots(open_storage(cfg.snapshots.rows.url), cfg.deployment)
    assert first.kind == "full" and first.total_rows > 0 and first.consistency["barrier_step"] > 0


def test_the_barrier_waits_for_owned_row_updates_of_steps_without_a_batch(tmp_path: Path) -> None:
    """In a group with row owners a rank without a batch still applies other ranks' updates to the
    rows it owns: the barrier waits for those steps too, not only the ones it trained."""
    from types import SimpleNamespace

    cfg = base_config(tmp_path)
    cfg.trainer.drain_timeout_s = 0.2
    daemon = TrainDaemon(cfg, http=False)
    daemon._last_trained_step = 3
    ledger = SimpleNamespace(acked=4)
    daemon.pipeline = SimpleNamespace(  # type: ignore[assignment]
        ledger=ledger, owned_rows_submitted_step=5, working_copy=None, committed_step=0
    )
    assert not daemon._flush_barrier()  # step 5's owned rows are not acknowledged yet
    ledger.acked = 5
    assert daemon._flush_barrier()
