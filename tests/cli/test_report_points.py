"""``kelp report`` on a run of one point says why its curve is empty instead of drawing nothing silently."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kelp.cli.commands.report_cmd import _report
from kelp.daemon.progress_log import ProgressLog


def _draw(record: Path, capsys: pytest.CaptureFixture[str]) -> str:
    args = argparse.Namespace(run=record, config=None, out=record / "report.png", all_runs=False)
    assert _report(args) == 0 and (record / "report.png").stat().st_size > 0
    return capsys.readouterr().err


def test_a_one_point_run_says_why_it_is_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = ProgressLog(tmp_path / "one")
    one.write(step=8, samples=2000, auc_window=0.7, auc=0.7, log_loss_window=0.5, log_loss=0.5)
    assert f"run {one.run} has a single point" in _draw(tmp_path / "one", capsys)
    two = ProgressLog(tmp_path / "two")
    for step in (1, 2):
        two.write(step=step, samples=256 * step, auc_window=0.7, auc=0.7, log_loss_window=0.5, log_loss=0.5)
    assert _draw(tmp_path / "two", capsys) == ""
