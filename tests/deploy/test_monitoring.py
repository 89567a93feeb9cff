"""The alert rules and the Grafana dashboard are valid PromQL over metrics Kelp really exports.

promtool (Debian package ``prometheus``) checks and unit-tests the rules and
parses every dashboard expression; the metric names are cross-checked against
one registry holding every Kelp metric family.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import ALERT_TESTS, ALERTS, DASHBOARD
from prometheus_client import CollectorRegistry

from kelp.consumers.metrics import ConsumerMetrics
from kelp.join.metrics import JoinMetrics
from kelp.metrics import registered_names
from kelp.publish.metrics import PublisherMetrics
from kelp.serving.metrics import ServingMetrics
from kelp.store.metrics import StoreMetrics
from kelp.trainer.metrics import TrainerMetrics

# Grafana's variables, replaced by values PromQL accepts before parsing.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$namespace": ".*",
    "$deployment": ".*",
}
# Names a Prometheus server adds itself; not Kelp's to export.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_METRIC = re.compile(r"\bkelp_[a-z0-9_]+\b")
# `by (...)` / `on (...)` label lists, and aggregations without one (over every series).
_GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")
_BARE_AGGREGATION = re.compile(r"\b(?:sum|max|min|avg|count)\s*\(")
# A Kelp series selector: the metric name and its label matchers, empty when it has none.
_SELECTOR = re.compile(r"\bkelp_[a-z0-9_]+\b(\{[^}]*\}|)")


def _promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, check=False, timeout=60
    )


def _dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) for every query target, nested rows included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                found.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"])
    return found


def _alert_exprs() -> list[tuple[str, str]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [
        (rule.get("alert") or rule["record"], rule["expr"]) for group in groups for rule in group["rules"]
    ]


def _grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def _metric_names(expr: str) -> set[str]:
    """Kelp metric names in a PromQL expression (string literals, i.e. label values, skipped)."""
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def _exposed_names() -> set[str]:
    """Every series name Kelp's registries expose, per family type, whether or not it has samples yet."""
    registry = CollectorRegistry()
    for metrics in (
        ConsumerMetrics,
        StoreMetrics,
        TrainerMetrics,
        PublisherMetrics,
        ServingMetrics,
        JoinMetrics,
    ):
        made = metrics(registry)
        if isinstance(made, StoreMetrics):
            made.hot_tier()  # registered only where a hot tier runs: a trainer's default
    names = registered_names(registry)
    # Every sample that exists already is among them.
    samples = {s.name for family in registry.collect() for s in family.samples}
    assert {n for n in samples if not n.endswith("_created")} <= names
    return names


# ------------------------------------------------------------------ alert rules


def test_promtool_check_rules(promtool: str) -> None:
    result = _promtool(promtool, "check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rule_unit_tests(promtool: str) -> None:
    result = _promtool(promtool, "test", "rules", ALERT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_aggregation_keeps_the_deployment() -> None:
    """Two deployments in one Prometheus never add up into one alert (or cancel each other out)."""
    for name, expr in _alert_exprs():
        assert not _BARE_AGGREGATION.findall(expr), f"{name}: an aggregation over every deployment"
        for clause in _GROUPING.findall(expr):
            assert "deployment" in {label.strip() for label in clause.split(",")}, f"{name}: by/on ({clause})"


def test_every_alert_has_a_unit_test() -> None:
    alerts = {name for name, _ in _alert_exprs()}
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert alerts == tested
    required = {
        "KelpTrainerStalled",
        "KelpConsumerLagGrowing",
        "KelpServingModelTooOld",
        "KelpServingErrorRate",
        "KelpStoreErrors",
        "KelpAUCDrop",
        "KelpJoinRateCollapse",
        "KelpJoinBacklog",
        "KelpJoinSendFailing",
    }
    assert required <= alerts


# ------------------------------------------------------------------ dashboard


def test_every_dashboard_expression_parses(promtool: str, tmp_path: Path) -> None:
    exprs = _dashboard_exprs()
    assert len(exprs) >= 40
    rules = [
        {"record": f"kelp:dashboard_panel_{i}", "expr": _grafana_to_promql(expr)}
        for i, (_title, expr) in enumerate(exprs)
    ]
    path = tmp_path / "dashboard-exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    result = _promtool(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_dashboard_panels_have_unique_ids_and_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace"} <= variables
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_query_shows_one_deployment() -> None:
    """Each series a panel reads is filtered by the deployment variable, which picks one release at a time.

    The chart's ServiceMonitor puts the label on every Kelp series; without the filter, two
    deployments in one namespace would be summed or averaged into one line.
    """
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "deployment"]
    assert variable["query"]["query"].endswith(", deployment)")
    assert not variable["multi"] and not variable["includeAll"]
    unfiltered = [
        (title, selector or "(no selector)")
        for title, expr in _dashboard_exprs()
        for selector in _SELECTOR.findall(_STRING.sub('""', expr.replace('"$deployment"', "DEPLOYMENT")))
        if "deployment=~DEPLOYMENT" not in selector
    ]
    assert unfiltered == []


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_name_is_exported_by_kelp(source: str) -> None:
    exprs = _dashboard_exprs() if source == "dashboard" else _alert_exprs()
    exposed = _exposed_names()
    unknown = {}
    for where, expr in exprs:
        names = _metric_names(expr)
        assert names, f"{where}: no Kelp metric in {expr!r}"
        missing = sorted(names - exposed)
        if missing:
            unknown[where] = missing
    assert unknown == {}


