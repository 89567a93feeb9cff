"""The hot tier: hits, write-back cadence, frequency-chosen membership, no lost updates, staleness bounds."""

from __future__ import annotations

import numpy as np
import pytest

from kelp.config import HotCacheConfig, StoreConfig, TableSpec
from kelp.errors import StoreUnavailableError
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
        min_count=1,  # these tests pull most ids once
        capacity_rows=capacity,
        writeback_every_steps=every,
        writeback_interval_s=interval,
        max_staleness_s=staleness,
    )
    return inner, HotRowCache(inner, cfg, clock=clock), clock


def _rows(n: int, dim: int, value: float) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, dim), value, np.float32), np.full(n, value, np.float32)


def _ids(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint64)


def test_hits_and_writeback_every_n_steps() -> None:
    inner, cache, _ = _cache(every=3)
    ids = _ids(0, 10)
    cache.pull("t", ids)
    inner.push("t", ids, *_rows(10, 2, 0.5))  # stored, but the tier already holds the init rows
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


def test_frequent_rows_stay_and_a_burst_of_one_off_ids_does_not_flush_them() -> None:
    inner, cache, _ = _cache(capacity=8, every=1)
    hot = _ids(0, 8)
    for _ in range(5):
        got = cache.pull("t", hot)
        cache.push("t", hot, got.rows + 1, got.state)  # every=1: written back and trimmed each push
    for burst in range(10):  # 100 ids seen once each: recency alone would evict the hot rows
        cold = _ids(1000 + 10 * burst, 10)
        got = cache.pull("t", cold)
        cache.push("t", cold, got.rows - 1, got.state)
        assert cache.holds("t", hot).all(), burst
        assert cache.rows_held() <= 8
    assert not cache.holds("t", _ids(1000, 100)).any()
    assert (
        inner.pull("t", _ids(1000, 100), count=False).rows
        == -1 + inner.tables["t"].init_rows(_ids(1000, 100))
    ).all()  # their updates reached the store all the same
    assert cache.metrics.hot_evictions._value.get() > 0


def test_a_full_tier_takes_a_row_once_it_is_seen_more_than_the_coldest_kept() -> None:
    _, cache, _ = _cache(capacity=4, every=1)
    cache.pull("t", _ids(0, 4))
    cache.pull("t", _ids(10, 4))  # full (4) + slack (1): one of them enters
    cache.flush()  # trims back to 4: drops a row seen once
    assert cache.rows_held() == 4
    newcomer = _ids(20, 1)
    cache.pull("t", newcomer)
    assert not cache.holds("t", newcomer).any()  # seen once: not hotter than what was dropped
    for _ in range(3):
        cache.pull("t", newcomer)
    assert cache.holds("t", newcomer).all()


def test_a_failed_write_back_keeps_the_rows_dirty_and_raises() -> None:
    inner, cache, _ = _cache(every=1000)
    ids = _ids(0, 4)
    cache.pull("t", ids)
    cache.push("t", ids, *_rows(4, 2, 3.0))
    real_push = inner.push_many

    def broken(updates):  # type: ignore[no-untyped-def]
        raise StoreUnavailableError("redis down")

    inner.push_many = broken  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailableError):
        cache.flush()
    assert cache.dirty_rows() == 4 and not cache.flush(force=False)
    inner.push_many = real_push  # type: ignore[method-assign]
    assert cache.flush() and (inner.pull("t", ids, count=False).rows == 3.0).all()


def test_stale_clean_rows_are_reread_and_own_dirty_rows_are_kept() -> None:
    inner, cache, clock = _cache(every=1000, staleness=5.0)
    ids = _ids(0, 4)
    cache.pull("t", ids)
    cache.push("t", ids[:2], *_rows(2, 2, 1.0))  # own dirty update for ids 0, 1
    inner.push("t", ids[2:], *_rows(2, 2, 9.0))  # another trainer updates ids 2, 3
    clock.now = 4.0
    assert (cache.pull("t", ids[2:]).rows != 9.0).all()  # within the bound the tier's row is served
    clock.now = 6.0
    got = cache.pull("t", ids)
    assert (got.rows[:2] == 1.0).all()  # own update kept until it is written back
    assert (got.rows[2:] == 9.0).all()  # never older than max_staleness_s
    assert cache.metrics.hot_stale._value.get() == 2


def test_close_flushes() -> None:
    inner, cache, _ = _cache(every=1000)
    ids = _ids(0, 5)
    cache.pull_many({"t": ids, "u": ids})
    cache.push_many({"t": (ids, *_rows(5, 2, 3.0)), "u": (ids, *_rows(5, 3, 4.0))})
    assert not inner.pull("t", ids, count=False).admitted.any()
    cache.close()
    assert (inner.pull("t", ids, count=False).rows == 3.0).all()
    assert (inner.pull("u", ids, count=False).rows == 4.0).all()


