"""Draws an evaluated dashboard as Grafana lays it out: a strip of stats, then rows of time series.

Grafana's dark theme, its 24-column grid (each key panel keeps its width),
the row headings of the dashboard, panel titles, legends from the targets'
legend formats and the y axis in the panel's unit
(``fieldConfig.defaults.unit``: ``s``, ``percentunit``, ``reqps``, ``Bps``,
``short``, ``none``). A panel whose queries returned nothing says "No data",
as Grafana does.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kelp.plots.dashboard_preview import Line, PanelData, Preview
from kelp.plots.figures import _pyplot, _save

__all__ = ["draw_dashboard", "format_value"]

_BG, _PANEL, _TEXT, _GRID, _DIM = "#111217", "#181b1f", "#ccccdc", "#2c3235", "#8e8e9a"
_PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0",
            "#37872d", "#fade2a"]  # fmt: skip
_MAX_LEGEND = 8
_COLUMNS = 24


def _si(v: float, units: tuple[str, ...], base: float = 1000.0) -> str:
    for unit in units[:-1]:
        if abs(v) < base:
            return f"{v:.3g}{unit}"
        v /= base
    return f"{v:.3g}{units[-1]}"


def format_value(v: float, unit: str) -> str:
    """A value as Grafana shows it for ``unit`` (the subset of units Kelp's dashboard uses)."""
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else str(v)
    if unit == "s":
        if v == 0:
            return "0 s"
        if abs(v) < 1e-3:
            return f"{v * 1e6:.3g} µs"
        if abs(v) < 1:
            return f"{v * 1e3:.3g} ms"
        return f"{v:.3g} s"
    if unit == "percentunit":
        return f"{v * 100:.3g}%"
    if unit == "reqps":
        return _si(v, ("", "K", "M")) + " req/s"
    if unit == "Bps":
        return _si(v, (" B/s", " kB/s", " MB/s", " GB/s"))
    if unit == "none":
        return f"{v:g}"
    return _si(v, ("", "K", "M", "B"))


def _style(ax: Any) -> None:
    ax.set_facecolor(_PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(colors=_DIM, labelsize=7, length=0)
    ax.grid(True, color=_GRID, linewidth=0.6)


def _draw_stat(ax: Any, data: PanelData) -> None:
    _style(ax)
    ax.grid(False)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(data.panel.title, color=_TEXT, fontsize=9, loc="left")
    value = data.lines[0].last() if data.lines else math.nan
    text = format_value(value, data.panel.unit) if math.isfinite(value) else "No data"
    colour = _PALETTE[0] if math.isfinite(value) else _DIM
    ax.text(0.5, 0.42, text, color=colour, fontsize=20, ha="center", va="center", transform=ax.transAxes)


def _peak(line: Line) -> float:
    return max((v for v in line.values if math.isfinite(v)), default=-math.inf)


def _draw_series(ax: Any, data: PanelData, window: tuple[float, float], mdates: Any, ticker: Any) -> None:
    _style(ax)
    ax.set_title(data.panel.title, color=_TEXT, fontsize=9, loc="left")
    if not data.has_data:
        ax.text(
            0.5, 0.5, "No data", color=_DIM, fontsize=12, ha="center", va="center", transform=ax.transAxes
        )
        ax.set_xticks([])
        ax.set_yticks([])
        return
    # With more series than the legend holds, the legend names the highest ones (what a person looks
    # for on a latency or lag panel) in distinct colours; the rest are drawn faint and unnamed.
    ranked = sorted(data.lines, key=_peak, reverse=True) if len(data.lines) > _MAX_LEGEND else data.lines
    for i, line in enumerate(ranked):
        times = [datetime.fromtimestamp(t, tz=UTC) for t in line.times]
        named = i < _MAX_LEGEND
        style = {"linewidth": 1.2, "label": line.label} if named else {"linewidth": 0.7, "alpha": 0.4}
        ax.plot(times, line.values, color=_PALETTE[i % len(_PALETTE)], **style)
    ax.set_xlim(*(datetime.fromtimestamp(t, tz=UTC) for t in window))  # one time range, as in Grafana
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    ax.xaxis.set_major_locator(ticker.MaxNLocator(5))
    unit = data.panel.unit
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: format_value(v, unit)))
    ax.yaxis.set_major_locator(ticker.MaxNLocator(5))
    if unit != "percentunit":
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.legend(loc="upper left", fontsize=6, labelcolor=_TEXT, ncol=2, facecolor=_PANEL, edgecolor=_PANEL,
              framealpha=0.85)  # fmt: skip
    extra = len(data.lines) - _MAX_LEGEND
    if extra > 0:
        note = f"{len(data.lines)} series; the {_MAX_LEGEND} highest named"
        ax.text(1.0, 1.02, note, color=_DIM, fontsize=7, ha="right", va="bottom", transform=ax.transAxes)


def _place(panels: list[PanelData]) -> list[list[PanelData]]:
    """Panels flowed into grid lines of 24 columns, a new line at each dashboard row."""
    lines: list[list[PanelData]] = []
    width, row = _COLUMNS, None
    for data in panels:
        if data.panel.row != row or width + data.panel.w > _COLUMNS:
            lines.append([])
            width = 0
        lines[-1].append(data)
        width += data.panel.w
        row = data.panel.row
    return lines


def draw_dashboard(result: Preview, path: Path, title: str, subtitle: str) -> Path:
    """The PNG of ``result`` at ``path``: stats strip, then the key panels under their row headings."""
    plt = _pyplot()
    import matplotlib.dates as mdates
    from matplotlib import ticker

    lines = _place(result.panels)
    window = (result.grid.start_s, result.grid.time(result.grid.steps - 1))
    headed = {
        id(line[0])
        for i, line in enumerate(lines)
        if i == 0 or line[0].panel.row != lines[i - 1][0].panel.row
    }
    # Height units: title 1, stats 3, each heading 1, each line of panels 6.
    heights = [1.2, 3.0] + [h for line in lines for h in ((1.0, 6.0) if id(line[0]) in headed else (6.0,))]
    fig = plt.figure(figsize=(18, 0.36 * sum(heights)), facecolor=_BG)
    grid = fig.add_gridspec(len(heights), _COLUMNS, height_ratios=heights, hspace=0.55, wspace=1.6,
                            left=0.03, right=0.99, top=0.995, bottom=0.01)  # fmt: skip
    head = fig.add_subplot(grid[0, :])
    head.axis("off")
    head.text(0, 0.75, title, color=_TEXT, fontsize=15, va="center", transform=head.transAxes)
    head.text(0, 0.15, subtitle, color=_DIM, fontsize=9, va="center", transform=head.transAxes)
    x = 0
    for stat in result.stats:
        _draw_stat(fig.add_subplot(grid[1, x : x + stat.panel.w]), stat)
        x += stat.panel.w
    r = 2
    for line in lines:
        if id(line[0]) in headed:
            heading = fig.add_subplot(grid[r, :])
            heading.axis("off")
            heading.text(0, 0.2, line[0].panel.row, color=_TEXT, fontsize=12, weight="bold",
                         transform=heading.transAxes)  # fmt: skip
            r += 1
        x = 0
        for data in line:
            _draw_series(fig.add_subplot(grid[r, x : x + data.panel.w]), data, window, mdates, ticker)
            x += data.panel.w
        r += 1
    return _save(fig, path)
