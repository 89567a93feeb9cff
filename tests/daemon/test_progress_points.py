"""A run draws a curve however fast it is: points by samples as well as by time.

A replay that ends within one ``trainer.progress_every_s`` and whose size the
source cannot tell (a msgpack log, a topic read from its start) got a single
point, and ``kelp report`` drew no line.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kelp.config import FileSourceConfig, TrainerConfig
from kelp.consumers.produce import file_messages
from kelp.daemon.progress_log import PROGRESS_FILE, ProgressLog, last_point, read_progress
from kelp.daemon.progress_report import PROGRESS_GROWTH, ProgressReporter
from kelp.daemon.train import TrainDaemon, TrainReport
from kelp.trainer.evaluation import ProgressiveValidator
from kelp.trainer.metrics import TrainerMetrics

from .conftest import CRITEO, CRITEO_ROWS, base_config


def test_a_fast_replay_of_a_file_of_unknown_size_records_many_points(tmp_path: Path) -> None:
    cfg = base_config(tmp_path)
    events = tmp_path / "events.msgpack"  # a log of records: its size is unknown until read
    events.write_bytes(b"".join(message for message, _ in file_messages(CRITEO, "criteo_tsv", 1)))
    cfg.source = FileSourceConfig(path=events, format="msgpack")
    cfg.batching.batch_size = 64
    assert cfg.trainer.progress_every_s == 10.0 and cfg.trainer.progress_every_samples is None  # defaults
    report = TrainDaemon(cfg).run()
    assert report.samples == CRITEO_ROWS
    [points] = read_progress(cfg.trainer.checkpoint_dir / PROGRESS_FILE).values()
    samples = [p["samples"] for p in points]
    assert len(points) >= 20, samples
    assert samples == sorted(set(samples)) and samples[0] == 64 and samples[-1] == CRITEO_ROWS
    # Past the first batches a point waits for 5% more samples, never longer (batch by batch).
    assert all(b < a * PROGRESS_GROWTH + 64 for a, b in pairwise(samples))


def _reporter(tmp_path: Path, **settings: float) -> tuple[ProgressReporter, TrainReport, ProgressLog]:
    report, record = TrainReport(), ProgressLog(tmp_path)
    reporter = ProgressReporter(
        TrainerConfig(progress_every_s=3600, **settings),
        TrainerMetrics(CollectorRegistry()),
        report,
        validator=ProgressiveValidator(window_batches=4),
        tasks=None,
        record=record,
        expected_samples=lambda: None,
        leader=True,
    )
    return reporter, report, record


def _points(tmp_path: Path, every: int | None) -> list[int]:
    """The samples of each point recorded over 10,000 samples in batches of 100 (time never due)."""
    reporter, report, record = _reporter(tmp_path, progress_every_samples=every)
    for step in range(1, 101):
        report.samples = step * 100
        reporter.maybe_record(step)
    assert record.path is not None
    return [p["samples"] for points in read_progress(record.path).values() for p in points]


def test_a_fixed_progress_every_samples_records_a_point_per_interval(tmp_path: Path) -> None:
    assert _points(tmp_path, 1000) == list(range(1000, 10_001, 1000))


def test_unset_a_point_follows_each_growth_of_five_percent(tmp_path: Path) -> None:
    samples = _points(tmp_path, None)
    assert samples[0] == 100  # the first batch: a curve starts where training does
    for before, at in pairwise(samples):
        assert at >= before * PROGRESS_GROWTH > at - 100  # the first batch that grew the samples by 5%


def test_progress_every_samples_is_validated() -> None:
    with pytest.raises(ValueError, match="progress_every_samples"):
        TrainerConfig(progress_every_samples=0)


def test_the_last_point_is_read_from_the_tail_past_a_line_cut_by_a_crash(tmp_path: Path) -> None:
    record = ProgressLog(tmp_path)
    for step in range(1, 2001):  # a record longer than the tail that is read
        record.write(step=step, samples=step * 256, auc=0.5 + step / 10_000)
    with open(tmp_path / PROGRESS_FILE, "a", encoding="utf-8") as fh:
        fh.write('{"run": "x", "samp')  # what a kill -9 mid-write leaves
    point = last_point(tmp_path / PROGRESS_FILE)
    assert point is not None and point["step"] == 2000 and point["auc"] == 0.7
    assert last_point(tmp_path / "missing.jsonl") is None and last_point(None) is None
