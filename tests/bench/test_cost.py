"""The per-sample cost arithmetic of ``kelp bench train`` and ``kelp bench pipeline``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.bench.cost import CostSnapshot, cost_per_sample, first_sightings, steady_start
from kelp.harness import RedisServer


def _batch(**tables: list[int]) -> Any:
    return SimpleNamespace(
        tables={name: SimpleNamespace(unique_ids=np.array(ids, np.uint64)) for name, ids in tables.items()}
    )


def test_first_sightings_count_ids_no_earlier_batch_held_per_table() -> None:
    batches = [_batch(a=[1, 2], b=[1]), _batch(a=[2, 3], b=[1, 2]), _batch(b=[5]), _batch(a=[1, 2, 3])]
    assert first_sightings(batches).tolist() == [3, 2, 1, 0]  # an id in two tables is two rows


def _snapshot(
    step: int, samples: int, row_ops: dict[str, float] | None = None, **values: float
) -> CostSnapshot:
    base = {
        "process_cpu_s": 0.0,
        "model_s": 0.0,
        "checkpoint_s": 0.0,
        "redis_cpu_s": 0.0,
        "hot_hits": 0.0,
        "stored_reads": 0.0,
        "hot_rows": 0.0,
        "hot_bytes": 0.0,
    }
    base.update(values)
    return CostSnapshot(step=step, samples=samples, row_ops=row_ops or {}, **base)


def test_the_window_is_divided_by_its_samples() -> None:
    start = _snapshot(
        1, 100, process_cpu_s=1.0, model_s=0.5, redis_cpu_s=2.0, row_ops={"read": 50}, hot_hits=10
    )
    end = _snapshot(
        3,
        1100,
        process_cpu_s=1.6,
        model_s=0.7,
        checkpoint_s=0.1,
        redis_cpu_s=2.004,
        row_ops={"read": 1050, "count": 300, "write": 700},
        hot_hits=70,
        stored_reads=20,
        hot_rows=64,
        hot_bytes=4096,
    )
    batches = [_batch(a=[1]), _batch(a=[1, 2, 3]), _batch(a=[3, 4])]  # steps 2..3 see 2 + 1 new ids
    got = cost_per_sample(start, end, batches)
    assert got["steady_steps"] == 2 and got["steady_samples"] == 1000
    assert got["trainer_cpu_us_per_sample"] == pytest.approx(300.0)  # (0.6 - 0.2 - 0.1) s / 1000
    assert got["trainer_model_us_per_sample"] == pytest.approx(200.0)
    assert got["redis_cpu_us_per_sample"] == pytest.approx(4.0)
    assert got["redis_row_ops_per_sample"] == pytest.approx(2.0)
    assert (got["redis_row_reads_per_sample"], got["redis_row_writes_per_sample"]) == (1.0, 0.7)
    assert got["redis_row_counts_per_sample"] == pytest.approx(0.3)
    assert got["cold_row_ops_per_sample"] == pytest.approx(0.006)  # 3 ids read and written once
    assert got["hot_tier_hit_rate"] == pytest.approx(60 / 80)
    assert (got["hot_tier_rows"], got["hot_tier_bytes"]) == (64, 4096)


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        cost_per_sample(_snapshot(2, 10), _snapshot(2, 10), [])


def test_without_a_tier_there_is_no_hit_rate() -> None:
    got = cost_per_sample(_snapshot(0, 0), _snapshot(1, 10, stored_reads=5), [_batch(a=[1])])
    assert "hot_tier_hit_rate" not in got


def test_the_steady_window_opens_a_quarter_into_the_run() -> None:
    assert [steady_start(n) for n in (1, 8, 20, 120)] == [2, 2, 5, 30]


@pytest.mark.integration
def test_a_snapshot_reads_redis_cpu_from_a_real_server() -> None:
    with RedisServer() as server:
        snap = CostSnapshot.take(CollectorRegistry(), [server.url], step=0, samples=0)
    assert snap.redis_cpu_s > 0.0 and snap.process_cpu_s > 0.0


def test_the_flush_floor_counts_first_sightings_and_each_periods_distinct_ids() -> None:
    batches = [
        _batch(a=[1, 2]),  # window opens after this one
        _batch(a=[1, 3]),  # period 1: a{1,3}
        _batch(a=[1, 3, 4], b=[1]),  # period 1: a{1,3,4} b{1} -> 4 distinct over both steps
        _batch(a=[1]),  # period 2: a{1}
    ]
    start = _snapshot(1, 100, wall_s=10.0)
    end = _snapshot(4, 400, wall_s=13.0)  # one step a second
    out = cost_per_sample(start, end, batches, writeback=(2, 60.0))
    assert out["flush_period_steps"] == 2
    # a3, a4 and b1 were never seen before
    assert out["flush_floor_reads_per_sample"] == pytest.approx(3 / 300, abs=5e-4)
    assert out["flush_floor_writes_per_sample"] == pytest.approx((4 + 1) / 300, abs=5e-4)
    assert out["flush_floor_row_ops_per_sample"] == pytest.approx(8 / 300, abs=5e-4)
    # A 1 s interval at one step a second makes the period one step: each step's ids once.
    timed = cost_per_sample(start, end, batches, writeback=(20, 1.0))
    assert timed["flush_period_steps"] == 1
    assert timed["flush_floor_writes_per_sample"] == pytest.approx((2 + 4 + 1) / 300, abs=5e-4)
    assert "flush_floor_row_ops_per_sample" not in cost_per_sample(start, end, batches)
