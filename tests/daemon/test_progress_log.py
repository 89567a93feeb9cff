"""The run's own learning record: what ``kelp report`` reads must survive crashes and bad volumes."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from kelp.config import FeatureSpec, FileSourceConfig
from kelp.daemon.progress_log import PROGRESS_FILE, ProgressLog, point_tasks, read_progress, task_fields
from kelp.daemon.train import TrainDaemon
from kelp.trainer.evaluation import AucResult


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


def test_task_fields_and_point_tasks_round_trip_and_a_one_task_point_has_none() -> None:
    results = {
        "click": (AucResult(0.7, 0.01, 0.5, 100, 30), AucResult(0.72, 0.02, 0.48, 50, 15)),
        "buy": (AucResult(float("nan"), 0.0, 0.1, 100, 0), AucResult(float("nan"), 0.0, 0.1, 50, 0)),
    }
    fields = task_fields(results)
    assert fields["click"] == {"auc_window": 0.72, "auc": 0.7, "log_loss_window": 0.48, "log_loss": 0.5}
    back = point_tasks(json.loads(json.dumps({"tasks": {"buy": {**fields["buy"], "auc": None}}})))
    assert math.isnan(back["buy"]["auc"]) and back["buy"]["log_loss"] == 0.1
    assert point_tasks({"auc": 0.7, "samples": 1}) == {}


def test_a_two_label_run_records_each_task_and_its_last_point_matches_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import base_config
    from .test_multitask_train import MODELS, ROWS, write_events

    monkeypatch.syspath_prepend(str(MODELS))
    cfg = base_config(tmp_path, model="two_heads:TwoHeads", model_args={})
    cfg.features = FeatureSpec(
        labels=[{"name": "click"}, {"name": "buy"}],
        dense=[{"name": "d0"}, {"name": "d1"}],
        sparse=[{"name": "user"}],
    )
    cfg.source = FileSourceConfig(
        path=write_events(tmp_path / "events.jsonl"),
        format="json",
        json={
            "label_field": "click",
            "labels": {"buy": "buy"},
            "dense_fields": ["d0", "d1"],
            "sparse_fields": ["user"],
        },
    )
    report = TrainDaemon(cfg).run()
    assert report.summary is not None and report.summary.progress_log is not None
    [points] = read_progress(Path(report.summary.progress_log)).values()
    assert all(list(p["tasks"]) == ["click", "buy"] for p in points)
    last = points[-1]
    assert last["samples"] == ROWS
    for task, m in report.summary.tasks.items():
        assert last["tasks"][task]["auc"] == pytest.approx(m["auc"])
        assert last["tasks"][task]["log_loss"] == pytest.approx(m["log_loss"])
    assert last["auc"] == last["tasks"]["click"]["auc"]  # the top level stays the first task's
