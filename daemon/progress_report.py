"""How a training run reports its progress: log lines, learning-record points and the AUC gauges.

The loop asks after every round, trained or empty; each report goes out only
when it is due, so asking costs one clock read:

* a log line every ``trainer.log_every_s`` and at every 5% of a file (a short
  run still shows it learning); an interval with no samples exports rate 0
  and prints nothing;
* a point of the learning record (``progress.jsonl``, :mod:`kelp.daemon.progress_log`,
  the leader only) every ``trainer.progress_every_s``, at every 1% of a file, and
  by samples: every ``trainer.progress_every_samples``, or, unset, whenever the
  samples trained have grown by :data:`PROGRESS_GROWTH` since the last point. A
  replay over within one ``progress_every_s`` (a topic read from its start, a
  file of unknown size) would otherwise record one point and draw no curve; the
  growth rule spaces its points evenly on a log scale of samples, so a run of any
  length gets about 47 per tenfold and a long run adds few beyond the timed ones;
* the progressive AUC and log loss gauges (per task too, with several labels)
  with each log line and at the drain; a resumed trainer's leader sets them
  first from the record's last point (:func:`restore_eval_gauges`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kelp.config import TrainerConfig
from kelp.daemon.progress_log import ProgressLog, last_point, point_tasks, task_fields
from kelp.trainer.evaluation import ProgressiveValidator, TaskValidators
from kelp.trainer.metrics import TrainerMetrics

if TYPE_CHECKING:
    from kelp.daemon.train import TrainReport

__all__ = ["PROGRESS_GROWTH", "ProgressReporter", "restore_eval_gauges"]

log = logging.getLogger("kelp.train")

PROGRESS_GROWTH = 1.05
"""Unset ``progress_every_samples``: a point once the samples trained reach this times the last point's."""


