"""``kelp train``: the continual-learning trainer daemon.

Lifecycle (started in this order, stopped in reverse)::

    health/metrics HTTP ─> store ─> model + checkpoint restore ─> publisher ─> source
      ─> prefetch thread + push thread ─> ready ─> train forever

Every step: take a prefetched batch, apply the in-flight overlay (so it sees
every earlier step's update, see :mod:`kelp.daemon.ledger`), train, record
its updates, hand them to the write-behind pusher, which pushes and commits
the batch's offsets once the store says those pushes are durable
(``store.durable_through()``; see :mod:`kelp.daemon.pipeline`). Dense checkpoints every
``checkpoint_every_steps`` or ``checkpoint_every_s``; a snapshot for serving
every ``publisher.interval_s`` while the model changes. These run after every
round of the loop, with a batch or without (an idle topic), so a burst's last
model is checkpointed and published without waiting for the next batch.

Stopping (SIGTERM/SIGINT, ``max_steps``, or an exhausted file source) drains
within ``trainer.drain_timeout_s``: stop fetching, finish the batch in hand,
push and flush everything trained, commit, checkpoint, publish, leave the
consumer group. Batches prefetched but not trained are not committed, so they
are read again after a restart: delivery is at least once and nothing
acknowledged is lost. A fatal error (the store unreachable past
``trainer.max_store_outage_s``, wrong credentials for the store or the snapshot
channel, a bad record schema...) raises out of
:meth:`TrainDaemon.run`; the CLI prints it in one line and exits non-zero.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig, KelpConfig, SourceConfig
from kelp.daemon.group import Round, TrainingGroup, launched_world
from kelp.daemon.health import HealthServer
from kelp.daemon.model_errors import ModelErrors
from kelp.daemon.outage import OutageGuard
from kelp.daemon.pipeline import Trained, TrainPipeline
from kelp.daemon.preflight import preflight
from kelp.daemon.progress_log import ProgressLog
from kelp.daemon.progress_report import ProgressReporter, restore_eval_gauges
from kelp.daemon.resume import adopt, leader_start
from kelp.daemon.row_owners import RowOwners
from kelp.daemon.row_snapshot_schedule import RowSnapshotSchedule, row_snapshot_schedule
from kelp.daemon.summary import RunSummary, summarize
from kelp.errors import KelpError, UserError
from kelp.metrics import LabelledRegistry
from kelp.store.base import StoreStats
from kelp.trainer.metrics import STAGE_LABELS, TrainerMetrics

if TYPE_CHECKING:
    from kelp.consumers.base import Source
    from kelp.consumers.batch import MicroBatch
    from kelp.publish import Publisher
    from kelp.store.base import EmbeddingStore
    from kelp.trainer.step import StepResult, TrainStep

OnStep = Callable[[int, "MicroBatch", "StepResult"], None]
"""``on_step(step, batch, result)`` after every trained step (benchmarks and tests watch the run)."""

__all__ = ["PEER_STOPPED", "DrainTimeoutError", "TrainDaemon", "TrainReport"]

log = logging.getLogger("kelp.train")
_TICK_S = 0.25
PEER_STOPPED = "another rank stopped"
"""``TrainReport.stopped_by`` of a rank that drained only because a peer of its group was stopping."""


def _cpu_threads(cfg: KelpConfig) -> int:
    """Intra-op threads: leave a core to the prefetch and push threads, or the two fight over CPUs.

    With torch on every core while the I/O threads are busy, forward/backward
    slows down far more than the one core given up costs (docs/performance.md).
    """
    if cfg.trainer.torch_threads is not None:
        return cfg.trainer.torch_threads
    cores = os.cpu_count() or 1
    return max(1, cores - 1) if cfg.trainer.prefetch_batches > 0 else cores


class DrainTimeoutError(KelpError):
    """Draining did not finish within ``trainer.drain_timeout_s``; unfinished batches will be read again."""


@dataclass
class TrainReport:
    """What a run did, for the CLI's last line, the demo and the benchmark."""

    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    first_step: int = 0
    stopped_by: str = ""
    resumed_from: str | None = None
    checkpoint: str | None = None
    auc: float = float("nan")
    window_auc: float = float("nan")
    losses: list[float] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    published_version: int | None = None
    rank: int = 0
    world_size: int = 1
    summary: RunSummary | None = None


