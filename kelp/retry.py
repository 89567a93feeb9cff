"""The one retry/backoff helper Kelp uses.

A :class:`RetryPolicy` is a value object: how many attempts, for how long at
most, how the delay grows, and which errors are worth retrying. Sleep and
clock are injected so tests exercise the policy without waiting. Every retry
loop in Kelp (a store round trip, the trainer riding out a Redis restart, a
serving read) is this policy with different numbers; nothing hand-writes a
backoff loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kelp.errors import KelpError

__all__ = ["RetryPolicy"]

T = TypeVar("T")


def _is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, KelpError) and exc.retriable


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with capped exponential backoff and full jitter.

    Bounded by ``attempts`` (the first try counts, so ``attempts=1`` never
    retries), by ``deadline_s`` (seconds since the first failure after which
    no retry starts), or both; ``attempts=None`` retries until the deadline.
    The delay before retry *k* (1-based) is drawn uniformly from
    ``[0, min(max_delay_s, base_delay_s * 2**(k-1))]`` ("full jitter", which
    keeps many trainers from hammering a recovering Redis in lock-step), and
    never sleeps past the deadline.
    """

    attempts: int | None = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    deadline_s: float | None = None
    retry_on: Callable[[BaseException], bool] = _is_retriable
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts is None and self.deadline_s is None:
            raise ValueError("a retry policy needs attempts, deadline_s or both (else it never gives up)")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise ValueError(f"deadline_s must be >= 0, got {self.deadline_s}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must be >= 0")

    def delay_for(self, retry_number: int) -> float:
        """Delay in seconds before the given retry (1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** min(retry_number - 1, 62)))
        return self.rng.uniform(0.0, ceiling)

    def call(self, fn: Callable[[], T], on_retry: Callable[[int, BaseException], None] | None = None) -> T:
        """Run ``fn`` until it succeeds, a non-retriable error occurs, or the attempts or deadline run out.

        ``on_retry(n, exc)`` runs before the n-th retry's sleep (metrics, logs).
        The last error is re-raised unchanged, so callers see the real cause
        (and, from ``exc.retriable``, whether it was the budget that ran out).
        """
        attempt = 0
        first_failure: float | None = None
        while True:
            attempt += 1
            try:
                return fn()
            except BaseException as exc:
                now = self.clock()
                if first_failure is None:
                    first_failure = now
                elapsed = now - first_failure
                out_of_attempts = self.attempts is not None and attempt >= self.attempts
                out_of_time = self.deadline_s is not None and elapsed >= self.deadline_s
                if out_of_attempts or out_of_time or not self.retry_on(exc):
                    raise
                if on_retry is not None:
                    on_retry(attempt, exc)
                delay = self.delay_for(attempt)
                if self.deadline_s is not None:
                    delay = min(delay, self.deadline_s - elapsed)
                self.sleep(delay)
