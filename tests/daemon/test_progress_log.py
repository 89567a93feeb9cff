"""The run's own learning record: what ``kelp report`` reads must survive crashes and bad volumes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kelp.daemon.progress_log import PROGRESS_FILE, ProgressLog, read_progress


def test_points_are_json_lines_named_by_run_and_non_finite_values_become_null(tmp_path: Path) -> None:
    record = ProgressLog(tmp_path / "ckpt")
    record.write(step=1, samples=256, auc=float("nan"), log_loss=0.69)
    record.write(step=2, samples=512, auc=0.61, log_loss=0.66)
    lines = [json.loads(x) for x in (tmp_path / "ckpt" / PROGRESS_FILE).read_text().splitlines()]
    assert [p["samples"] for p in lines] == [256, 512]
    assert lines[0]["auc"] is None and lines[1]["auc"] == 0.61
    assert {p["run"] for p in lines} == {record.run} and record.points == 2


def test_a_resumed_trainer_starts_a_new_run_and_a_cut_line_is_skipped(tmp_path: Path) -> None:
    first, second = ProgressLog(tmp_path), ProgressLog(tmp_path)
    second.run = first.run + "-again"  # two processes in the same second would differ by pid
    first.write(step=1, samples=100)
    with open(tmp_path / PROGRESS_FILE, "a", encoding="utf-8") as fh:
        fh.write('{"run": "x", "samp')  # what a kill -9 mid-write leaves
        fh.write("\n")
    second.write(step=1, samples=50)
    runs = read_progress(tmp_path / PROGRESS_FILE)
    assert list(runs) == [first.run, second.run]
    assert [p["samples"] for p in runs[second.run]] == [50]


def test_an_unwritable_record_is_logged_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    record = ProgressLog(blocker)  # its "directory" is a file: every write fails
    with caplog.at_level(logging.WARNING, logger="kelp.train"):
        record.write(step=1, samples=1)
        record.write(step=2, samples=2)
    assert record.points == 0 and record.path is None
    assert sum("progress record" in r.getMessage() for r in caplog.records) == 1


def test_no_directory_records_nothing() -> None:
    record = ProgressLog(None)
    record.write(step=1, samples=1)
    assert record.points == 0
