"""Riding out a store outage: retry for a bounded time, then fail loudly.

The store retries each operation a few times on its own (``store.retry``);
that covers a blip. A Redis restart or failover takes seconds, so the trainer
keeps retrying a failed pull or push for up to ``trainer.max_store_outage_s``
without committing anything, and only then gives up with a
:class:`StoreOutageError` (the process exits non-zero and Kubernetes restarts
it; no acknowledged update is lost because nothing unacknowledged was committed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kelp.trainer.metrics import TrainerMetrics

from kelp.errors import KelpError, StoreUnavailableError

__all__ = ["OutageGuard", "StoreOutageError"]

T = TypeVar("T")
log = logging.getLogger("kelp.train")


class StoreOutageError(StoreUnavailableError):
    """The store stayed unreachable longer than the outage budget."""

    retriable = False


class OutageGuard:
    """Retries retriable :class:`KelpError` s with capped backoff for up to ``budget_s`` per outage."""

    def __init__(
        self,
        budget_s: float,
        metrics: TrainerMetrics,
        *,
        max_delay_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_s = budget_s
        self.metrics = metrics
        self.max_delay_s = max_delay_s
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._failing: set[str] = set()

    @property
    def in_outage(self) -> bool:
        """True while some stage is retrying (readiness reports it)."""
        return bool(self._failing)

    def call(self, stage: str, fn: Callable[[], T]) -> T:
        started: float | None = None
        delay = 0.05
        while True:
            try:
                result = fn()
            except KelpError as exc:
                if not exc.retriable:
                    self.metrics.errors.labels(stage=stage, kind="fatal").inc()
                    raise
                now = self._clock()
                if started is None:
                    started = now
                    with self._lock:
                        self._failing.add(stage)
                    log.warning(
                        "store unavailable during %s, retrying for up to %.0fs: %s", stage, self.budget_s, exc
                    )
                self.metrics.errors.labels(stage=stage, kind="retried").inc()
                if now - started >= self.budget_s:
                    self.metrics.errors.labels(stage=stage, kind="fatal").inc()
                    raise StoreOutageError(
                        f"store unreachable for {now - started:.0f}s during {stage} "
                        f"(trainer.max_store_outage_s={self.budget_s:g}): {exc}"
                    ) from exc
                self._sleep(delay)
                delay = min(self.max_delay_s, delay * 2)
                continue
            if started is not None:
                with self._lock:
                    self._failing.discard(stage)
                log.info("store reachable again after %.1fs (%s)", self._clock() - started, stage)
            return result
