"""The dashboard's panels over recorded scrapes: each query evaluated, each result a labelled line.

This is the part of ``kelp dashboard preview`` that needs no running
deployment: scrapes in (recorded live, or loaded from a file), panels with
data out, then a PNG (:mod:`kelp.plots.dashboard_figure`). The queries are
the dashboard's own, with Grafana's variables filled in the way Grafana
would for this window (:func:`~kelp.plots.dashboard.grafana_to_promql`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kelp.plots.dashboard import (
    OVERVIEW_ROW,
    Panel,
    grafana_to_promql,
    key_panels,
    legend,
    load_dashboard,
)
from kelp.plots.promql_eval import Grid, Series, evaluate
from kelp.plots.scrape import Scrape

__all__ = ["Line", "PanelData", "Preview", "evaluate_panels", "preview"]


@dataclass
class Line:
    """One series of one target, named by the target's legend format."""

    label: str
    target: int
    times: list[float]
    values: list[float]

    def last(self) -> float:
        """The last finite value (Grafana's ``lastNotNull``), NaN when there is none."""
        return next((v for v in reversed(self.values) if math.isfinite(v)), math.nan)


@dataclass
class PanelData:
    """A panel and what its queries returned; ``empty_targets`` are the queries that returned nothing."""

    panel: Panel
    lines: list[Line] = field(default_factory=list)
    empty_targets: list[str] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return any(math.isfinite(v) for line in self.lines for v in line.values)


@dataclass
class Preview:
    """The evaluated overview stats and key panels of one window."""

    grid: Grid
    stats: list[PanelData]
    panels: list[PanelData]


def _lines(panel: Panel, results: dict[str, list[Series]], grid: Grid) -> PanelData:
    data = PanelData(panel)
    for i, target in enumerate(panel.targets):
        got = results[grafana_to_promql(target.expr, grid.step_s, grid.start_s)]
        if not any(s.finite() for s in got):
            data.empty_targets.append(target.legend or target.expr)
        for series in sorted(got, key=lambda s: sorted(s.labels.items())):
            data.lines.append(Line(legend(target.legend, series.labels), i, series.times, series.values))
    return data


def evaluate_panels(
    panels: Sequence[Panel], scrapes: Sequence[Scrape], step_s: float, promtool: str | None = None
) -> tuple[Grid, list[PanelData]]:
    """Every target of ``panels`` evaluated at each step of the scraped window, in one promtool run."""
    grid = Grid.of(scrapes, step_s)
    exprs = [grafana_to_promql(t.expr, step_s, grid.start_s) for p in panels for t in p.targets]
    results = evaluate(exprs, scrapes, grid, promtool)
    return grid, [_lines(p, results, grid) for p in panels]


def preview(
    scrapes: Sequence[Scrape], step_s: float, dashboard: Path | None = None, promtool: str | None = None
) -> Preview:
    """The overview row's stats and the key panels of the dashboard, evaluated over ``scrapes``."""
    panels = load_dashboard(dashboard)
    stats = [p for p in panels if p.row == OVERVIEW_ROW and p.kind == "stat"]
    keys = key_panels(panels)
    grid, data = evaluate_panels([*stats, *keys], scrapes, step_s, promtool)
    return Preview(grid, data[: len(stats)], data[len(stats) :])
