"""The trainer daemon's Prometheus metrics (subsystem ``trainer``), against one registry.

=================================================  ==================================================
``kelp_trainer_steps_total``                       training steps finished (pushed and committed)
``kelp_trainer_steps_skipped_total``               steps not trained: a NaN or inf loss or gradient, by reason
``kelp_trainer_samples_total``                     samples trained
``kelp_trainer_samples_skipped_total``             samples of skipped steps (committed, untrained), by reason
``kelp_trainer_samples_per_second``                gauge: throughput over the last log interval
``kelp_trainer_loss``                              gauge: mean BCE of the last step (before its update)
``kelp_trainer_auc``                               gauge: progressive AUC, by window (window, cumulative)
``kelp_trainer_logloss``                           gauge: progressive log loss, by window
``kelp_trainer_task_auc``                          gauge: progressive AUC per task (label), by task and window
``kelp_trainer_task_logloss``                      gauge: progressive log loss per task, by task and window
``kelp_trainer_stage_seconds``                     histogram: seconds per stage of a step, by stage
``kelp_trainer_queue_depth``                       gauge: batches waiting, by queue (prefetch, push)
``kelp_trainer_inflight_rows``                     gauge: rows in the in-flight overlay (0 in a working copy)
``kelp_trainer_last_step_timestamp_seconds``       gauge: unix time of the last finished step
``kelp_trainer_checkpoints_total``                 checkpoints, by result (ok, failed, refused_nonfinite)
``kelp_trainer_last_checkpoint_timestamp_seconds`` gauge: unix time of the last checkpoint written
``kelp_trainer_checkpoint_age_seconds``            gauge: seconds since that checkpoint (at scrape)
``kelp_trainer_errors_total``                      retried or fatal errors, by stage and kind
``kelp_trainer_ready``                             gauge: 1 while /readyz answers 200
``kelp_trainer_world_size``                        gauge: ranks in the trainer group (1 alone)
``kelp_trainer_allreduce_seconds``                 histogram: seconds per group step's dense all-reduce
``kelp_trainer_group_idle_steps_total``            group steps this rank joined without a batch
``kelp_trainer_owned_rows_updated_total``          rows this rank owns, stepped with the group's gradients
``kelp_trainer_owned_rows_read_total``             ... of them only other ranks trained (read first)
``kelp_trainer_row_exchange_seconds``              histogram: seconds per group step of the row owners' work
=================================================  ==================================================

``kelp_trainer_auc`` and ``kelp_trainer_logloss`` are the first task's (the
only one without ``features.labels``): dashboards and alerts built on them keep
working. ``kelp_trainer_task_*`` carry every task, the first included.

Every series the trainer serves carries a ``rank`` label (``"0"`` alone), added
at export (:class:`kelp.metrics.LabelledRegistry`), so ranks of one group are
told apart in Prometheus even when they share a pod.

Stage labels: ``fetch`` (waiting for a micro-batch; decode is the consumer's
``kelp_consumer_decode_seconds``), ``pull``, ``to_device``, ``forward_backward``,
``dense_update``, ``sparse_update``, ``evaluate``, ``push``, ``commit``, ``checkpoint``, ``publish``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from kelp.metrics import MetricFactory

__all__ = ["STAGE_LABELS", "TrainerMetrics"]

STAGE_LABELS: tuple[str, ...] = (
    "fetch",
    "pull",
    "to_device",
    "forward_backward",
    "dense_update",
    "sparse_update",
    "evaluate",
    "push",
    "commit",
    "checkpoint",
    "publish",
)


class TrainerMetrics:
    """Every trainer-daemon metric in one registry (one instance per daemon)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricFactory("trainer", registry)
        self.registry = m.registry
        self.steps = m.counter("steps", "Training steps finished (pushed and committed).")
        self.steps_skipped = m.counter(
            "steps_skipped", "Steps not trained: a non-finite loss or gradient.", ["reason"]
        )
        self.samples = m.counter("samples", "Samples trained.")
        self.samples_skipped = m.counter(
            "samples_skipped",
            "Samples of steps not trained (a non-finite loss or gradient); their offsets are committed.",
            ["reason"],
        )
        self.samples_per_second = m.gauge("samples_per_second", "Samples/s over the last log interval.")
        self.loss = m.gauge("loss", "Mean BCE of the last step, before its update.")
        self.auc = m.gauge("auc", "Progressive-validation AUC.", ["window"])
        self.logloss = m.gauge("logloss", "Progressive-validation log loss.", ["window"])
        self.task_auc = m.gauge(
            "task_auc", "Progressive-validation AUC per task (label).", ["task", "window"]
        )
        self.task_logloss = m.gauge(
            "task_logloss", "Progressive-validation log loss per task (label).", ["task", "window"]
        )
        self.stage_seconds = m.histogram("stage_seconds", "Seconds per stage of a training step.", ["stage"])
        self.queue_depth = m.gauge("queue_depth", "Batches waiting in a pipeline queue.", ["queue"])
        self.inflight_rows = m.gauge(
            "inflight_rows", "Rows pushed but not yet acknowledged (overlay; 0 in a working copy)."
        )
        self.last_step = m.gauge(
            "last_step_timestamp", "Unix time of the last finished step.", unit="seconds"
        )
        self.checkpoints = m.counter("checkpoints", "Checkpoints written, failed or refused.", ["result"])
        self.last_checkpoint = m.gauge(
            "last_checkpoint_timestamp", "Unix time of the last checkpoint written.", unit="seconds"
        )
        self.checkpoint_age = m.gauge("checkpoint_age", "Seconds since the last checkpoint.", unit="seconds")
        self.checkpoint_age.set_function(self._checkpoint_age)
        self.errors = m.counter("errors", "Retried or fatal errors.", ["stage", "kind"])
        self.ready = m.gauge("ready", "1 while the trainer is ready (/readyz answers 200).")
        self.world_size = m.gauge("world_size", "Ranks in the trainer group (1 when training alone).")
        self.allreduce_seconds = m.histogram(
            "allreduce_seconds", "Seconds per group step's dense all-reduce."
        )
        self.owned_rows_updated = m.counter(
            "owned_rows_updated", "Rows this rank owns and stepped with the group's summed gradients."
        )
        self.owned_rows_read = m.counter(
            "owned_rows_read", "Owned rows only other ranks trained in a step, read from the store first."
        )
        self.row_exchange_seconds = m.histogram(
            "row_exchange_seconds",
            "Seconds per group step of the row owners' work: exchange, owner's steps, rows sent back.",
        )
        self.idle_steps = m.counter(
            "group_idle_steps", "Group steps this rank joined with no batch of its own."
        )
        self._checkpoint_at: float | None = None

    def observe_stages(self, timings: dict[str, float]) -> None:
        for stage, seconds in timings.items():
            self.stage_seconds.labels(stage=stage).observe(seconds)

    def checkpoint_written(self, at: float | None = None) -> None:
        self._checkpoint_at = time.time() if at is None else at
        self.last_checkpoint.set(self._checkpoint_at)
        self.checkpoints.labels(result="ok").inc()

    def _checkpoint_age(self) -> float:
        return float("nan") if self._checkpoint_at is None else time.time() - self._checkpoint_at
