"""Riding out a store outage: readiness and metrics around the one retry policy.

The store retries each operation a few times on its own (``store.retry``);
that covers a blip. A Redis restart or failover takes seconds, so the trainer
keeps retrying a failed pull or push for up to ``trainer.max_store_outage_s``
without committing anything, and only then gives up with a
:class:`StoreOutageError` (the process exits non-zero and Kubernetes restarts
it; no acknowledged update is lost because nothing unacknowledged was committed).

The retrying itself is :class:`~kelp.retry.RetryPolicy` with a deadline and
jitter; :class:`OutageGuard` only reports: readiness says "store unavailable,
retrying" while any stage is retrying, ``kelp_trainer_errors_total`` counts
retried and fatal errors, and the log says when an outage starts and ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kelp.errors import KelpError, StoreUnavailableError
from kelp.retry import RetryPolicy
from kelp.trainer.metrics import TrainerMetrics

__all__ = ["OutageGuard", "StoreOutageError", "outage_policy"]

T = TypeVar("T")
log = logging.getLogger("kelp.train")


class StoreOutageError(StoreUnavailableError):
    """The store stayed unreachable longer than the outage budget."""

    retriable = False


def outage_policy(
    budget_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> RetryPolicy:
    """Retry retriable errors until ``budget_s`` after the first failure, backing off to 1 s with jitter."""
    return RetryPolicy(
        attempts=None, base_delay_s=0.05, max_delay_s=1.0, deadline_s=budget_s, sleep=sleep, clock=clock
    )


class OutageGuard:
    """Runs store calls under :func:`outage_policy`; tracks which stages are in an outage."""

    def __init__(
        self, budget_s: float, metrics: TrainerMetrics, *, policy: RetryPolicy | None = None
    ) -> None:
        self.budget_s = budget_s
        self.metrics = metrics
        self.policy = policy or outage_policy(budget_s)
        self._lock = threading.Lock()
        self._failing: dict[str, float] = {}  # stage -> when its outage began (monotonic)

    @property
    def in_outage(self) -> bool:
        """True while some stage is retrying (readiness reports it)."""
        with self._lock:
            return bool(self._failing)

    def call(self, stage: str, fn: Callable[[], T]) -> T:
        def on_retry(_n: int, exc: BaseException) -> None:
            self.metrics.errors.labels(stage=stage, kind="retried").inc()
            with self._lock:
                first = stage not in self._failing
                self._failing.setdefault(stage, time.monotonic())
            if first:
                log.warning(
                    "store unavailable during %s, retrying for up to %.0fs: %s", stage, self.budget_s, exc
                )

        try:
            result = self.policy.call(fn, on_retry)
        except KelpError as exc:
            self.metrics.errors.labels(stage=stage, kind="fatal").inc()
            began = self._recovered(stage)
            if exc.retriable:  # still retriable, so the budget ran out
                lasted = time.monotonic() - began if began is not None else 0.0
                raise StoreOutageError(
                    f"store unreachable for {lasted:.0f}s during {stage} "
                    f"(trainer.max_store_outage_s={self.budget_s:g}): {exc}"
                ) from exc
            raise
        began = self._recovered(stage)
        if began is not None:
            log.info("store reachable again after %.1fs (%s)", time.monotonic() - began, stage)
        return result

    def _recovered(self, stage: str) -> float | None:
        with self._lock:
            return self._failing.pop(stage, None)
