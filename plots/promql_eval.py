"""PromQL over recorded scrapes, evaluated by promtool with no Prometheus server.

``promtool test rules`` loads ``input_series`` into an in-memory TSDB and
evaluates each ``promql_expr_test`` at its ``eval_time`` with Prometheus's own
engine. Each query is asked at every step of the window, expecting nothing;
promtool then reports what it got for every query that returned something,
which :func:`parse_failures` reads back. A query it reports nothing for
returned an empty vector at that step.

The window is laid on a grid of ``step_s``: a scrape lands on the nearest
step (a Prometheus server keeps the real timestamp; at a 1 s scrape
interval the difference is below the scrape jitter), a step without a scrape
of a series is ``_`` (missing) and instant queries look back 5 minutes as a
server's would.

The test file carries one line per series::

    input_series:
      - series: 'kelp_trainer_samples_total{instance="trainer",job="kelp-trainer",rank="0"}'
        values: '0 256 _ 768 ...'
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kelp.errors import KelpError, MissingBinaryError
from kelp.plots.scrape import Scrape, samples

__all__ = ["Grid", "Series", "evaluate", "find_promtool", "parse_failures", "series_file"]

_EXPR_LINE = re.compile(r'^\s*expr: (".*"), time: (\S+),\s*$')
_GOT_LINE = re.compile(r"^\s*got: (.*)$")
_ERR_LINE = re.compile(r'^\s*expr: (".*"), time: \S+, err: (.*)$')
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@dataclass(frozen=True)
class Grid:
    """The evaluation window: step ``i`` is Unix time ``start_s + i * step_s``."""

    start_s: float
    step_s: float
    steps: int

    @classmethod
    def of(cls, scrapes: Sequence[Scrape], step_s: float) -> Grid:
        if not scrapes:
            raise KelpError("no scrapes to evaluate: no target answered")
        start = min(s.at for s in scrapes)
        last = max(s.at for s in scrapes)
        return cls(start, step_s, round((last - start) / step_s) + 1)

    def index(self, at: float) -> int:
        return round((at - self.start_s) / self.step_s)

    def time(self, index: int) -> float:
        return self.start_s + index * self.step_s


@dataclass
class Series:
    """One result series of a query over the window; ``values[i]`` is at ``times[i]`` (Unix s)."""

    labels: dict[str, str]
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def finite(self) -> bool:
        return any(math.isfinite(v) for v in self.values)


def find_promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise MissingBinaryError(
            "promtool not found on PATH: install Debian's `prometheus` package "
            "(`bash scripts/install-system-deps.sh` does)"
        )
    return found


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(v)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def series_file(scrapes: Iterable[Scrape], grid: Grid, names: set[str]) -> list[dict[str, str]]:
    """``input_series`` entries for every series of ``names`` in the scrapes, on the grid."""
    points: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = defaultdict(dict)
    for scrape in scrapes:
        i = grid.index(scrape.at)
        for s in samples(scrape):
            if s.name in names:
                points[(s.name, s.labels)][i] = s.value
    entries = []
    for (name, labels), by_step in sorted(points.items()):
        selector = name + "{" + ",".join(f"{k}={_quote(v)}" for k, v in labels) + "}"
        values = " ".join(_value(by_step[i]) if i in by_step else "_" for i in range(grid.steps))
        entries.append({"series": selector, "values": values})
    return entries


def _seconds(duration: str) -> float:
    """A Go duration as promtool prints it (``1m5s``, ``1.5s``, ``500ms``, ``0s``) in seconds."""
    return sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(duration))


def _parse_vector(text: str) -> list[tuple[dict[str, str], float]]:
    """``{a="x", b="y"} 1E+01, {} NaN`` (Prometheus's label set and Go's %E float) -> pairs."""
    out: list[tuple[dict[str, str], float]] = []
    pos = 0
    text = text.strip()
    if text in ("", "nil"):
        return out
    while pos < len(text):
        if text[pos] != "{":
            raise ValueError(f"expected '{{' at {pos} in {text!r}")
        pos += 1
        labels: dict[str, str] = {}
        while text[pos] != "}":
            eq = text.index("=", pos)
            name = text[pos:eq].strip().lstrip(",").strip()
            end = eq + 2  # past the opening quote
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            labels[name] = json.loads(text[eq + 1 : end + 1])
            pos = end + 1
            while text[pos] in ", ":
                pos += 1
        pos += 2  # past "} "
        comma = text.find(", {", pos)
        number = text[pos:] if comma < 0 else text[pos:comma]
        out.append((labels, float(number)))
        pos = len(text) if comma < 0 else comma + 2
    return out


def parse_failures(output: str) -> dict[tuple[str, int], list[tuple[dict[str, str], float]]]:
    """promtool's report of non-empty results: ``(expr, eval time in ms) -> [(labels, value)]``."""
    found: dict[tuple[str, int], list[tuple[dict[str, str], float]]] = {}
    current: tuple[str, int] | None = None
    for line in output.splitlines():
        if m := _EXPR_LINE.match(line):
            current = (json.loads(m.group(1)), round(_seconds(m.group(2)) * 1000))
        elif (m := _GOT_LINE.match(line)) and current is not None:
            found[current] = _parse_vector(m.group(1))
            current = None
    return found


def evaluate(
    exprs: Sequence[str], scrapes: Sequence[Scrape], grid: Grid, promtool: str | None = None
) -> dict[str, list[Series]]:
    """Every expression at every step of ``grid``: ``expr -> series`` (empty list: no data).

    ``exprs`` must already be plain PromQL (see
    :func:`kelp.plots.dashboard.grafana_to_promql`). A query promtool cannot
    parse raises :class:`KelpError` with promtool's message.
    """
    from kelp.plots.dashboard import metric_names

    promtool = promtool or find_promtool()
    names = set().union(*(metric_names(e) for e in exprs)) if exprs else set()
    ms = round(grid.step_s * 1000)
    unique = list(dict.fromkeys(exprs))
    doc = {
        "rule_files": [],
        "evaluation_interval": f"{ms}ms",
        "tests": [
            {
                "interval": f"{ms}ms",
                "input_series": series_file(scrapes, grid, names),
                "promql_expr_test": [
                    {"expr": e, "eval_time": f"{i * ms}ms", "exp_samples": []}
                    for e in unique
                    for i in range(grid.steps)
                ],
            }
        ],
    }
    with tempfile.TemporaryDirectory(prefix="kelp-promql-") as tmp:
        path = Path(tmp) / "preview.test.yaml"
        path.write_text(yaml.safe_dump(doc, width=1 << 20, sort_keys=False), encoding="utf-8")
        proc = subprocess.run(
            [promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False, timeout=300
        )
    output = proc.stdout + proc.stderr
    errors = {json.loads(m.group(1)): m.group(2) for m in map(_ERR_LINE.match, output.splitlines()) if m}
    if errors:
        expr, message = next(iter(errors.items()))
        raise KelpError(f"promtool could not evaluate {expr!r}: {message}")
    got = parse_failures(output)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not got):
        raise KelpError(f"promtool could not evaluate the queries:\n{output.strip()[-2000:]}")
    result: dict[str, list[Series]] = {}
    for expr in unique:
        by_labels: dict[tuple[tuple[str, str], ...], Series] = {}
        for i in range(grid.steps):
            for labels, value in got.get((expr, i * ms), ()):
                key = tuple(sorted(labels.items()))
                series = by_labels.setdefault(key, Series(dict(labels)))
                series.times.append(grid.time(i))
                series.values.append(value)
        result[expr] = list(by_labels.values())
    return result
