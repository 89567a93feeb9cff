"""``kelp train``: the continual-learning trainer daemon.

Lifecycle (started in this order, stopped in reverse)::

    health/metrics HTTP ─> store ─> model + checkpoint restore ─> publisher ─> source
      ─> prefetch thread + push thread ─> ready ─> train forever

Every step: take a prefetched batch, apply the in-flight overlay (so it sees
every earlier step's update, see :mod:`kelp.daemon.ledger`), train, record
its updates, hand them to the write-behind pusher, which pushes and commits
the batch's offsets once the store says those pushes are durable
(``store.flush(force=False)``; see :mod:`kelp.daemon.pipeline`). Dense checkpoints every
``checkpoint_every_steps`` or ``checkpoint_every_s``; a snapshot for serving
every ``publisher.interval_s``.

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
from dataclasses import dataclass, field
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.daemon.health import HealthServer
from kelp.daemon.ledger import UpdateLedger
from kelp.daemon.outage import OutageGuard
from kelp.daemon.pipeline import END, Prefetcher, Prepared, PushWriter
from kelp.daemon.preflight import preflight
from kelp.errors import KelpError, UserError
from kelp.trainer.metrics import STAGE_LABELS, TrainerMetrics

__all__ = ["DrainTimeoutError", "TrainDaemon", "TrainReport"]

log = logging.getLogger("kelp.train")
_TICK_S = 0.25


def _cpu_threads(cfg: KelpConfig) -> int:
    """Intra-op threads: leave a core to the prefetch and push threads, or the two fight over CPUs.

    Measured on 2 cores (``kelp bench train``): with torch on both cores and the
    I/O threads busy, forward/backward ran several times slower than alone.
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


