"""The trainer's outage guard: the shared retry policy plus readiness, metrics and the fatal error."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from kelp.daemon.outage import OutageGuard, StoreOutageError, outage_policy
from kelp.errors import StoreUnavailableError, UserError
from kelp.trainer.metrics import TrainerMetrics


class _FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def clock(self) -> float:
        return self.now


def _guard(budget_s: float = 10.0) -> tuple[OutageGuard, CollectorRegistry, _FakeTime]:
    registry = CollectorRegistry()
    t = _FakeTime()
    guard = OutageGuard(
        budget_s, TrainerMetrics(registry), policy=outage_policy(budget_s, sleep=t.sleep, clock=t.clock)
    )
    return guard, registry, t


def _errors(registry: CollectorRegistry, kind: str) -> float:
    return registry.get_sample_value("kelp_trainer_errors_total", {"stage": "push", "kind": kind}) or 0.0


def test_retries_until_the_store_is_back_and_reports_the_outage_meanwhile() -> None:
    guard, registry, _ = _guard()
    seen_in_outage: list[bool] = []
    calls = iter([StoreUnavailableError("down"), StoreUnavailableError("down"), "ok"])

    def op() -> str:
        seen_in_outage.append(guard.in_outage)
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    assert guard.call("push", op) == "ok"
    assert seen_in_outage == [False, True, True]  # readiness flips on the first retry
    assert not guard.in_outage  # and back once the call succeeded
    assert _errors(registry, "retried") == 2
    assert _errors(registry, "fatal") == 0


def test_past_the_budget_it_raises_a_non_retriable_outage_error() -> None:
    guard, registry, t = _guard(budget_s=3.0)

    def down() -> None:
        raise StoreUnavailableError("connection refused")

    with pytest.raises(StoreOutageError, match=r"max_store_outage_s=3\b.*connection refused") as err:
        guard.call("push", down)
    assert err.value.retriable is False
    assert t.now == pytest.approx(3.0)
    assert _errors(registry, "fatal") == 1
    assert not guard.in_outage


def test_a_non_retriable_error_is_not_retried() -> None:
    guard, registry, t = _guard()

    def denied() -> None:
        raise UserError("store h:1: authentication failed")

    with pytest.raises(UserError):
        guard.call("push", denied)
    assert t.now == 0.0
    assert _errors(registry, "retried") == 0
    assert _errors(registry, "fatal") == 1
