"""``kelp bench snapshot`` runs its real pieces on a tiny store and reports every key it promises."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kelp.bench.snapshot import measure, window_rate
from kelp.harness import RedisServer

pytestmark = pytest.mark.integration

KEYS = (
    "full_rows_per_s",
    "full_bytes_per_row",
    "incremental_rows_per_s",
    "incremental_bytes_per_row",
    "incremental_seconds",
    "incremental_share_of_full_seconds",
    "restore_rows_per_s",
    "bgsave_rows_per_s",
    "rdb_bytes_per_row",
    "redis_cli_rdb_rows_per_s",
    "full_vs_bgsave",
    "full_vs_redis_cli_rdb",
    "load_rows_per_s_alone",
    "load_rows_per_s_during_snapshot",
    "load_rows_per_s_during_snapshot_separate_process",
)


def test_a_step_straddling_a_window_counts_by_its_share_inside() -> None:
    steps = [(0.0, 1.0, 100), (1.0, 3.0, 400), (3.0, 4.0, 100)]
    assert window_rate(steps, 2.0, 4.0) == pytest.approx((200 + 100) / 2.0)
    assert window_rate(steps, 0.0, 4.0) == pytest.approx(600 / 4.0)


def test_the_suite_reports_every_key_on_a_tiny_store(tmp_path: Path) -> None:
    with RedisServer() as server:
        out = measure(server, tmp_path, 2_600, reps=1, min_window_s=0.2, say=lambda _m: None)

    assert (out["rows"], out["tables"], out["dim"], out["layout"]) == (2_600, 26, 16, "buckets")
    for key in KEYS:
        assert math.isfinite(out[key]) and out[key] > 0, key
    # the incremental holds exactly the rows pushed after the full snapshot (the rest were stored long before)
    assert out["incremental_rows"] == out["incremental_rows_updated"] == 26 * 5
    for key in ("throughput_lost_share", "throughput_lost_share_separate_process", "train_slowdown"):
        assert math.isfinite(out[key]) and out[key] < 1, key
    assert out["train_slowdown"] == out["throughput_lost_share"]
