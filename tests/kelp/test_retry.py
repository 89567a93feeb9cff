"""The shared retry policy, exercised without sleeping."""

from __future__ import annotations

import pytest

from kelp.errors import KelpError, StoreUnavailableError
from kelp.retry import RetryPolicy


def _policy(attempts: int = 4) -> tuple[RetryPolicy, list[float]]:
    slept: list[float] = []
    return RetryPolicy(attempts=attempts, base_delay_s=0.1, max_delay_s=0.3, sleep=slept.append), slept


def test_retriable_errors_are_retried_until_success() -> None:
    policy, slept = _policy()
    calls = iter([StoreUnavailableError("down"), StoreUnavailableError("down"), "ok"])

    def op() -> str:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    assert policy.call(op) == "ok"
    assert len(slept) == 2
    assert all(0 <= d <= 0.3 for d in slept)


def test_gives_up_after_attempts_with_the_last_error() -> None:
    policy, slept = _policy(attempts=3)
    seen: list[int] = []

    def op() -> None:
        seen.append(1)
        raise StoreUnavailableError(f"down {len(seen)}")

    with pytest.raises(StoreUnavailableError, match="down 3"):
        policy.call(op)
    assert len(seen) == 3
    assert len(slept) == 2


def test_non_retriable_errors_are_not_retried() -> None:
    policy, slept = _policy()
    seen: list[int] = []

    def op() -> None:
        seen.append(1)
        raise KelpError("bad input")

    with pytest.raises(KelpError):
        policy.call(op)
    assert seen == [1]
    assert slept == []


def test_backoff_ceiling_grows_then_caps() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=0.1, max_delay_s=0.5)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (9, 0.5)]:
        assert all(0 <= policy.delay_for(retry) <= ceiling for _ in range(50))


def test_invalid_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_on_retry_hook_sees_each_failure() -> None:
    policy, _ = _policy(attempts=3)
    hooks: list[int] = []
    with pytest.raises(StoreUnavailableError):
        policy.call(
            lambda: (_ for _ in ()).throw(StoreUnavailableError("x")), on_retry=lambda n, e: hooks.append(n)
        )
    assert hooks == [1, 2]