class TrainDaemon:
    """One trainer process. ``run()`` blocks until stopped; ``request_stop()`` is signal-safe.

    ``http=False`` skips the health/metrics server (benchmarks, embedded use);
    ``publish=False`` skips the publisher (no serving in the loop). ``origin``
    names the config in errors (the file path, from the CLI). ``wrap_store``
    (benchmarks) wraps the built store, e.g. to trace when rows were read and written.
    ``step_class`` (benchmarks) replaces :class:`~kelp.trainer.step.TrainStep`, e.g. with a
    step that moves the same tensors but runs no model (``kelp bench pipeline``).
    """

    def __init__(
        self,
        cfg: KelpConfig,
        *,
        registry: CollectorRegistry | None = None,
        http: bool = True,
        publish: bool = True,
        on_step: OnStep | None = None,
        origin: str = "config",
        wrap_store: Callable[[EmbeddingStore], EmbeddingStore] | None = None,
        step_class: type[TrainStep] | None = None,
    ) -> None:
        self.cfg = cfg
        self.origin = origin
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = TrainerMetrics(self.registry)
        self.guard = OutageGuard(cfg.trainer.max_store_outage_s, self.metrics)
        self.group = TrainingGroup(launched_world(), cfg.trainer.distributed, self.metrics)
        self._http = http
        self._publish = publish
        self._on_step = on_step
        self._wrap_store = wrap_store
        self._step_class = step_class
        self._stop = threading.Event()
        self._stop_reason = ""
        self._state = "starting"
        self._last_tick = time.monotonic()
        self._health: HealthServer | None = None
        self.report = TrainReport(rank=self.group.rank, world_size=self.group.size)
        self._busy = False
        self.pipeline: TrainPipeline | None = None
        self._store_stats: StoreStats | None = None
        self._source: Source | None = None
        self.progress_log = ProgressLog(None)
        self.progress: ProgressReporter | None = None
        self.row_snapshots: RowSnapshotSchedule | None = None
        self._last_trained_step = 0

    # ------------------------------------------------------------------ control

    def request_stop(self, reason: str = "signal") -> None:
        """Begin a drain; safe to call from a signal handler or another thread."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    @property
    def http_port(self) -> int | None:
        return self._health.port if self._health is not None else None

    def liveness(self) -> tuple[bool, str]:
        stalled = time.monotonic() - self._last_tick
        limit = max(60.0, self.cfg.trainer.max_store_outage_s + 30.0)
        if stalled > limit:
            return False, f"main loop stalled for {stalled:.0f}s"
        return True, f"alive ({self._state})"

    def readiness(self) -> tuple[bool, str]:
        if self._state != "training":
            return False, self._state
        if self.guard.in_outage:
            return False, "store unavailable, retrying"
        source = self._source
        reason = source.not_ready_reason() if source is not None else None
        if reason:
            return False, reason
        return True, "ready"

    # ------------------------------------------------------------------ run

    def run(self) -> TrainReport:
        from kelp.consumers import build_source
        from kelp.store import build_store

        cfg = self.cfg
        preflight(cfg, self.origin, role="train")  # what `kelp config validate` refuses, refused here too
        if self.group.distributed and cfg.source.kind != "kafka":
            raise UserError(
                f"{self.origin}: source.kind: {cfg.source.kind} cannot be split between "
                f"{self.group.size} ranks (each would train every record); use kind: kafka, "
                "whose consumer group splits the partitions"
            )
        source_cfg = self._rank_source()
        started = time.perf_counter()
        threads_before = torch.get_num_threads()
        if self._http and cfg.metrics.enabled:
            # One port per rank on a host: the base port plus torchrun's LOCAL_RANK.
            port = cfg.metrics.port + self.group.world.local_rank if cfg.metrics.port else 0
            labelled = LabelledRegistry(self.registry, {"rank": str(self.group.rank)})
            self._health = HealthServer(
                cfg.metrics.host, port, labelled, self.liveness, self.readiness
            ).start()
        try:
            tables = cfg.features.store_tables()
            size = self.group.size
            owners = self._row_owners()
            owned_rows = owners.owned if owners is not None else None
            with build_store(
                cfg.store,
                tables,
                cfg.deployment,
                self.registry,
                trainers=size,
                owned_rows=owned_rows,
                device=self._device(),
            ) as built:
                store = built if self._wrap_store is None else self._wrap_store(built)
                self._build_model()
                publisher = self._build_publisher()
                try:
                    with build_source(source_cfg, cfg.features, cfg.batching, self.registry) as source:
                        self._loop(source, store, publisher, owners)
                    self._store_stats = _cheap_stats(store)
                finally:
                    if publisher is not None:
                        publisher.close()
        finally:
            self.report.seconds = time.perf_counter() - started
            self.report.stage_seconds = self._stage_totals()
            if self._state == "stopped":
                record = self.progress_log.path if self.progress_log.points else None
                self.report.summary = summarize(
                    self.report,
                    self.validator,
                    self._store_stats,
                    self.registry,
                    str(record) if record else None,
                    tasks=getattr(getattr(self, "step", None), "task_validators", None),
                )
            self.metrics.ready.set(0)
            torch.set_num_threads(threads_before)
            self.group.close()
            if self._health is not None:
                self._health.stop()
        return self.report

    def _rank_source(self) -> SourceConfig:
        """``cfg.source`` as this rank uses it: a static member id unique to the rank in a group."""
        source = self.cfg.source
        if not isinstance(source, KafkaSourceConfig):
            return source
        try:
            return source.for_rank(self.group.rank, self.group.size)
        except ValueError as exc:
            raise UserError(f"{self.origin}: {exc}") from None

    def _device(self) -> torch.device:
        """This rank's torch device (``trainer.device``): the model's, and the working copy's rows'."""
        from kelp.trainer import resolve_device

        return self.group.rank_device(resolve_device(self.cfg.trainer.device))

    def _build_model(self) -> None:
        from kelp.trainer import ProgressiveValidator, TrainStep, build_model
        from kelp.trainer.checkpoint import config_hash
        from kelp.trainer.fingerprint import fingerprint

        cfg = self.cfg
        device = self._device()
        self.validator = ProgressiveValidator(window_batches=cfg.trainer.eval_window_batches)
        self.step = (self._step_class or TrainStep)(
            build_model(cfg.features, cfg.trainer),
            cfg.features,
            cfg.trainer,
            device,
            validator=self.validator,
        )
        self.config_hash = config_hash(cfg.features, cfg.trainer)
        self.fingerprint = fingerprint(cfg.features, cfg.trainer)
        self.group.start(self.step.model, device)
        mine = None
        if self.group.is_leader:
            mine = leader_start(
                cfg.trainer.checkpoint_dir,
                self.step,
                self.config_hash,
                share=self.group.distributed,
                fingerprint=self.fingerprint,
                accept_model_change=cfg.trainer.accept_model_change,
            )
        start = self.group.share_start(mine)
        assert start is not None
        adopt(start, self.step, is_leader=self.group.is_leader)
        self.step_no = start.step
        self.offsets: dict[tuple[str, int], int] = dict(start.offsets)
        if start.path is not None:
            self.report.resumed_from = start.path
            self.metrics.checkpoint_written(start.created_at)
        self.report.first_step = self.step_no
        if self.group.is_leader:
            self.progress_log = ProgressLog(cfg.trainer.checkpoint_dir)
            if start.path is not None:  # the resumed model's last known AUC, there from the first scrape
                restore_eval_gauges(self.metrics, self.progress_log)
        self._set_dense_lr()
        if device.type == "cpu":
            torch.set_num_threads(_cpu_threads(cfg))
        log.info("model %s on %s (%d intra-op threads)", cfg.trainer.model, device, torch.get_num_threads())

    def _set_dense_lr(self) -> None:
        """The dense lr from the config (never a checkpoint's saved one), scaled for a group."""
        settings = self.cfg.trainer
        lr = settings.dense_optimizer.lr
        if self.group.distributed and settings.distributed.dense_lr_scaling == "linear":
            lr *= self.group.size
            log.info(
                "dense lr %g x %d ranks = %g (trainer.distributed.dense_lr_scaling)",
                settings.dense_optimizer.lr,
                self.group.size,
                lr,
            )
        for group in self.step.optimizer.param_groups:
            group["lr"] = lr

    def _build_publisher(self) -> Publisher | None:
        if not (self._publish and self.cfg.publisher.enabled and self.group.is_leader):  # one voice
            return None
        from kelp.publish import build_publisher

        return build_publisher(self.cfg, self.registry, validator=self.validator)

    def _row_owners(self) -> RowOwners | None:
        """One writer per row in a group that overwrites rows (compose adds them up in Redis instead)."""
        if not self.group.distributed or self.cfg.store.sparse_updates != "overwrite":
            return None
        return RowOwners(self.group, {t.name: t.dim for t in self.cfg.features.store_tables()})

    def _loop(
        self, source: Source, store: EmbeddingStore, publisher: Publisher | None, owners: RowOwners | None
    ) -> None:
        self._source = source
        cfg = self.cfg.trainer
        pipeline = self.pipeline = TrainPipeline(
            source,
            store,
            self.step,
            cfg,
            guard=self.guard,
            metrics=self.metrics,
            acked=self.step_no,
            in_store_adagrad=self.cfg.store.sparse_updates == "compose",
            owners=owners,
            model_errors=self._model_errors(source),
        )
        pipeline.start()
        self._state = "training"
        self.metrics.ready.set(1)
        log.info("training (prefetch %d, write-behind %d)", cfg.prefetch_batches, cfg.push_queue_batches)
        self._last_checkpoint_s = time.monotonic()
        self._last_checkpoint_step = self.step_no
        self._published_step = self.step_no  # what serving has already (a restored model is not news)
        self._last_trained_step = self.step_no
        self.row_snapshots = row_snapshot_schedule(self.cfg, self.registry)
        self.progress = ProgressReporter(
            cfg,
            self.metrics,
            self.report,
            validator=self.validator,
            tasks=self.step.task_validators,
            record=self.progress_log,
            expected_samples=source.expected_samples,
            leader=self.group.is_leader,
        )
        try:
            while True:
                self._last_tick = time.monotonic()
                agreed = self._group_step(pipeline)
                if agreed.exhausted:
                    self.request_stop("source exhausted")
                if agreed.stop or agreed.exhausted:
                    self.request_stop(PEER_STOPPED)  # no-op when this rank asked first
                    break
                if cfg.max_steps is not None and self.step_no - self.report.first_step >= cfg.max_steps:
                    self.request_stop("max_steps")
                self._periodic(publisher, agreed)
        except BaseException:
            self._state = "failed"
            self.metrics.ready.set(0)
            pipeline.abort()
            raise
        finally:
            pipeline.model_errors.close()
        try:
            self._drain(pipeline, publisher)
        finally:
            self._end_row_snapshots()

    def _model_errors(self, source: Source) -> ModelErrors:
        """Samples the model raises on go where the source's rejected records go, counted with them."""
        from kelp.consumers.deadletter import KafkaDeadLetter, LogDeadLetter, producer_settings
        from kelp.consumers.metrics import ConsumerMetrics

        metrics = getattr(source, "metrics", None)
        if not isinstance(metrics, ConsumerMetrics):  # a source of another kind: counted on its own
            metrics = ConsumerMetrics(CollectorRegistry())
        kafka = self.cfg.source
        limit = self.cfg.trainer.max_model_error_batches
        if isinstance(kafka, KafkaSourceConfig) and kafka.dead_letter_topic:
            topic = kafka.dead_letter_topic
            return ModelErrors(
                self.cfg.features, lambda: KafkaDeadLetter(metrics, topic, producer_settings(kafka)), limit
            )
        return ModelErrors(self.cfg.features, lambda: LogDeadLetter(metrics), limit)

    def _group_step(self, pipeline: TrainPipeline) -> Round:
        """Train this rank's next batch, or join the group's step with none; the group's agreement.

        Alone, nothing to do (no batch within a tick) is an empty round, so the
        loop's periodic work still runs on an idle topic. In a group every call
        is one all-reduce (see :mod:`kelp.daemon.group`): a rank without a batch
        ready contributes nothing rather than waiting, so uneven partitions never block.
        """
        stop = self._stop.is_set()
        checkpoint = self._checkpoint_clock_due() or self._row_snapshot_due()
        rounds: list[Round] = []

        def dense_sync(samples: int) -> bool:
            flags = {"stop": stop, "exhausted": pipeline.exhausted, "checkpoint": checkpoint}
            rounds.append(self.group.exchange(samples, **flags))
            return rounds[-1].samples > 0

        done = pipeline.progress(
            self.step_no,
            dense_sync,
            wait_s=self._wait_s(),
            fetch=not stop,
            join=stop or self.group.distributed,
        )
        if done.trained is not None:
            self._account(done.trained)
        if not rounds:  # alone, and no batch came within the tick
            return Round(samples=0, stop=False, exhausted=False, checkpoint=checkpoint)
        if done.trained is None and rounds[-1].samples:
            self.step_no += 1  # other ranks trained: step numbers stay equal on every rank
        self._busy = rounds[-1].samples > 0
        return rounds[-1]

    def _wait_s(self) -> float:
        """How long to wait for a batch: alone, a tick; in a busy group, not at all (contribute nothing)."""
        if not self.group.distributed:
            return _TICK_S
        return 0.0 if self._busy else self.cfg.trainer.distributed.idle_wait_s

    def _account(self, trained: Trained) -> None:
        """A trained step's number, offsets, report and metrics; ``on_step`` sees it last."""
        self.step_no = self._last_trained_step = trained.step
        batch, result = trained.batch, trained.result
        for r in batch.sources:  # held batches included: _trained_through() stops short of them
            key = (r.topic, r.partition)
            self.offsets[key] = max(self.offsets.get(key, 0), r.last_offset + 1)
        trained = batch.size - result.failed_samples  # the others were dead-lettered (model_error)
        if result.skipped == "model_error":
            pass  # held by ModelErrors until a batch trains, never committed untrained
        elif (
            result.skipped is not None
        ):  # nothing applied or pushed; the empty push still commits its offsets
            self.metrics.steps_skipped.labels(reason=result.skipped).inc()
            self.metrics.samples_skipped.labels(reason=result.skipped).inc(batch.size)
        else:
            self.report.steps += 1
            self.report.samples += trained
            self.report.losses.append(result.loss)
            m = self.metrics
            m.steps.inc()
            m.samples.inc(trained)
            m.loss.set(result.loss)
            m.last_step.set(time.time())
            m.observe_stages(result.timings)
        if self._on_step is not None:
            self._on_step(self.step_no, batch, result)

    def _trained_through(self) -> dict[tuple[str, int], int]:
        """The offsets a checkpoint or snapshot covers: ``self.offsets``, short of any held batch.

        ``self.offsets`` advances past every batch stepped, held ones too, so that
        dead-lettering a held batch later needs no bookkeeping here.
        """
        if self.pipeline is None:
            return dict(self.offsets)
        return self.pipeline.model_errors.trained_through(self.offsets)

    # ------------------------------------------------------------------ periodic work

    def _periodic(self, publisher: Publisher | None, agreed: Round) -> None:
        """After every round, trained or empty: each job runs when its own interval is due.

        Not only after a step: a burst trained within one interval would
        otherwise wait for the next batch (on a quiet topic, forever) before
        its model is published, checkpointed, recorded and its AUC exported.
        Alone an empty round comes every tick (the prefetcher's wait), in a
        group every ``idle_wait_s``; each job is one clock read when not due.
        In a group ``agreed.checkpoint`` is the same on every rank, so ranks
        decide a checkpoint together with or without a batch.
        """
        barrier = self._row_snapshot_barrier(agreed)
        self._maybe_checkpoint(force=False, clock_due=agreed.checkpoint)
        if barrier:
            self._start_row_snapshot()
        self._maybe_publish(publisher, force=False)
        assert self.progress is not None
        self.progress.maybe_log(self.step_no)
        self.progress.maybe_record(self.step_no)

    # ------------------------------------------------------------------ row snapshots

    def _row_snapshot_due(self) -> bool:
        """The leader's clock alone asks for a snapshot's checkpoint (the other ranks join the agreed one)."""
        return self.group.is_leader and self.row_snapshots is not None and self.row_snapshots.due()

    def _row_snapshot_barrier(self, agreed: Round) -> bool:
        """Whether this round's checkpoint is a row snapshot's: then every row trained so far is in the store.

        Only the leader's clock asks for a snapshot, and only it knows whether an
        agreed checkpoint is one: in a group every rank waits at every agreed
        checkpoint, so each rank's own pushes are in the store before the
        checkpoint's collective; the leader alone takes the snapshot.
        """
        schedule = self.row_snapshots
        if schedule is None or not agreed.checkpoint:
            return False
        if not (self._row_snapshot_due() or self.group.distributed):
            return False
        if not self._flush_barrier():
            schedule.fail(
                f"rows trained through step {self._last_trained_step} were not all in the store within "
                f"trainer.drain_timeout_s={self.cfg.trainer.drain_timeout_s:g}s"
            )
            return False
        return self._row_snapshot_due()

    def _flush_barrier(self) -> bool:
        """Wait until every step this rank trained is pushed and acknowledged, and, with the hot tier's
        working copy, written back (its offsets committed); False past ``trainer.drain_timeout_s``."""
        pipeline = self.pipeline
        if pipeline is None:
            return True
        target = max(self._last_trained_step, pipeline.owned_rows_submitted_step)
        working = pipeline.working_copy
        if working is not None and self.cfg.trainer.prefetch_batches == 0:
            # No writer thread (its work is done on this one): write the working copy back here.
            self.guard.call("push", lambda: working.durable_through(force=True))
            return True
        deadline = time.monotonic() + self.cfg.trainer.drain_timeout_s
        while pipeline.ledger.acked < target or (working is not None and pipeline.committed_step < target):
            if time.monotonic() >= deadline:  # a failed writer thread is raised by the next step
                return False
            time.sleep(0.01)
        return True

    def _start_row_snapshot(self) -> None:
        """Hand the checkpoint just written at this step to the snapshot thread."""
        schedule = self.row_snapshots
        assert schedule is not None
        written = self.report.checkpoint
        if self._last_checkpoint_step != self.step_no or written is None:
            schedule.postpone(f"no checkpoint written at step {self.step_no}")
            return
        schedule.start(self.step_no, self.group.size, Path(written))

    def _end_row_snapshots(self) -> None:
        """Let a running snapshot finish before the process goes (one cut short is never taken for whole)."""
        schedule = self.row_snapshots
        if schedule is None:
            return
        if not schedule.wait(self.cfg.trainer.drain_timeout_s):
            log.warning("a row snapshot is still running at exit; it stays incomplete and is never restored")
        schedule.close()

    def _checkpoint_clock_due(self) -> bool:
        return time.monotonic() - self._last_checkpoint_s >= self.cfg.trainer.checkpoint_every_s

    def _maybe_checkpoint(self, force: bool, clock_due: bool = False) -> None:
        """Checkpoint every ``checkpoint_every_steps`` or when the (agreed) clock says so.

        In a group every rank comes here at the same step: the ranks gather
        their trained-through offsets and dense digests, refuse to go on if the
        replicas differ, and the leader alone writes the file.
        """
        from kelp.trainer.checkpoint import save_checkpoint
        from kelp.trainer.finite import NonFiniteError

        cfg = self.cfg.trainer
        due = self.step_no - self._last_checkpoint_step >= cfg.checkpoint_every_steps or clock_due
        if not (force or due) or self.step_no == self._last_checkpoint_step:
            return
        started = time.perf_counter()
        offsets, ranks = self.group.agree_on_checkpoint(
            self._trained_through(), self.step.model, self.step_no
        )
        try:
            if not self.group.is_leader:
                return
            path = save_checkpoint(
                cfg.checkpoint_dir,
                self.step.model,
                self.step.optimizer,
                step=self.step_no,
                config_hash=self.config_hash,
                offsets=offsets,
                ranks=ranks,
                fingerprint=self.fingerprint,
            )
        except NonFiniteError as exc:  # the previous checkpoint stays; training goes on
            self.metrics.checkpoints.labels(result="refused_nonfinite").inc()
            log.error("%s; %s keeps its previous checkpoint", exc, cfg.checkpoint_dir)
            return
        except OSError as exc:
            self.metrics.checkpoints.labels(result="failed").inc()
            log.error("checkpoint to %s failed: %s", cfg.checkpoint_dir, exc)
            if force:
                raise KelpError(f"final checkpoint to {cfg.checkpoint_dir} failed: {exc}") from exc
            return
        finally:
            self._last_checkpoint_s = time.monotonic()
            self._last_checkpoint_step = self.step_no
        self.metrics.checkpoint_written()
        self.metrics.stage_seconds.labels(stage="checkpoint").observe(time.perf_counter() - started)
        self.report.checkpoint = str(path)
        log.debug("checkpoint %s", path.name)

    def _maybe_publish(self, publisher: Publisher | None, force: bool) -> None:
        """A snapshot every ``publisher.interval_s`` while the model changes, and on ``force`` (the drain).

        Unchanged weights since the last snapshot (an idle topic) are not
        published again: serving already has them, and a new version would make
        every replica swap to an identical model.
        """
        if publisher is None or (not force and self.step_no == self._published_step):
            return
        started = time.perf_counter()
        try:
            version = publisher.maybe_publish(
                self.step.model, step=self.step_no, offsets=self._trained_through(), force=force
            )
        except UserError:
            # Wrong credentials or permissions for the channel: no later interval can succeed, and a
            # trainer that silently never publishes is worse than one that stops with the reason.
            self.metrics.errors.labels(stage="publish", kind="fatal").inc()
            raise
        except KelpError as exc:
            # Serving keeps its current snapshot; training must not stop for it. Retried next interval.
            self.metrics.errors.labels(stage="publish", kind="retried" if exc.retriable else "fatal").inc()
            log.error("publishing a snapshot failed (serving keeps the previous one): %s", exc)
            return
        if version is not None:
            self._published_step = self.step_no
            self.report.published_version = version
            self.metrics.stage_seconds.labels(stage="publish").observe(time.perf_counter() - started)

    # ------------------------------------------------------------------ stopping

    def _drain(self, pipeline: TrainPipeline, publisher: Publisher | None) -> None:
        budget = self.cfg.trainer.drain_timeout_s
        deadline = time.monotonic() + budget
        self._state = "draining"
        self.metrics.ready.set(0)
        self.report.stopped_by = self._stop_reason
        log.info("draining (%s): stop fetching, push and commit what was trained", self._stop_reason)
        drained = pipeline.drain(max(0.0, deadline - time.monotonic()))
        if not drained:
            raise DrainTimeoutError(
                f"drain did not finish within trainer.drain_timeout_s={budget:g}s "
                f"(store slow or down); batches after step {pipeline.committed_step} will be read again"
            )
        self._last_tick = time.monotonic()
        self._maybe_checkpoint(force=True)
        self._maybe_publish(publisher, force=True)
        assert self.progress is not None
        self.progress.export_eval()
        self.progress.maybe_record(self.step_no, force=True)
        self._state = "stopped"
        log.info(
            "drained: %d steps this run, committed through step %d, checkpoint %s%s",
            self.report.steps,
            pipeline.committed_step,
            self.report.checkpoint,
            f" (rank {self.group.rank} of {self.group.size})" if self.group.distributed else "",
        )

    def _stage_totals(self) -> dict[str, float]:
        totals = {}
        for stage in STAGE_LABELS:
            value = self.registry.get_sample_value("kelp_trainer_stage_seconds_sum", {"stage": stage})
            if value:
                totals[stage] = value
        return totals


def _cheap_stats(store: EmbeddingStore) -> StoreStats | None:
    """The store's stats for the summary; a store that cannot answer now leaves them out."""
    try:
        return store.stats()
    except KelpError as exc:
        log.warning("store stats for the summary: %s", exc)
        return None
