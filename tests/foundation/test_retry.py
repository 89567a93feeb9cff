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


class _FakeTime:
    """A clock that only moves when the policy sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def _always_down() -> None:
    raise StoreUnavailableError("down")


def test_deadline_bounds_retries_measured_from_the_first_failure() -> None:
    t = _FakeTime()
    policy = RetryPolicy(
        attempts=None, base_delay_s=0.5, max_delay_s=2.0, deadline_s=5.0, sleep=t.sleep, clock=t.clock
    )
    with pytest.raises(StoreUnavailableError, match="down"):
        policy.call(_always_down)
    assert t.now - 100.0 == pytest.approx(5.0)  # slept right up to the deadline, never past it
    assert sum(t.slept) == pytest.approx(5.0)
    assert all(d <= 2.0 for d in t.slept)


def test_deadline_and_attempts_whichever_comes_first() -> None:
    t = _FakeTime()
    policy = RetryPolicy(attempts=3, base_delay_s=0.01, deadline_s=60.0, sleep=t.sleep, clock=t.clock)
    with pytest.raises(StoreUnavailableError):
        policy.call(_always_down)
    assert len(t.slept) == 2


def test_jitter_spreads_delays() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=1.0, max_delay_s=1.0)
    assert len({round(policy.delay_for(3), 6) for _ in range(20)}) > 1


def test_a_policy_must_be_bounded() -> None:
    with pytest.raises(ValueError, match="never gives up"):
        RetryPolicy(attempts=None, deadline_s=None)
