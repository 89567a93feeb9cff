"""The trainer's row-snapshot schedule (``snapshots.rows.every_s``): at a flush barrier, in the background.

Every ``every_s`` the trainer (rank 0 of a group) comes to a step boundary N,
waits until every row it trained through step N is in the store (the flush
barrier: every push acknowledged, and with the hot tier written back), writes
a dense checkpoint at N (the usual call, so it holds the dense weights, the
optimizer and the offsets trained through N), and hands that checkpoint to
:func:`kelp.daemon.row_snapshots.take_snapshot` on a thread of its own, which
opens its own store connections. Training goes on meanwhile.

What such a snapshot is consistent with: its offsets and its dense state are
exactly those of step N (the checkpoint's); every row is as of the flush
barrier at step N *or newer*, since training keeps writing while the rows are
scanned. Restoring it and replaying from its offsets trains the steps after N
again on rows that may already hold some of them: at least once, as after any
trainer restart, and nothing acknowledged is lost.

Never two at once: while one runs, the schedule is not due. A failure is
logged with its reason, counted (``kelp_row_snapshots_total{outcome="failed"}``)
and tried again the next period; it never stops training. Of the scheduled
snapshots, the first of a process and then every ``full_every``-th is full,
the others incremental. After each success the storage is pruned to the
newest ``keep`` full snapshots (with their incrementals).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from kelp.config import KelpConfig
from kelp.errors import KelpError
from kelp.metrics import MetricFactory

__all__ = ["RowSnapshotMetrics", "RowSnapshotSchedule", "ScheduledSnapshot", "row_snapshot_schedule"]

log = logging.getLogger("kelp.train.snapshots")


class _Manifest(Protocol):
    """What the schedule reads of a finished snapshot's manifest."""

    snapshot_id: str
    shards: list[Any]


Take = Callable[..., _Manifest]
"""``take_snapshot(config, *, incremental, barrier, checkpoint_path, offsets)``: kelp.daemon.row_snapshots."""
Prune = Callable[[KelpConfig], object]
"""Deletes the snapshots beyond ``snapshots.rows.keep`` full ones."""


