"""How a training run reports its progress: log lines, learning-record points and the AUC gauges.

The loop asks after every round, trained or empty; each report goes out only
when it is due, so asking costs one clock read:

* a log line every ``trainer.log_every_s`` and at every 5% of a file (a short
  run still shows it learning); an interval with no samples exports rate 0
  and prints nothing;
* a point of the learning record (``progress.jsonl``, :mod:`kelp.daemon.progress_log`,
  the leader only) every ``trainer.progress_every_s`` and at every 1% of a file;
* the progressive AUC and log loss gauges (per task too, with several labels)
  with each log line and at the drain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kelp.config import TrainerConfig
from kelp.daemon.progress_log import ProgressLog, task_fields
from kelp.trainer.evaluation import ProgressiveValidator, TaskValidators
from kelp.trainer.metrics import TrainerMetrics

if TYPE_CHECKING:
    from kelp.daemon.train import TrainReport

__all__ = ["ProgressReporter"]

log = logging.getLogger("kelp.train")


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
        """A point of the learning record at every 1% of a file and every ``progress_every_s``."""
        now = time.monotonic()
        since, samples_then = self._last_record
        if self.report.samples == samples_then or not self.leader:
            return
        fraction = self.file_fraction()
        new_point = fraction is not None and int(fraction * 100) > self._record_hundredths
        if not (force or new_point or now - since >= self.settings.progress_every_s):
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
