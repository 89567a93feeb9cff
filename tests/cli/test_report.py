"""``kelp report``: one curve per task for a run with several labels; a one-task record draws as before.

The curves are checked as data (what is drawn), the PNG only for being one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from kelp.cli.commands.report_cmd import run_curves
from kelp.daemon.progress_log import PROGRESS_FILE, ProgressLog, read_progress

PNG = b"\x89PNG\r\n\x1a\n"

# A record written before points had ``tasks``, byte for byte what such a trainer wrote.
OLD_RECORD = (
    '{"auc": null, "auc_window": null, "fraction": 0.5, "log_loss": 0.69, "log_loss_window": 0.69, '
    '"run": "20261101T000000Z-1", "samples": 256, "samples_per_s": 1000.0, "step": 1, "t": 1761955200.0}\n'
    '{"auc": 0.61, "auc_window": 0.63, "fraction": 1.0, "log_loss": 0.66, "log_loss_window": 0.64, '
    '"run": "20261101T000000Z-1", "samples": 512, "samples_per_s": 1000.0, "step": 2, "t": 1761955201.0}\n'
)


def _task(auc: float, loss: float) -> dict[str, float]:
    return {"auc_window": auc + 0.01, "auc": auc, "log_loss_window": loss - 0.01, "log_loss": loss}


def _two_task_record(directory: Path) -> ProgressLog:
    """Three points of a click + buy run; buy has one class at first (AUC NaN, written as null)."""
    record = ProgressLog(directory)
    for step, (click, buy) in enumerate(
        [(0.60, math.nan), (0.65, 0.70), (0.70, 0.75)],
        start=1,
    ):
        record.write(
            step=step,
            samples=256 * step,
            auc_window=click + 0.01,
            auc=click,
            log_loss_window=0.59,
            log_loss=0.6,
            tasks={"click": _task(click, 0.6), "buy": _task(buy, 0.3)},
        )
    return record


def _draw(record: Path, png: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", "report", str(record), "--out", str(png), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _same(got: list[float], want: list[Any]) -> bool:
    """Equal series, where NaN (or a null in the record) matches only NaN."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        missing = w is None or math.isnan(w)
        if math.isnan(g) != missing or (not missing and not math.isclose(g, w)):
            return False
    return True


def test_a_two_task_record_reads_back_one_series_per_task(tmp_path: Path) -> None:
    record = _two_task_record(tmp_path)
    line = json.loads((tmp_path / PROGRESS_FILE).read_text().splitlines()[0])
    assert line["tasks"]["buy"]["auc"] is None  # NaN is null inside tasks too
    [(name, points)] = read_progress(tmp_path / PROGRESS_FILE).items()
    assert name == record.run
    click, buy = run_curves(name, points)
    assert (click.label, buy.label) == (f"run {name}: click", f"run {name}: buy")
    assert click.samples == buy.samples == [256, 512, 768]
    assert _same(click.auc_cumulative, [0.60, 0.65, 0.70])
    assert _same(click.auc_window, [0.61, 0.66, 0.71])
    assert _same(buy.auc_cumulative, [math.nan, 0.70, 0.75])
    assert _same(buy.log_loss_cumulative, [0.3, 0.3, 0.3])
    assert _same(buy.log_loss_window, [0.29, 0.29, 0.29])


def test_a_task_missing_from_a_point_is_nan_there() -> None:
    points = [
        {"run": "r", "samples": 100, "step": 1, "tasks": {"click": _task(0.6, 0.5)}},
        {"run": "r", "samples": 200, "step": 2, "tasks": {"click": _task(0.7, 0.4), "buy": _task(0.8, 0.2)}},
    ]
    click, buy = run_curves("r", points)
    assert _same(click.auc_cumulative, [0.6, 0.7])
    assert _same(buy.auc_cumulative, [math.nan, 0.8]) and buy.samples == [100, 200]


def test_an_old_one_task_record_is_one_curve_from_its_top_level_metrics(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    path.write_text(OLD_RECORD)
    [(name, points)] = read_progress(path).items()
    [curve] = run_curves(name, points)
    assert curve.label == "run 20261101T000000Z-1"
    assert curve.samples == [256, 512]
    assert _same(curve.auc_cumulative, [None, 0.61]) and _same(curve.auc_window, [None, 0.63])
    assert _same(curve.log_loss_cumulative, [0.69, 0.66]) and _same(curve.log_loss_window, [0.69, 0.64])


def test_report_draws_a_two_task_run_and_an_old_record(tmp_path: Path) -> None:
    _two_task_record(tmp_path / "two")
    png = tmp_path / "two.png"
    done = _draw(tmp_path / "two", png)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {png} (3 points, 2 curves)" in done.stdout
    assert png.read_bytes()[:8] == PNG

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / PROGRESS_FILE).write_text(OLD_RECORD)
    png = tmp_path / "old.png"
    done = _draw(tmp_path / "old" / PROGRESS_FILE, png)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {png} (2 points, 1 curve)" in done.stdout
    assert png.read_bytes()[:8] == PNG