def test_not_admitted_ids_are_not_cached() -> None:
    inner = MemoryStore([TableSpec(name="t", dim=2, admission={"min_count": 2})])
    cache = HotRowCache(inner, HotCacheConfig(enabled=True))
    ids = _ids(0, 3)
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
    ids = _ids(0, 4)
    assert inner.flush(force=False) and cache.flush(force=False)  # nothing pushed: durable
    cache.pull("t", ids)
    cache.push("t", ids, *_rows(4, 2, 1.0))  # rows in the tier: dirty
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
    ids = _ids(0, 3)
    cache.push("t", ids, *_rows(3, 2, 6.0))  # not in the tier: written through to the inner store
    assert cache.flush(force=False) and (inner.pull("t", ids, count=False).rows == 6.0).all()


def test_staleness_bounds_and_the_age_of_unwritten_updates_are_exported() -> None:
    _, cache, clock = _cache(every=7, interval=3.5)
    registry = cache.metrics.registry
    assert registry.get_sample_value("kelp_store_hot_cache_writeback_every_steps") == 7
    assert registry.get_sample_value("kelp_store_hot_cache_writeback_interval_seconds") == 3.5
    assert registry.get_sample_value("kelp_store_hot_cache_dirty_age_seconds") == 0
    ids = _ids(0, 2)
    cache.pull("t", ids)
    cache.push("t", ids, *_rows(2, 2, 1.0))
    clock.now += 2.0
    assert registry.get_sample_value("kelp_store_hot_cache_dirty_age_seconds") == 2.0
    cache.flush()
    assert registry.get_sample_value("kelp_store_hot_cache_dirty_age_seconds") == 0


def test_leaving_a_failed_block_keeps_its_error_when_the_final_write_back_fails_too() -> None:
    inner, cache, _ = _cache(every=1000)
    ids = _ids(0, 2)

    def broken(updates):  # type: ignore[no-untyped-def]
        raise StoreUnavailableError("redis down")

    with pytest.raises(RuntimeError, match="the training error"), cache:
        cache.pull("t", ids)
        cache.push("t", ids, *_rows(2, 2, 1.0))
        inner.push_many = broken  # type: ignore[method-assign]
        raise RuntimeError("the training error")
    assert cache.dirty_rows() == 2  # not written, and never reported durable


def test_a_push_past_the_tier_during_a_pull_never_leaves_a_stale_row_in_the_tier() -> None:
    """The pull reads the store without the tier's lock; a push of the same id straight to the store
    (the id is not in the tier) lands meanwhile. The pull returns what it read, but must not keep it."""
    import threading

    inner, cache, _ = _cache(every=1000)
    ids = _ids(7, 1)
    inner.push("t", ids, *_rows(1, 2, 1.0))
    read, release = threading.Event(), threading.Event()
    real_pull = inner.pull_many

    def slow_pull(*args, **kwargs):  # type: ignore[no-untyped-def]
        got = real_pull(*args, **kwargs)  # reads the old row ...
        read.set()
        release.wait(5.0)  # ... and returns it only after the push below
        return got

    inner.pull_many = slow_pull  # type: ignore[method-assign]
    result: list[float] = []
    puller = threading.Thread(target=lambda: result.append(float(cache.pull("t", ids).rows[0, 0])))
    puller.start()
    assert read.wait(5.0)
    cache.push("t", ids, *_rows(1, 2, 2.0))  # not in the tier: written through to the store
    release.set()
    puller.join(5.0)
    inner.pull_many = real_pull  # type: ignore[method-assign]
    assert result == [1.0]  # the racing pull saw the old row (the trainer's ledger patches that copy)
    assert not cache.holds("t", ids).any()
    assert cache.pull("t", ids).rows[0, 0] == 2.0  # and the next pull reads the pushed one


def test_ids_seen_once_stay_write_through() -> None:
    inner = MemoryStore([TableSpec(name="t", dim=2)])
    cache = HotRowCache(inner, HotCacheConfig(enabled=True, min_count=2, writeback_interval_s=1e9))
    once, twice = _ids(0, 3), _ids(10, 3)
    cache.pull_many({"t": np.concatenate([once, twice])}, occurrences={"t": np.array([1, 1, 1, 2, 2, 2])})
    assert not cache.holds("t", once).any() and cache.holds("t", twice).all()
    cache.push("t", once, *_rows(3, 2, 4.0))  # straight to the store: durable at once
    assert (inner.pull("t", once, count=False).rows == 4.0).all()
    cache.pull("t", once)  # a second sighting: now they are kept
    assert cache.holds("t", once).all()


