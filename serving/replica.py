"""A serving replica: the store, the snapshot channel, the watcher and the scorer, with one lifecycle.

Start order is store -> channel -> watcher (the first load is attempted
synchronously); stop is the reverse. The replica builds its store with the
trainer-side hot cache off (a write-back cache has no place on a read-only
path) and a short retry budget: a request should fail fast with 503, not wait
out the trainer's multi-second backoff.

Readiness (``/readyz``) = a model is loaded (and warmed up: the watcher scores
one synthetic request with each version before swapping it in) AND one
read-only store call succeeds (one id of the first table, ``count=False``: it
never writes).
"""

from __future__ import annotations

import logging

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.errors import KelpError
from kelp.publish.base import SnapshotChannel
from kelp.publish.publisher import build_channel
from kelp.retry import RetryPolicy
from kelp.serving.embeddings import RowFetcher
from kelp.serving.features import RequestParser
from kelp.serving.metrics import ServingMetrics
from kelp.serving.model import ModelSlot
from kelp.serving.request_log import RequestLog
from kelp.serving.schemas import build_request_models
from kelp.serving.scorer import Scorer
from kelp.serving.watcher import SnapshotWatcher
from kelp.store.base import EmbeddingStore
from kelp.store.factory import build_store

__all__ = ["SERVING_RETRY", "ServingReplica"]

log = logging.getLogger("kelp.serving")

# One quick retry for a dropped connection; then the request answers 503.
SERVING_RETRY = RetryPolicy(attempts=2, base_delay_s=0.005, max_delay_s=0.02)


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

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.watcher.start()

    def readiness(self) -> tuple[bool, str | None]:
        """``(ready, reason if not)``; performs one read-only store call."""
        if self.slot.current is None:
            reason = "no model snapshot loaded yet"
            if self.watcher.last_error:
                reason += f" ({self.watcher.last_error})"
            return False, reason
        if self._probe_table is not None:
            try:
                self.store.pull_many({self._probe_table: np.zeros(1, np.uint64)}, count=False)
            except KelpError as exc:
                return False, f"store unavailable: {exc}"
        return True, None

    def close(self) -> None:
        """Stop watching, then release the channel and the store (reverse of start)."""
        self.watcher.stop()
        if self.request_log is not None:
            self.request_log.close()
        self.channel.close()
        self.store.close()
