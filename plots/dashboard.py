"""Kelp's Grafana dashboard (``helm/kelp/files/kelp-dashboard.json``) as data: panels, queries, units.

The preview draws what the dashboard shows, so it reads the same JSON the
chart ships: panel titles, each target's PromQL and legend, the panel's unit
(``fieldConfig.defaults.unit``) and its place (``gridPos``, 24 columns wide).
:data:`KEY_PANELS` names the panels a person checks first; a renamed panel
fails loudly here rather than dropping out of the picture.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kelp
from kelp.errors import UserError

__all__ = [
    "KEY_PANELS",
    "OVERVIEW_ROW",
    "Panel",
    "Target",
    "default_dashboard_path",
    "grafana_to_promql",
    "key_panels",
    "legend",
    "load_dashboard",
    "metric_names",
]

KEY_PANELS: dict[str, str] = {
    "Throughput": "training throughput",
    "Stage latency p99": "batch/step latency",
    "Store operation latency p99": "store pull/push latency",
    "Consumer lag by topic": "Kafka lag",
    "Hot tier staleness (oldest update not yet in Redis)": "hot tier staleness",
    "Requests by endpoint and status": "serving request rate",
    "Serving latency": "serving latency quantiles",
    "Kafka commits and dead letters": "dead letters",
    "Serving errors": "serving errors",
    "Serving load": "readiness",
    "Model versions": "published and served model versions",
    "Model age": "model freshness",
    "Store hit ratio": "store hits",
}
"""Title in the dashboard -> what it answers; drawn in dashboard order."""

OVERVIEW_ROW = "Overview"
"""The row of stat panels drawn as a strip of last values above the graphs."""

_METRIC = re.compile(r"\bkelp_[a-z0-9_]+\b")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Target:
    """One query of a panel: its PromQL (with Grafana variables) and legend format."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A stat or time-series panel with the row it sits in (``row``) and its grid place."""

    title: str
    kind: str
    unit: str
    row: str
    x: int
    y: int
    w: int
    h: int
    targets: tuple[Target, ...]


def default_dashboard_path() -> Path:
    """The chart's dashboard in this checkout (the chart is not part of the wheel)."""
    return Path(kelp.__file__).resolve().parents[1] / "helm" / "kelp" / "files" / "kelp-dashboard.json"


def load_dashboard(path: Path | None = None) -> list[Panel]:
    """Every panel with queries, rows flattened, in the order Grafana lays them out (top to bottom)."""
    path = Path(path) if path is not None else default_dashboard_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"dashboard JSON not found at {path}: pass --dashboard PATH") from None
    except ValueError as exc:
        raise UserError(f"{path} is not JSON: {exc}") from None
    found: list[Panel] = []
    row = ""

    def walk(panels: list[dict[str, Any]]) -> None:
        nonlocal row
        for p in panels:
            if p.get("type") == "row":
                row = p.get("title", "")
            elif p.get("targets"):
                grid = p.get("gridPos", {})
                unit = ((p.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "short")
                targets = tuple(Target(t["expr"], t.get("legendFormat", "")) for t in p["targets"])
                found.append(
                    Panel(p["title"], p.get("type", "timeseries"), unit, row, grid.get("x", 0),
                          grid.get("y", 0), grid.get("w", 8), grid.get("h", 8), targets)
                )  # fmt: skip
            walk(p.get("panels", []))

    walk(doc.get("panels", []))
    return sorted(found, key=lambda p: (p.y, p.x))


def key_panels(panels: list[Panel]) -> list[Panel]:
    """The :data:`KEY_PANELS`, in dashboard order; a title missing from the dashboard is an error."""
    titles = {p.title for p in panels}
    missing = [t for t in KEY_PANELS if t not in titles]
    if missing:
        raise UserError(f"the dashboard has no panel titled {', '.join(map(repr, missing))}")
    return [p for p in panels if p.title in KEY_PANELS]


def grafana_to_promql(expr: str, step_s: float, start_s: float) -> str:
    """Grafana's variables replaced the way Grafana would for a window scraped every ``step_s``.

    ``$__rate_interval`` is Grafana's ``max($__interval + scrape, 4 x scrape)``,
    which is 4 steps when the step is the scrape interval. ``time()`` is moved
    by ``start_s`` because promtool's test clock starts at the Unix epoch while
    the scraped timestamps (``*_timestamp_seconds``) are real.
    """
    ms = round(step_s * 1000)
    for variable, value in {
        "$__rate_interval": f"{4 * ms}ms",
        "$__interval": f"{ms}ms",
        "$__range": "1h",
        "$namespace": ".*",
        "$deployment": ".*",
    }.items():
        expr = expr.replace(variable, value)
    if "$" in expr:
        raise UserError(f"unknown Grafana variable in {expr!r}")
    return expr.replace("time()", f"(time() + {start_s:.3f})")


def metric_names(expr: str) -> set[str]:
    """Kelp series names an expression reads (label values skipped)."""
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's ``{{label}}`` legend format filled from a series' labels."""
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()