class ProgressReporter:
    """One run's progress reports; ``expected_samples`` is the source's size (None for a stream)."""

    def __init__(
        self,
        settings: TrainerConfig,
        metrics: TrainerMetrics,
        report: TrainReport,
        *,
        validator: ProgressiveValidator,
        tasks: TaskValidators | None,
        record: ProgressLog,
        expected_samples: Callable[[], int | None],
        leader: bool,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.report = report
        self.validator = validator
        self.tasks = tasks
        self.record = record
        self.expected_samples = expected_samples
        self.leader = leader
        now = time.monotonic()
        self._last_log = (now, report.samples)
        self._last_record = (now, report.samples)
        self._log_twentieths = 0
        self._record_hundredths = 0

    def file_fraction(self) -> float | None:
        """How much of a file source is trained (None for Kafka: an endless stream)."""
        expected = self.expected_samples()
        return min(1.0, self.report.samples / expected) if expected else None

    def maybe_log(self, step_no: int) -> None:
        """A log line every ``log_every_s``, and at every 5% of a file."""
        now = time.monotonic()
        since, samples_then = self._last_log
        if self.report.samples == samples_then:
            if now - since >= self.settings.log_every_s:  # idle for an interval: no line, rate 0
                self._last_log = (now, samples_then)
                self.metrics.samples_per_second.set(0.0)
            return
        fraction = self.file_fraction()
        new_step = fraction is not None and int(fraction * 20) > self._log_twentieths
        if now - since < self.settings.log_every_s and not new_step:
            return
        if fraction is not None:
            self._log_twentieths = int(fraction * 20)
        rate = (self.report.samples - samples_then) / (now - since)
        self._last_log = (now, self.report.samples)
        self.export_eval()
        self.metrics.samples_per_second.set(rate)
        log.info(
            "step %d  samples %d%s  %.0f samples/s  loss %.4f  AUC window %.3f cumulative %.3f",
            step_no,
            self.report.samples,
            f" ({fraction:.0%} of the file)" if fraction is not None else "",
            rate,
            self.report.losses[-1] if self.report.losses else float("nan"),
            self.report.window_auc,
            self.report.auc,
        )

    def maybe_record(self, step_no: int, force: bool = False) -> None:
        """A point of the learning record at every 1% of a file, every ``progress_every_s`` and by samples."""
        now = time.monotonic()
        since, samples_then = self._last_record
        if self.report.samples == samples_then or not self.leader:
            return
        fraction = self.file_fraction()
        new_point = fraction is not None and int(fraction * 100) > self._record_hundredths
        timed = now - since >= self.settings.progress_every_s
        if not (force or new_point or timed or self._samples_due(samples_then)):
            return
        if fraction is not None:
            self._record_hundredths = int(fraction * 100)
        self._last_record = (now, self.report.samples)
        window, total = self.validator.windowed(), self.validator.cumulative()
        tasks = self.tasks
        per_task = (
            {"tasks": task_fields(tasks.results())} if tasks is not None and len(tasks.names) > 1 else {}
        )
        self.record.write(
            step=step_no,
            samples=self.report.samples,
            fraction=None if fraction is None else round(fraction, 4),
            auc_window=window.auc,
            auc=total.auc,
            log_loss_window=window.log_loss,
            log_loss=total.log_loss,
            samples_per_s=round((self.report.samples - samples_then) / max(now - since, 1e-9), 1),
            **per_task,  # several labels only: a one-task point is unchanged
        )

    def _samples_due(self, samples_then: int) -> bool:
        """Whether enough samples were trained since the last point for the next one."""
        every = self.settings.progress_every_samples
        if every is not None:
            return self.report.samples - samples_then >= every
        return self.report.samples >= samples_then * PROGRESS_GROWTH

    def export_eval(self) -> None:
        """The progressive AUC and log loss into the report and the gauges (each task's too)."""
        window, total = self.validator.windowed(), self.validator.cumulative()
        self.report.window_auc, self.report.auc = window.auc, total.auc
        for name, result in (("window", window), ("cumulative", total)):
            self.metrics.auc.labels(window=name).set(result.auc)
            self.metrics.logloss.labels(window=name).set(result.log_loss)
        tasks = self.tasks
        for task, results in (tasks.results() if tasks is not None else {}).items():
            for name, result in zip(("cumulative", "window"), results, strict=True):
                self.metrics.task_auc.labels(task=task, window=name).set(result.auc)
                self.metrics.task_logloss.labels(task=task, window=name).set(result.log_loss)


_GAUGE_WINDOWS = (("window", "auc_window", "log_loss_window"), ("cumulative", "auc", "log_loss"))
"""The gauges' ``window`` label and the point's keys for its AUC and log loss."""


def restore_eval_gauges(metrics: TrainerMetrics, record: ProgressLog) -> dict[str, Any] | None:
    """Set the AUC and log-loss gauges (each task's too) from the record's last point; that point.

    A resumed trainer validates afresh: without this its gauges are absent
    until it trains a batch, which on a quiet topic is never, so an alert on a
    missing AUC fires on every restart. The last point measured the model
    just resumed (or the few batches past its checkpoint), so it is the last
    known value; the first log line with samples replaces it. A metric the
    point has as null (one class seen so far) stays absent, as it would live.
    """
    point = last_point(record.path)
    if point is None:
        return None
    for window, auc_key, loss_key in _GAUGE_WINDOWS:
        _set_finite(metrics.auc.labels(window=window), point.get(auc_key))
        _set_finite(metrics.logloss.labels(window=window), point.get(loss_key))
    for task, values in point_tasks(point).items():
        for window, auc_key, loss_key in _GAUGE_WINDOWS:
            _set_finite(metrics.task_auc.labels(task=task, window=window), values[auc_key])
            _set_finite(metrics.task_logloss.labels(task=task, window=window), values[loss_key])
    return point


def _set_finite(gauge: Any, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        gauge.set(float(value))
