"""The run summary names snapshots that never reached serving, read from the publisher's own counter."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from kelp.daemon.summary import summarize
from kelp.publish.metrics import PublisherMetrics
from kelp.trainer.evaluation import ProgressiveValidator


def _summary(registry: CollectorRegistry):
    report = SimpleNamespace(
        stopped_by="end of input", samples=10, steps=1, seconds=1.0, checkpoint=None, rank=0, world_size=1
    )
    return summarize(report, ProgressiveValidator(), None, registry)


def test_failed_publishes_are_counted_by_reason_in_the_summary() -> None:
    registry = CollectorRegistry()
    metrics = PublisherMetrics(registry)
    metrics.failures.labels(reason="evicted").inc(2)
    metrics.failures.labels(reason="unavailable").inc()
    summary = _summary(registry)
    assert summary.publish_failures == {"evicted": 2, "unavailable": 1}
    line = "snapshots not published (serving kept its previous one): 3 (evicted 2, unavailable 1)"
    assert line in summary.lines()
    assert '"publish_failures": {"evicted": 2, "unavailable": 1}' in summary.as_json()


def test_a_run_whose_publishes_all_landed_prints_no_publish_line() -> None:
    registry = CollectorRegistry()
    PublisherMetrics(registry)
    summary = _summary(registry)
    assert summary.publish_failures == {}
    assert not any("not published" in line for line in summary.lines())
