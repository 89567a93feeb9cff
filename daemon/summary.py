"""What ``kelp train`` tells its user when it stops: did it learn, how fast, what it stored, what it refused.

A user who runs the trainer on a file for a few seconds has no Prometheus; the
summary is their evidence. It is built from the run's own records (the
progressive validator, the store's cheap stats, the registry's counters), so
it says nothing the metrics would not.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from kelp.store.base import StoreStats
from kelp.trainer.evaluation import ProgressiveValidator, TaskValidators

__all__ = ["RunSummary", "summarize"]


@dataclass
class RunSummary:
    """One run's outcome. ``rows`` per table is None where counting is not cheap (Redis)."""

    stopped_by: str
    samples: int
    steps: int
    seconds: float
    samples_per_s: float
    auc: float
    auc_error_bound: float
    window_auc: float
    window_auc_error_bound: float
    log_loss: float
    window_log_loss: float
    rows: dict[str, int | None] = field(default_factory=dict)
    store_bytes: int | None = None
    admitted: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    skipped_steps: dict[str, int] = field(default_factory=dict)
    """Steps not trained (a NaN or infinite loss or gradient), by reason; not in ``steps``."""
    skipped_samples: dict[str, int] = field(default_factory=dict)
    """The samples of those steps, by reason: read and committed, never trained (not in ``samples``)."""
    publish_failures: dict[str, int] = field(default_factory=dict)
    """Snapshots not published (serving kept its previous one), by reason: a run that never reached
    serving says so here, not only in its metrics."""
    checkpoint: str | None = None
    waiting: dict[str, int] = field(default_factory=dict)
    """Ids seen but not admitted yet (their admission counters), per table, where cheap to count."""
    progress_log: str | None = None
    rank: int = 0
    world_size: int = 1
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    """With several labels: task -> its ``auc``, ``window_auc``, ``log_loss``, ``window_log_loss``."""

    def lines(self) -> list[str]:
        """Human-readable lines for the end of ``kelp train``."""
        out = [
            f"trained {self.samples:,} samples in {self.steps:,} steps, {self.seconds:.1f}s "
            f"({self.samples_per_s:,.0f} samples/s); stopped by {self.stopped_by}",
            f"progressive AUC {self.auc:.4f} (±{self.auc_error_bound:.4f} binning), last window "
            f"{self.window_auc:.4f} (±{self.window_auc_error_bound:.4f}); log loss {self.log_loss:.4f}, "
            f"last window {self.window_log_loss:.4f}",
        ]
        for task, m in self.tasks.items():
            out.append(
                f"  task {task}: AUC {m['auc']:.4f}, last window {m['window_auc']:.4f}; "
                f"log loss {m['log_loss']:.4f}, last window {m['window_log_loss']:.4f}"
            )
        known = {t: n for t, n in self.rows.items() if n is not None}
        if known:
            out.append(f"rows stored: {sum(known.values()):,} in {len(known)} tables ({_top(known)})")
        if self.admitted:
            out.append(f"ids admitted this run: {sum(self.admitted.values()):,} ({_top(self.admitted)})")
        if any(self.waiting.values()):
            out.append(
                f"ids waiting for admission (counters): {sum(self.waiting.values()):,} ({_top(self.waiting)})"
            )
        if self.store_bytes is not None:
            out.append(f"store memory: {self.store_bytes / 1e6:,.1f} MB")
        rejected = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.rejected.items())) or "none"
        out.append(f"records rejected: {rejected}")
        if any(self.skipped_samples.values()):
            samples = sum(self.skipped_samples.values())
            reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.skipped_samples.items()))
            out.append(f"samples skipped, not trained (their step was skipped): {samples:,} ({reasons})")
        if any(self.skipped_steps.values()):
            skipped = sum(self.skipped_steps.values())
            reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.skipped_steps.items()))
            out.append(f"steps skipped, not trained (NaN or inf loss/gradient): {skipped:,} ({reasons})")
        if any(self.publish_failures.values()):
            failed = sum(self.publish_failures.values())
            reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.publish_failures.items()))
            out.append(f"snapshots not published (serving kept its previous one): {failed:,} ({reasons})")
        if self.world_size > 1:
            out.append(f"rank {self.rank} of {self.world_size}")
        if self.checkpoint:
            out.append(f"checkpoint: {self.checkpoint}")
        if self.progress_log:
            out.append(f"learning curve: kelp report {self.progress_log}")
        return out

    def as_json(self) -> str:
        """One JSON line (``--log-format json``); NaN becomes null."""
        doc = _finite(asdict(self))
        if self.tasks:  # several labels only: a one-label run's line is unchanged
            doc["tasks"] = {task: _finite(m) for task, m in self.tasks.items()}
        else:
            doc.pop("tasks")
        return json.dumps({"event": "train_summary", **doc}, sort_keys=True)


def summarize(
    report: Any,
    validator: ProgressiveValidator,
    stats: StoreStats | None,
    registry: CollectorRegistry,
    progress_log: str | None = None,
    *,
    tasks: TaskValidators | None = None,
) -> RunSummary:
    """The summary of a finished :class:`~kelp.daemon.train.TrainReport`.

    The headline metrics are ``validator``'s (the first task); with several
    tasks, ``tasks`` adds each task's own.
    """
    total, window = validator.cumulative(), validator.windowed()
    return RunSummary(
        stopped_by=report.stopped_by,
        samples=report.samples,
        steps=report.steps,
        seconds=report.seconds,
        samples_per_s=report.samples / report.seconds if report.seconds > 0 else 0.0,
        auc=total.auc,
        auc_error_bound=total.auc_error_bound,
        window_auc=window.auc,
        window_auc_error_bound=window.auc_error_bound,
        log_loss=total.log_loss,
        window_log_loss=window.log_loss,
        rows=dict(stats.rows) if stats is not None else {},
        store_bytes=stats.bytes if stats is not None else None,
        admitted=_by_label(registry, "kelp_store_admissions_total", "table"),
        rejected=_by_label(registry, "kelp_records_rejected_total", "reason"),
        skipped_steps=_by_label(registry, "kelp_trainer_steps_skipped_total", "reason"),
        skipped_samples=_by_label(registry, "kelp_trainer_samples_skipped_total", "reason"),
        publish_failures=_by_label(registry, "kelp_publisher_failures_total", "reason"),
        checkpoint=report.checkpoint,
        waiting={t: n for t, n in stats.admission_counters.items() if n} if stats is not None else {},
        progress_log=progress_log,
        rank=report.rank,
        world_size=report.world_size,
        tasks=task_metrics(tasks) if tasks is not None and len(tasks.names) > 1 else {},
    )


def task_metrics(tasks: TaskValidators) -> dict[str, dict[str, float]]:
    """task -> cumulative and last-window AUC and log loss."""
    return {
        task: {
            "auc": total.auc,
            "window_auc": window.auc,
            "log_loss": total.log_loss,
            "window_log_loss": window.log_loss,
        }
        for task, (total, window) in tasks.results().items()
    }


def _by_label(registry: CollectorRegistry, sample_name: str, label: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == sample_name and sample.value:
                out[sample.labels[label]] = int(sample.value)
    return out


def _top(counts: dict[str, int], n: int = 3) -> str:
    best = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    more = f", {len(counts) - n} more" if len(counts) > n else ""
    return ", ".join(f"{name} {count:,}" for name, count in best) + more


def _finite(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in doc.items()}