class TrainDaemon:
    """One trainer process. ``run()`` blocks until stopped; ``request_stop()`` is signal-safe.

    ``http=False`` skips the health/metrics server (benchmarks, embedded use);
    ``publish=False`` skips the publisher (no serving in the loop). ``origin``
    names the config in errors (the file path, from the CLI).
    """

    def __init__(
        self,
        cfg: KelpConfig,
        *,
        registry: CollectorRegistry | None = None,
        http: bool = True,
        publish: bool = True,
        on_step: Any = None,
        origin: str = "config",
    ) -> None:
        self.cfg = cfg
        self.origin = origin
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = TrainerMetrics(self.registry)
        self.guard = OutageGuard(cfg.trainer.max_store_outage_s, self.metrics)
        self._http = http
        self._publish = publish
        self._on_step = on_step
        self._stop = threading.Event()
        self._stop_reason = ""
        self._state = "starting"
        self._last_tick = time.monotonic()
        self._health: HealthServer | None = None
        self.report = TrainReport()

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
        return True, "ready"

    # ------------------------------------------------------------------ run

    def run(self) -> TrainReport:
        from kelp.consumers import build_source
        from kelp.store import build_store

        cfg = self.cfg
        preflight(cfg, self.origin, role="train")  # what `kelp config validate` refuses, refused here too
        started = time.perf_counter()
        threads_before = torch.get_num_threads()
        if self._http and cfg.metrics.enabled:
            self._health = HealthServer(
                cfg.metrics.host, cfg.metrics.port, self.registry, self.liveness, self.readiness
            ).start()
        try:
            with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, self.registry) as store:
                self._build_model()
                publisher = self._build_publisher()
                try:
                    with build_source(cfg.source, cfg.features, cfg.batching, self.registry) as source:
                        self._loop(source, store, publisher)
                finally:
                    if publisher is not None:
                        publisher.close()
        finally:
            self.report.seconds = time.perf_counter() - started
            self.report.stage_seconds = self._stage_totals()
            self.metrics.ready.set(0)
            torch.set_num_threads(threads_before)
            if self._health is not None:
                self._health.stop()
        return self.report

    def _build_model(self) -> None:
        from kelp.trainer import ProgressiveValidator, TrainStep, build_model, resolve_device
        from kelp.trainer.checkpoint import config_hash, load_latest

        cfg = self.cfg
        device = resolve_device(cfg.trainer.device)
        self.validator = ProgressiveValidator(window_batches=cfg.trainer.eval_window_batches)
        self.step = TrainStep(
            build_model(cfg.features, cfg.trainer),
            cfg.features,
            cfg.trainer,
            device,
            validator=self.validator,
        )
        self.config_hash = config_hash(cfg.features, cfg.trainer)
        info = load_latest(
            cfg.trainer.checkpoint_dir,
            self.step.model,
            self.step.optimizer,
            expected_config_hash=self.config_hash,
        )
        self.step_no = 0
        self.offsets: dict[tuple[str, int], int] = {}
        if info is not None:
            self.step_no = info.step
            self.offsets = dict(info.offsets)
            self.report.resumed_from = str(info.path)
            self.metrics.checkpoint_written(info.created_at)
            log.info("resumed dense model from %s (step %d)", info.path.name, info.step)
        else:
            log.info("no checkpoint in %s: starting a fresh model", cfg.trainer.checkpoint_dir)
        self.report.first_step = self.step_no
        if device.type == "cpu":
            torch.set_num_threads(_cpu_threads(cfg))
        log.info("model %s on %s (%d intra-op threads)", cfg.trainer.model, device, torch.get_num_threads())

    def _build_publisher(self) -> Any:
        if not (self._publish and self.cfg.publisher.enabled):
            return None
        from kelp.publish import build_publisher

        return build_publisher(self.cfg, self.registry)

    def _loop(self, source: Any, store: Any, publisher: Any) -> None:
        cfg = self.cfg.trainer
        ledger = self.ledger = UpdateLedger(acked=self.step_no)
        prefetcher = Prefetcher(
            source, store, ledger, guard=self.guard, metrics=self.metrics, depth=cfg.prefetch_batches
        )
        writer = PushWriter(
            source,
            store,
            ledger,
            guard=self.guard,
            metrics=self.metrics,
            depth=cfg.push_queue_batches,
            threaded=cfg.prefetch_batches > 0,
        )
        writer.start()
        prefetcher.start()
        self._state = "training"
        self.metrics.ready.set(1)
        log.info("training (prefetch %d, write-behind %d)", cfg.prefetch_batches, cfg.push_queue_batches)
        self._last_checkpoint_s = time.monotonic()
        self._last_checkpoint_step = self.step_no
        self._last_log = (time.monotonic(), self.report.samples)
        try:
            while not self._stop.is_set():
                self._last_tick = time.monotonic()
                writer.check()
                wait_started = time.perf_counter()
                item = prefetcher.next(_TICK_S)
                if item is None:
                    continue
                if item is END:
                    self.request_stop("source exhausted")
                    break
                assert isinstance(item, Prepared)
                self.metrics.stage_seconds.labels(stage="fetch").observe(time.perf_counter() - wait_started)
                self._train_one(item, ledger, writer)
                if cfg.max_steps is not None and self.step_no - self.report.first_step >= cfg.max_steps:
                    self.request_stop("max_steps")
                self._maybe_checkpoint(force=False)
                self._maybe_publish(publisher, force=False)
                self._maybe_log()
        except BaseException:
            self._state = "failed"
            self.metrics.ready.set(0)
            prefetcher.stop()
            raise
        self._drain(prefetcher, writer, publisher)

    def _train_one(self, item: Prepared, ledger: UpdateLedger, writer: PushWriter) -> None:
        batch = item.batch
        unique = {table: t.unique_ids for table, t in batch.tables.items()}
        pulled = ledger.apply(item.watermark, item.pulled, unique)
        result = self.step(batch, pulled)
        self.step_no += 1
        ledger.record(self.step_no, result.updates)
        writer.submit(self.step_no, batch, result.updates)
        for r in batch.sources:
            key = (r.topic, r.partition)
            self.offsets[key] = max(self.offsets.get(key, 0), r.last_offset + 1)
        self.report.steps += 1
        self.report.samples += batch.size
        self.report.losses.append(result.loss)
        m = self.metrics
        m.steps.inc()
        m.samples.inc(batch.size)
        m.loss.set(result.loss)
        m.last_step.set(time.time())
        m.observe_stages(result.timings)
        m.inflight_rows.set(ledger.rows())
        if self._on_step is not None:
            self._on_step(self.step_no, batch, result)

    # ------------------------------------------------------------------ periodic work

    def _maybe_checkpoint(self, force: bool) -> None:
        from kelp.trainer.checkpoint import save_checkpoint

        cfg = self.cfg.trainer
        due = (
            self.step_no - self._last_checkpoint_step >= cfg.checkpoint_every_steps
            or time.monotonic() - self._last_checkpoint_s >= cfg.checkpoint_every_s
        )
        if not (force or due) or self.step_no == self._last_checkpoint_step:
            return
        started = time.perf_counter()
        try:
            path = save_checkpoint(
                cfg.checkpoint_dir,
                self.step.model,
                self.step.optimizer,
                step=self.step_no,
                config_hash=self.config_hash,
                offsets=self.offsets,
            )
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

    def _maybe_publish(self, publisher: Any, force: bool) -> None:
        if publisher is None:
            return
        started = time.perf_counter()
        try:
            version = publisher.maybe_publish(
                self.step.model, step=self.step_no, offsets=self.offsets, force=force
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
            self.report.published_version = version
            self.metrics.stage_seconds.labels(stage="publish").observe(time.perf_counter() - started)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        since, samples_then = self._last_log
        if now - since < self.cfg.trainer.log_every_s:
            return
        rate = (self.report.samples - samples_then) / (now - since)
        self._last_log = (now, self.report.samples)
        self._export_eval()
        self.metrics.samples_per_second.set(rate)
        log.info(
            "step %d  samples %d  %.0f samples/s  loss %.4f  AUC window %.3f cumulative %.3f",
            self.step_no,
            self.report.samples,
            rate,
            self.report.losses[-1] if self.report.losses else float("nan"),
            self.report.window_auc,
            self.report.auc,
        )

    def _export_eval(self) -> None:
        window, total = self.validator.windowed(), self.validator.cumulative()
        self.report.window_auc, self.report.auc = window.auc, total.auc
        for name, result in (("window", window), ("cumulative", total)):
            self.metrics.auc.labels(window=name).set(result.auc)
            self.metrics.logloss.labels(window=name).set(result.log_loss)

    # ------------------------------------------------------------------ stopping

    def _drain(self, prefetcher: Prefetcher, writer: PushWriter, publisher: Any) -> None:
        budget = self.cfg.trainer.drain_timeout_s
        deadline = time.monotonic() + budget
        self._state = "draining"
        self.metrics.ready.set(0)
        self.report.stopped_by = self._stop_reason
        log.info("draining (%s): stop fetching, push and commit what was trained", self._stop_reason)
        prefetcher.stop()
        if not writer.drain(max(0.0, deadline - time.monotonic())):
            raise DrainTimeoutError(
                f"drain did not finish within trainer.drain_timeout_s={budget:g}s "
                f"(store slow or down); batches after step {writer.committed_step} will be read again"
            )
        self._last_tick = time.monotonic()
        self._maybe_checkpoint(force=True)
        self._maybe_publish(publisher, force=True)
        self._export_eval()
        self._state = "stopped"
        log.info(
            "drained: %d steps this run, committed through step %d, checkpoint %s",
            self.report.steps,
            writer.committed_step,
            self.report.checkpoint,
        )

    def _stage_totals(self) -> dict[str, float]:
        totals = {}
        for stage in STAGE_LABELS:
            value = self.registry.get_sample_value("kelp_trainer_stage_seconds_sum", {"stage": stage})
            if value:
                totals[stage] = value
        return totals
