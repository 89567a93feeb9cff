"""The one retry/backoff helper Kelp uses.

A :class:`RetryPolicy` is a value object: how many attempts, how the delay
grows, and which errors are worth retrying. The sleep function is injected so
tests can exercise the policy without waiting.
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

    ``attempts`` counts the first try, so ``attempts=1`` never retries. The
    delay before retry *k* (1-based) is drawn uniformly from
    ``[0, min(max_delay_s, base_delay_s * 2**(k-1))]`` ("full jitter"), which
    keeps many trainers from hammering a recovering Redis in lock-step.
    """

    attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    retry_on: Callable[[BaseException], bool] = _is_retriable
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must be >= 0")

    def delay_for(self, retry_number: int) -> float:
        """Delay in seconds before the given retry (1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** (retry_number - 1)))
        return self.rng.uniform(0.0, ceiling)

    def call(self, fn: Callable[[], T], on_retry: Callable[[int, BaseException], None] | None = None) -> T:
        """Run ``fn`` until it succeeds, a non-retriable error occurs, or attempts run out.

        The last error is re-raised unchanged, so callers see the real cause.
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except BaseException as exc:
                if attempt == self.attempts or not self.retry_on(exc):
                    raise
                if on_retry is not None:
                    on_retry(attempt, exc)
                self.sleep(self.delay_for(attempt))
        raise AssertionError("unreachable")  # pragma: no cover
