"""Hot-row cache: hit rate, write-back cadence, no lost updates, staleness bound."""

from __future__ import annotations

import numpy as np
import pytest

from kelp.config import HotCacheConfig, StoreConfig, TableSpec
from kelp.store import HotRowCache, MemoryStore, build_store
from kelp.store.checks import ALL_CHECKS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _cache(capacity: int = 100, every: int = 3, interval: float = 1e9, staleness: float = 1e9):  # type: ignore[no-untyped-def]
    inner = MemoryStore([TableSpec(name="t", dim=2), TableSpec(name="u", dim=3)])
    clock = Clock()
    cfg = HotCacheConfig(
        enabled=True,
        capacity_rows=capacity,
        writeback_every_steps=every,
        writeback_interval_s=interval,
        max_staleness_s=staleness,
    )
    return inner, HotRowCache(inner, cfg, device="cpu", clock=clock), clock


def _rows(n: int, dim: int, value: float) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, dim), value, np.float32), np.full(n, value, np.float32)


def test_hits_and_writeback_every_n_steps() -> None:
    inner, cache, _ = _cache(every=3)
    ids = np.arange(10, dtype=np.uint64)
    cache.pull("t", ids)
    inner.push("t", ids, *_rows(10, 2, 0.5))  # stored, but the cache already holds the init rows
    for step in (1, 2):
        got = cache.pull("t", ids)
        cache.push("t", ids, got.rows + 1, got.state + 1)
        assert cache.dirty_rows() == 10, step
    assert (inner.pull("t", ids, count=False).rows == 0.5).all()
    got = cache.pull("t", ids)
    cache.push("t", ids, got.rows + 1, got.state + 1)  # third push: write-back
    assert cache.dirty_rows() == 0
    np.testing.assert_allclose(inner.pull("t", ids, count=False).rows, got.rows + 1)
    assert cache.hit_rate == pytest.approx(30 / 40)
    assert cache.metrics.hot_hit_rate._value.get() == pytest.approx(0.75)


def test_eviction_writes_dirty_rows_back_first() -> None:
    inner, cache, _ = _cache(capacity=20, every=1000)  # 10 rows per table
    first = np.arange(10, dtype=np.uint64)
    cache.pull("t", first)
    cache.push("t", first, *_rows(10, 2, 7.0))
    assert cache.dirty_rows() == 10
    cache.pull("t", np.arange(100, 110, dtype=np.uint64))  # evicts all of `first`
    assert cache.dirty_rows() == 0
    assert (inner.pull("t", first, count=False).rows == 7.0).all()


def test_stale_rows_are_reread_after_own_update_is_written() -> None:
    inner, cache, clock = _cache(every=1000, staleness=5.0)
    ids = np.arange(4, dtype=np.uint64)
    cache.pull("t", ids)
    cache.push("t", ids[:2], *_rows(2, 2, 1.0))  # own dirty update for ids 0, 1
    inner.push("t", ids[2:], *_rows(2, 2, 9.0))  # another trainer updates ids 2, 3
    clock.now = 4.0
    assert (cache.pull("t", ids[2:]).rows != 9.0).all()  # within the bound the cached row is served
    clock.now = 6.0
    got = cache.pull("t", ids)
    assert (got.rows[:2] == 1.0).all()  # own update survived the re-read
    assert (got.rows[2:] == 9.0).all()  # never older than max_staleness_s
    assert cache.metrics.hot_stale._value.get() == 4


def test_close_flushes() -> None:
    inner, cache, _ = _cache(every=1000)
    ids = np.arange(5, dtype=np.uint64)
    cache.pull_many({"t": ids, "u": ids})
    cache.push_many({"t": (ids, *_rows(5, 2, 3.0)), "u": (ids, *_rows(5, 3, 4.0))})
    assert not inner.pull("t", ids, count=False).admitted.any()
    cache.close()
    assert (inner.pull("t", ids, count=False).rows == 3.0).all()
    assert (inner.pull("u", ids, count=False).rows == 4.0).all()


def test_not_admitted_ids_are_not_cached() -> None:
    inner = MemoryStore([TableSpec(name="t", dim=2, admission={"min_count": 2})])
    cache = HotRowCache(inner, HotCacheConfig(enabled=True), device="cpu")
    ids = np.arange(3, dtype=np.uint64)
    assert not cache.pull("t", ids).admitted.any()
    assert cache.pull("t", ids).admitted.all()  # second sighting reached the inner store
    assert cache.hit_rate == 0.0


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract_through_hot_cache(check) -> None:  # type: ignore[no-untyped-def]
    def make(tables):  # type: ignore[no-untyped-def]
        cfg = StoreConfig(hot_cache=HotCacheConfig(enabled=True, writeback_every_steps=1))
        return build_store(cfg, tables, seed=0)

    check(make)


def test_flush_reports_durability_on_the_cache_schedule() -> None:
    """flush(force=False) writes back only when the schedule says so and reports whether all is durable."""
    inner, cache, clock = _cache(every=3, interval=10.0)
    ids = np.arange(4, dtype=np.uint64)
    assert inner.flush(force=False) and cache.flush(force=False)  # nothing pushed: durable
    cache.pull("t", ids)
    cache.push("t", ids, *_rows(4, 2, 1.0))  # cached rows: dirty
    assert not cache.flush(force=False) and cache.dirty_rows() == 4
    cache.push("t", ids, *_rows(4, 2, 2.0))
    assert not cache.flush(force=False)
    cache.push("t", ids, *_rows(4, 2, 3.0))  # third push: the schedule writes back
    assert cache.flush(force=False) and cache.dirty_rows() == 0
    assert (inner.pull("t", ids, count=False).rows == 3.0).all()
    cache.push("t", ids, *_rows(4, 2, 4.0))
    assert not cache.flush(force=False)
    clock.now += 10.0  # writeback_interval_s passed without another push
    assert cache.flush(force=False)
    assert (inner.pull("t", ids, count=False).rows == 4.0).all()
    cache.push("t", ids, *_rows(4, 2, 5.0))
    assert cache.flush() and (inner.pull("t", ids, count=False).rows == 5.0).all()  # force


def test_pushes_past_the_cache_are_durable_at_once() -> None:
    inner, cache, _ = _cache(every=1000)
    ids = np.arange(3, dtype=np.uint64)
    cache.push("t", ids, *_rows(3, 2, 6.0))  # not cached: written through to the inner store
    assert cache.flush(force=False) and (inner.pull("t", ids, count=False).rows == 6.0).all()