def test_dashboard_covers_every_subsystem() -> None:
    used = {name for _, expr in _dashboard_exprs() for name in _metric_names(expr)}
    for prefix in (
        "kelp_consumer_",
        "kelp_store_",
        "kelp_trainer_",
        "kelp_publisher_",
        "kelp_serving_",
        "kelp_join_",
    ):
        assert any(name.startswith(prefix) for name in used), prefix


def test_name_extraction_ignores_label_values() -> None:
    assert _metric_names('rate(kelp_a_total{x="kelp_not_a_metric"}[5m]) / kelp_b') == {
        "kelp_a_total",
        "kelp_b",
    }


# ------------------------------------------------------------------ dashboard layout


def _rows() -> dict[str, list[dict[str, Any]]]:
    """Top-level panels grouped under the row above them."""
    rows: dict[str, list[dict[str, Any]]] = {}
    current = ""
    for panel in sorted(
        json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"],
        key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]),
    ):
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = []
        else:
            rows.setdefault(current, []).append(panel)
    return rows


def test_dashboard_panels_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for y in range(pos["y"], pos["y"] + pos["h"]):
            for x in range(pos["x"], pos["x"] + pos["w"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def _row_queries(title: str) -> tuple[list[dict[str, Any]], list[str], set[str]]:
    """The panels of one dashboard row, their queries, and the Kelp metrics those read."""
    panels = _rows()[title]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    return panels, exprs, {name for expr in exprs for name in _metric_names(expr)}


def test_dashboard_has_a_trainer_group_row() -> None:
    """Per-rank throughput, all-reduce cost, group size, idle steps and the group's committed lag."""
    group, exprs, used = _row_queries("Trainer group")
    assert {
        "kelp_trainer_samples_total",
        "kelp_trainer_allreduce_seconds_sum",
        "kelp_trainer_allreduce_seconds_count",
        "kelp_trainer_allreduce_seconds_bucket",
        "kelp_trainer_world_size",
        "kelp_trainer_group_idle_steps_total",
        "kelp_consumer_committed_lag_records",
    } <= used
    per_rank = [e for e in exprs if "by (rank)" in e or "by (le, rank)" in e]
    for metric in (
        "kelp_trainer_samples_total",
        "kelp_trainer_allreduce_seconds_sum",
        "kelp_trainer_group_idle_steps_total",
    ):
        assert any(metric in e for e in per_rank), f"{metric}: no per-rank series"
    allreduce = next(p for p in group if "kelp_trainer_allreduce_seconds_sum" in p["targets"][0]["expr"])
    assert allreduce["fieldConfig"]["defaults"]["unit"] == "s"


def test_dashboard_has_a_join_row() -> None:
    """What the join alerts point at: samples per task and label, actions by result, late corrections
    and orphans, the waiting state, the watermark's lag and the label delay's quantiles."""
    join, exprs, used = _row_queries("Join")
    assert {
        "kelp_join_samples_total",
        "kelp_join_impressions_total",
        "kelp_join_actions_total",
        "kelp_join_late_corrections_total",
        "kelp_join_waiting_impressions",
        "kelp_join_waiting_bytes",
        "kelp_join_watermark_lag_seconds",
        "kelp_join_label_delay_seconds_bucket",
        "kelp_join_send_failures_total",
    } <= used
    assert any("sum by (task, label)" in e and "kelp_join_samples_total" in e for e in exprs)
    assert any("sum by (task, result)" in e and "kelp_join_actions_total" in e for e in exprs)
    assert any('result="orphan"' in e for e in exprs)
    delay = [e for e in exprs if "kelp_join_label_delay_seconds_bucket" in e]
    assert sorted(e.split(",")[0] for e in delay) == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    units = {panel["title"]: panel["fieldConfig"]["defaults"]["unit"] for panel in join}
    assert units["Watermark lag"] == units["Label delay"] == "s" and units["Waiting state size"] == "bytes"