class RowSnapshotMetrics:
    """The schedule's metrics, in the trainer's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = MetricFactory("", registry)
        self.total: Counter = m.counter(
            "row_snapshots", "Scheduled row snapshots, by outcome (ok, failed).", ["outcome"]
        )
        self.last_success: Gauge = m.gauge(
            "row_snapshot_last_success_timestamp",
            "Unix time the last scheduled row snapshot finished.",
            unit="seconds",
        )
        self.rows: Gauge = m.gauge("row_snapshot_rows", "Rows written by the last scheduled row snapshot.")
        for outcome in ("ok", "failed"):
            self.total.labels(outcome=outcome)


@dataclass(frozen=True)
class ScheduledSnapshot:
    """One snapshot to take: the barrier step, the group size, and the checkpoint written at that step."""

    step: int
    ranks: int
    checkpoint: Path
    incremental: bool


class RowSnapshotSchedule:
    """When the next snapshot is due, and the background thread that takes it.

    ``take`` and ``prune`` default to :mod:`kelp.daemon.row_snapshots`'s; a
    test passes its own to watch what the schedule asks for.
    """

    def __init__(
        self,
        cfg: KelpConfig,
        registry: CollectorRegistry,
        *,
        take: Take | None = None,
        prune: Prune | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        every_s = cfg.snapshots.rows.every_s
        if every_s is None:
            raise ValueError("snapshots.rows.every_s is not set: no schedule")
        self.cfg = cfg
        self.every_s = every_s
        self.full_every = cfg.snapshots.rows.full_every
        self.metrics = RowSnapshotMetrics(registry)
        self._take = take
        self._prune = prune
        self._clock = clock
        self._next_s = clock() + every_s
        self._taken = 0  # successful scheduled snapshots in this process: picks full or incremental
        self._last_step: int | None = None
        self._thread: threading.Thread | None = None
        self._workdir: Path | None = None  # made at the first snapshot: a follower rank never needs one
        self.last_error: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def due(self) -> bool:
        """The period has passed and no snapshot is running (so a slow one is never doubled)."""
        return not self.running and self._clock() >= self._next_s

    def postpone(self, reason: str) -> None:
        """Skip this period (nothing trained since the last one, or no barrier): try again next period."""
        log.info("row snapshot skipped this period: %s", reason)
        self._next_s = self._clock() + self.every_s

    def fail(self, reason: str) -> None:
        """A snapshot that could not even start (no flush barrier, no checkpoint): counted, retried."""
        self.metrics.total.labels(outcome="failed").inc()
        self.last_error = reason
        log.error("row snapshot failed (retried in %gs): %s", self.every_s, reason)
        self._next_s = self._clock() + self.every_s

    def start(self, step: int, ranks: int, checkpoint: Path) -> ScheduledSnapshot | None:
        """Take a snapshot with barrier ``step`` in the background; None when nothing changed since the last.

        The checkpoint is copied first: the trainer prunes its checkpoints on its
        own schedule, and the snapshot must read the one written at ``step``.
        """
        if self.running:
            return None
        self._next_s = self._clock() + self.every_s
        if self._last_step == step:
            log.info("row snapshot skipped: nothing trained since step %d", step)
            return None
        try:
            if self._workdir is None:
                self._workdir = Path(tempfile.mkdtemp(prefix="kelp-row-snapshot-"))
            copy = self._workdir / f"checkpoint-{step}.safetensors"
            shutil.copyfile(checkpoint, copy)
        except OSError as exc:
            self.fail(f"cannot copy checkpoint {checkpoint}: {exc}")
            return None
        job = ScheduledSnapshot(step, ranks, copy, incremental=self._taken % self.full_every != 0)
        self._thread = threading.Thread(target=self._run, args=(job,), name="kelp-row-snapshot", daemon=True)
        self._thread.start()
        return job

    def wait(self, timeout_s: float) -> bool:
        """Let a running snapshot finish (the drain); False if it is still running after ``timeout_s``."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.running

    def close(self) -> None:
        """Remove the checkpoint copies (a snapshot still running keeps its own open file)."""
        if not self.running and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    # ------------------------------------------------------------------ the snapshot thread

    def _run(self, job: ScheduledSnapshot) -> None:
        started = time.perf_counter()
        try:
            manifest = self._take_one(job)
        except Exception as exc:  # never stops training: logged, counted, retried next period
            self.metrics.total.labels(outcome="failed").inc()
            self.last_error = " ".join(str(exc).split()) or type(exc).__name__
            log.error("row snapshot at step %d failed (retried in %gs): %s", job.step, self.every_s, exc)
            return
        finally:
            job.checkpoint.unlink(missing_ok=True)
        rows = sum(int(getattr(s, "rows", 0)) for s in manifest.shards)
        self._taken += 1
        self._last_step = job.step
        self.last_error = None
        self.metrics.total.labels(outcome="ok").inc()
        self.metrics.last_success.set(time.time())
        self.metrics.rows.set(rows)
        kind = "incremental" if job.incremental else "full"
        log.info(
            "row snapshot %s (%s, barrier step %d): %d rows in %.1fs",
            manifest.snapshot_id,
            kind,
            job.step,
            rows,
            time.perf_counter() - started,
        )
        try:
            self._prune_old()
        except Exception as exc:  # the snapshot is whole; pruning is tried again after the next one
            log.error("pruning old row snapshots failed: %s", exc)

    def _take_one(self, job: ScheduledSnapshot) -> _Manifest:
        from kelp.trainer.checkpoint import read_checkpoint

        _, meta = read_checkpoint(job.checkpoint)
        if meta.get("step") != job.step:  # the dense state and offsets must be the barrier step's
            raise KelpError(
                f"checkpoint {job.checkpoint.name} is of step {meta.get('step')}, "
                f"the barrier is step {job.step}"
            )
        take = self._take
        if take is None:
            from kelp.daemon.row_snapshots import take_snapshot

            take = take_snapshot
        return take(
            self.cfg,
            incremental=job.incremental,
            barrier={"step": job.step, "ranks": job.ranks},
            checkpoint_path=job.checkpoint,
            offsets=list(meta.get("offsets") or []),
        )

    def _prune_old(self) -> None:
        prune = self._prune
        if prune is None:
            from kelp.daemon.row_snapshots import open_snapshot_storage, prune_snapshots

            deleted = prune_snapshots(self.cfg, open_snapshot_storage(self.cfg))
            if deleted:
                log.info("pruned row snapshots %s (snapshots.rows.keep)", ", ".join(deleted))
            return
        prune(self.cfg)


def row_snapshot_schedule(cfg: KelpConfig, registry: CollectorRegistry) -> RowSnapshotSchedule | None:
    """The trainer's schedule, or None when ``snapshots.rows.every_s`` is not set."""
    if cfg.snapshots.rows.every_s is None:
        return None
    return RowSnapshotSchedule(cfg, registry)
