"""Metric naming rules and the two log formats."""

from __future__ import annotations

import io
import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kelp.logs import configure_logging
from kelp.metrics import Children, MetricFactory, registered_names


def test_factory_applies_namespace_subsystem_and_units(metrics_registry: CollectorRegistry) -> None:
    m = MetricFactory("store", metrics_registry)
    m.counter("rows_pulled", "rows", ["table"]).labels(table="t").inc(2)
    m.histogram("pull", "latency").observe(0.01)
    m.gauge("queue_depth", "depth").set(3)
    m.counter("transferred", "bytes moved", unit="bytes").inc(10)
    assert m.names() == [
        "kelp_store_rows_pulled_total",
        "kelp_store_pull_seconds",
        "kelp_store_queue_depth",
        "kelp_store_transferred_bytes_total",
    ]
    exposed = generate_latest(metrics_registry).decode()
    assert 'kelp_store_rows_pulled_total{table="t"} 2.0' in exposed
    assert "kelp_store_pull_seconds_bucket" in exposed
    names = registered_names(metrics_registry)
    assert {"kelp_store_rows_pulled_total", "kelp_store_pull_seconds_count"} <= names


@pytest.mark.parametrize(
    ("name", "unit", "problem"),
    [
        ("rows_total", "", "leave out '_total'"),
        ("latency_ms", "", "base units"),
        ("Latency", "", "snake_case"),
        ("latency", "milliseconds", "not a base unit"),
    ],
)
def test_factory_rejects_names_that_break_conventions(
    metrics_registry: CollectorRegistry, name: str, unit: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        MetricFactory("x", metrics_registry).counter(name, "doc", unit=unit)


def test_empty_subsystem_gives_top_level_names(metrics_registry: CollectorRegistry) -> None:
    m = MetricFactory("", metrics_registry)
    m.counter("records_rejected", "rejected", ["reason"]).labels(reason="bad_msgpack").inc()
    assert "kelp_records_rejected_total" in registered_names(metrics_registry)


def test_json_log_lines_carry_extra_fields() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    logging.getLogger("kelp.test").info("batch done", extra={"step": 3, "table": "C1"})
    doc = json.loads(out.getvalue().strip().splitlines()[-1])
    assert doc["msg"] == "batch done"
    assert doc["level"] == "info"
    assert doc["logger"] == "kelp.test"
    assert doc["step"] == 3
    assert doc["table"] == "C1"


def test_text_log_lines_are_human_readable() -> None:
    out = io.StringIO()
    configure_logging("debug", "text", stream=out)
    logging.getLogger("kelp.test").warning("slow pull", extra={"shard": 2})
    line = out.getvalue().strip().splitlines()[-1]
    assert "warning kelp.test: slow pull shard=2" in line


def test_children_inc_counts_like_the_child_and_refuses_a_decrease() -> None:
    registry = CollectorRegistry()
    counter = MetricFactory("store", registry).counter("rows_pulled", "Rows", ["table"])
    children = Children(counter)
    children.inc(3, "a")
    children("a").inc(2)
    children.inc(0, "b")
    assert registry.get_sample_value("kelp_store_rows_pulled_total", {"table": "a"}) == 5.0
    assert registry.get_sample_value("kelp_store_rows_pulled_total", {"table": "b"}) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        children.inc(-1, "a")