def test_only_the_ids_pushed_past_the_tier_during_a_pull_are_kept_out_of_it() -> None:
    """Two tables of one width share the tier's batch: the race check must hit the right table's ids."""
    import threading

    inner = MemoryStore([TableSpec(name="a", dim=2), TableSpec(name="b", dim=2)])
    cache = HotRowCache(inner, HotCacheConfig(enabled=True, min_count=1, writeback_every_steps=1000))
    ids = np.array([5, 6, 7], dtype=np.uint64)
    read, release = threading.Event(), threading.Event()
    real_pull = inner.pull_many

    def slow_pull(*args, **kwargs):  # type: ignore[no-untyped-def]
        got = real_pull(*args, **kwargs)
        read.set()
        release.wait(5.0)
        return got

    inner.pull_many = slow_pull  # type: ignore[method-assign]
    puller = threading.Thread(target=lambda: cache.pull_many({"a": ids, "b": ids}))
    puller.start()
    assert read.wait(5.0)
    cache.push("b", ids[1:2], *_rows(1, 2, 2.0))  # id 6 of table b only, straight to the store
    release.set()
    puller.join(5.0)
    inner.pull_many = real_pull  # type: ignore[method-assign]
    assert cache.holds("a", ids).tolist() == [True, True, True]  # a's 6 was not pushed: it stays
    assert cache.holds("b", ids).tolist() == [True, False, True]
    assert cache.pull("b", ids[1:2]).rows[0, 0] == 2.0


def test_a_never_seen_id_does_not_pass_for_hot_in_a_filled_sketch() -> None:
    """With ``min_count`` 2 an id enters the tier on its second sighting, never on its first.

    The sketch is filled with distinct ids (a stream's long tail), a quarter of its
    width; then fresh ids are pulled once. A sketch too shallow for that load
    estimates many of them at 2 (their cells shared with others) and keeps them,
    so their first update would wait for the write-back instead of reaching the store.
    """
    inner = MemoryStore([TableSpec(name="t", dim=2)])
    capacity = 4096
    cache = HotRowCache(
        inner, HotCacheConfig(enabled=True, min_count=2, capacity_rows=capacity, writeback_interval_s=1e9)
    )
    tail = _ids(1_000_000, capacity // 2)  # the sketch is 2 x capacity wide: a quarter filled
    cache.pull("t", tail)
    fresh = _ids(5_000_000, 500)
    cache.pull("t", fresh)
    kept = int(cache.holds("t", fresh).sum())
    assert kept <= 0.01 * len(fresh), f"{kept} of {len(fresh)} ids seen once were taken for hot"


def test_other_ranks_rows_take_their_owners_values_and_are_reread_sooner() -> None:
    """A trainer group's rank writes only the rows it owns (even ids here). The others' copies take
    the values their owners send back, and are re-read after the write-back interval, not the
    staleness bound."""
    inner, clock = MemoryStore([TableSpec(name="t", dim=2)]), Clock()
    cfg = HotCacheConfig(enabled=True, min_count=1, writeback_interval_s=2.0, max_staleness_s=10.0)
    cache = HotRowCache(inner, cfg, clock=clock, owned=lambda ids: ids % 2 == 0)
    ids = _ids(0, 4)
    cache.pull("t", ids)
    assert cache.holds("t", ids).all()  # every trained row may enter
    cache.push("t", ids[::2], *_rows(2, 2, 1.0))  # its own rows: dirty in the tier
    cache.refresh({"t": (ids, *_rows(4, 2, 5.0))})  # the owners' values, for every row it holds
    got = cache.pull("t", ids)
    assert got.rows[:, 0].tolist() == [1.0, 5.0, 1.0, 5.0]  # a dirty (own) row keeps its own update
    inner.push("t", ids[1::2], *_rows(2, 2, 7.0))  # the other rank's owner writes its rows back
    clock.now = 3.0  # past the write-back interval, within the staleness bound
    got = cache.pull("t", ids)
    assert got.rows[:, 0].tolist() == [1.0, 7.0, 1.0, 7.0]


@pytest.mark.parametrize(
    ("trainers", "updates", "backend", "on"),
    [
        (1, "overwrite", "redis", True),
        (2, "overwrite", "redis", True),
        (None, "overwrite", "redis", False),
        (2, "compose", "redis", False),
        (1, "overwrite", "memory", False),
    ],
)
def test_auto_keeps_the_tier_for_trainers_that_overwrite_rows_on_redis(
    trainers: int | None, updates: str, backend: str, on: bool
) -> None:
    cfg = StoreConfig(backend=backend, urls=["redis://127.0.0.1:1"], sparse_updates=updates)
    assert cfg.hot_tier(trainers) is on
