"""A serving replica: the store, the snapshot channel, the watcher and the scorer, with one lifecycle.

Start order is store -> channel -> watcher (the first load is attempted
synchronously); stop is the reverse. The replica builds its store with the
trainer-side hot cache off (a write-back cache has no place on a read-only
path) and a short retry budget: a request should fail fast with 503, not wait
out the trainer's multi-second backoff.

Readiness (``/readyz``) = a model is loaded (and warmed up: the watcher scores
one synthetic request with each version before swapping it in) AND one
read-only store call succeeds (one id of the first table, ``count=False``: it
never writes). Without a model, the reason names the last snapshot refused
(its version, reason and message), so an operator sees why at once.

A keeper thread re-checks readiness every :data:`KEEP_INTERVAL_S` and sets
``kelp_serving_ready`` from it: the gauge follows this process's own state,
not whichever process last answered a ``/readyz``. Under several workers
(prometheus-client's multiprocess directory) it also removes the files of
workers that died without a word (:func:`~kelp.serving.metrics.reap_dead_workers`),
so their in-flight count and readiness leave the scrape.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.errors import KelpError
from kelp.metrics import multiprocess_dir
from kelp.publish.base import SnapshotChannel
from kelp.publish.publisher import build_channel
from kelp.retry import RetryPolicy
from kelp.serving.embeddings import RowFetcher
from kelp.serving.features import RequestParser
from kelp.serving.metrics import ServingMetrics, reap_dead_workers
from kelp.serving.model import ModelSlot
from kelp.serving.request_log import RequestLog
from kelp.serving.schemas import build_request_models
from kelp.serving.scorer import Scorer
from kelp.serving.watcher import SnapshotWatcher
from kelp.store.base import EmbeddingStore
from kelp.store.factory import build_store

__all__ = ["KEEP_INTERVAL_S", "SERVING_RETRY", "ServingReplica"]

log = logging.getLogger("kelp.serving")

# One quick retry for a dropped connection; then the request answers 503.
SERVING_RETRY = RetryPolicy(attempts=2, base_delay_s=0.005, max_delay_s=0.02)

KEEP_INTERVAL_S = 1.0
"""How often a replica refreshes its ready gauge (one read-only store call) and reaps dead workers' files."""


class ServingReplica:
    """Everything one serving process needs; see the module docstring.

    ``store`` and ``channel`` may be passed in (tests, benchmarks); otherwise
    they are built from ``cfg``. The replica owns and closes what it is given.
    """

    def __init__(
        self,
        cfg: KelpConfig,
        registry: CollectorRegistry | None = None,
        *,
        store: EmbeddingStore | None = None,
        channel: SnapshotChannel | None = None,
    ) -> None:
        self.cfg = cfg
        self.spec = cfg.features
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = ServingMetrics(self.registry)
        if store is None:
            store_cfg = cfg.store.model_copy(
                update={"hot_cache": cfg.store.hot_cache.model_copy(update={"enabled": False})}
            )
            extra = {} if store_cfg.backend == "memory" else {"retry": SERVING_RETRY, "writer": False}
            store = build_store(store_cfg, self.spec.store_tables(), cfg.deployment, self.registry, **extra)
        self.store = store
        try:
            self.channel = (
                channel if channel is not None else build_channel(cfg.publisher, cfg.store, cfg.deployment)
            )
        except BaseException:
            store.close()
            raise
        self.models = build_request_models(self.spec, cfg.serving)
        self.parser = RequestParser(self.spec, cfg.serving)
        self.slot = ModelSlot()
        self.fetcher = RowFetcher(self.store, self.metrics, cfg.serving.local_cache_ttl_ms)
        self.scorer = Scorer(self.spec, self.slot, self.fetcher, self.metrics)
        self.watcher = SnapshotWatcher(
            self.channel,
            self.spec,
            self.slot,
            self.metrics,
            cfg.serving.poll_interval_s,
            allowed_model=cfg.trainer.model,
            pinned_version=None if cfg.serving.model_version == "latest" else cfg.serving.model_version,
            warm_up=self.scorer.warm_up,
        )
        log_cfg = cfg.serving.request_log
        self.request_log = (
            RequestLog(log_cfg, cfg.source, self.scorer.model_spec.tasks, self.metrics)
            if log_cfg.enabled and isinstance(cfg.source, KafkaSourceConfig)
            else None
        )
        self._probe_table = next(iter(self.store.tables), None)
        self._started = False
        self._stop_keeper = threading.Event()
        self._keeper: threading.Thread | None = None

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._reap()  # a replacement worker clears what the worker it replaces left behind
            self.watcher.start()
            self._keeper = threading.Thread(target=self._keep, name="kelp-replica-keeper", daemon=True)
            self._keeper.start()

    def readiness(self) -> tuple[bool, str | None]:
        """``(ready, reason if not)``; performs one read-only store call."""
        if self.slot.current is None:
            reason = "no model snapshot loaded yet"
            if self.watcher.last_rejection:
                reason += f"; {self.watcher.last_rejection}"
            if self.watcher.last_error:
                reason += f" ({self.watcher.last_error})"
            return False, reason
        if self._probe_table is not None:
            try:
                self.store.pull_many({self._probe_table: np.zeros(1, np.uint64)}, count=False)
            except KelpError as exc:
                return False, f"store unavailable: {exc}"
        return True, None

    def _keep(self) -> None:
        """The keeper thread: the ready gauge from this process's state, and dead workers' files reaped."""
        failed: str | None = None
        while not self._stop_keeper.wait(KEEP_INTERVAL_S):
            try:
                ready, _ = self.readiness()
                self.metrics.ready.set(1 if ready else 0)
                self._reap()
                failed = None
            except Exception as exc:  # a bug must not end the thread; said once, tried again next round
                if failed != repr(exc):
                    log.exception("replica keeper failed; retrying every %.0f s", KEEP_INTERVAL_S)
                failed = repr(exc)

    def _reap(self) -> None:
        """Under several workers: remove the metric files of workers that died (a no-op otherwise)."""
        directory = multiprocess_dir()
        if directory is None:
            return
        try:
            reaped = reap_dead_workers(directory)
        except OSError as exc:  # the directory is the supervisor's: a problem there must not stop serving
            log.warning("could not remove dead workers' metric files in %s: %s", directory, exc)
            return
        if reaped:
            log.info("removed the metric files of dead worker process(es) %s", reaped)

    def close(self) -> None:
        """Stop watching, then release the channel and the store (reverse of start)."""
        self._stop_keeper.set()
        if self._keeper is not None:
            self._keeper.join(5.0)
            self._keeper = None
        self.watcher.stop()
        if self.request_log is not None:
            self.request_log.close()
        self.channel.close()
        self.store.close()
