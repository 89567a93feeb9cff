"""`kelp demo` runs end to end against the real services."""

from __future__ import annotations

import pytest

from kelp.demo import default_config_path, run_demo

pytestmark = pytest.mark.integration


def test_demo_trains_from_tansu_into_redis_and_dead_letters_bad_records() -> None:
    lines: list[str] = []
    report = run_demo(default_config_path(), out=lines.append, limit=1500)
    assert report.samples == 7200
    assert 0.1 < report.positive_rate < 0.4
    assert report.tables == 26
    assert report.distinct_ids > 1000
    assert 0 < report.singleton_share < 1
    assert report.services_ran
    assert report.trained_samples == 1500  # every produced sample trained exactly once
    assert report.rejected == {"bad_msgpack": 1, "bad_version": 1, "bad_dense": 1}
    # Admission (min_count=2) keeps most one-off ids out of Redis, but repeated ids got rows.
    assert 0 < report.redis_rows < report.distinct_ids
    assert report.progressive_auc == report.progressive_auc  # a number, not NaN: both classes were seen
    # The serving half: a real `kelp serve` scored with the published model, saw a pushed row, exited 0.
    assert report.serving is not None
    assert report.serving["version"] >= 1
    assert report.serving["score_after"] != report.serving["score_before"]
    assert report.serving["exit"] == 0
