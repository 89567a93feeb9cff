"""The working copy: reserved rows are pinned, gathered as they are at the step, updated in place,
written back once per period (new rows at once), and never lost while a write-back is on the way."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch

from kelp.config import AdmissionSpec, HotCacheConfig, StoreConfig, TableSpec
from kelp.store import MemoryStore, build_store
from kelp.store.base import EmbeddingStore
from kelp.store.hot import working_copy as working_copy_module
from kelp.store.hot.working_copy import WorkingCopy
from kelp.store.rows import slots as slots_module

TABLES = [TableSpec(name="t", dim=2), TableSpec(name="u", dim=3)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _copy(
    inner: EmbeddingStore | None = None, *, capacity: int = 100, every: int = 3, staleness: float = 1e9
) -> tuple[EmbeddingStore, WorkingCopy, Clock]:
    inner = inner or MemoryStore(TABLES)
    clock = Clock()
    cfg = HotCacheConfig(
        enabled=True,
        capacity_rows=capacity,
        writeback_every_steps=every,
        writeback_interval_s=1e9,
        max_staleness_s=staleness,
    )
    return inner, WorkingCopy(inner, cfg, clock=clock), clock


def _ids(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint64)


def _step(wc: WorkingCopy, ids: Mapping[str, np.ndarray], delta: float = 1.0, write_back: bool = True) -> int:
    """One training step's store work as the pipeline does it: reserve, gather, add ``delta`` to every
    admitted row, apply; then (``write_back``) the push thread's durable check, which writes what is due."""
    res = wc.reserve(ids)
    got = wc.gather(res)
    updates = {}
    for name, table_ids in ids.items():
        ok = got[name].admitted
        updates[name] = (table_ids[ok], got[name].rows[ok] + delta, got[name].state[ok] + delta)
    ticket = wc.apply(res, updates)
    if write_back:
        wc.durable_through()
    return ticket


def _stored(inner: EmbeddingStore, table: str, ids: np.ndarray) -> np.ndarray:
    return inner.pull(table, ids, count=False).rows


@pytest.fixture(params=["host-view", "device-path"])
def index_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the tier's rows are gathered and written: through numpy views of tensors in host memory
    (the CPU), or through the torch indexing a CUDA device's tensors take, run here on the CPU."""
    if request.param == "device-path":

        def arrays_only(column: object) -> object:
            return column if isinstance(column, np.ndarray) else None

        monkeypatch.setattr(slots_module, "host_view", arrays_only)
        monkeypatch.setattr(working_copy_module, "host_view", arrays_only)
    return str(request.param)


@pytest.mark.usefixtures("index_path")
def test_steps_train_in_place_and_the_store_gets_each_row_once_per_period() -> None:
    inner, wc, _ = _copy(every=3)
    ids = {"t": _ids(0, 10), "u": _ids(0, 4)}
    init = inner.tables["t"].init_rows(ids["t"])
    first = _step(wc, ids)
    assert wc.durable_through() == first  # new rows go out at the next write-back
    np.testing.assert_allclose(_stored(inner, "t", ids["t"]), init + 1, rtol=1e-6)
    for _ in range(2):  # kept rows now: their updates wait for the period (3 pushes)
        _step(wc, ids)
        assert wc.durable_through() == first
        np.testing.assert_allclose(_stored(inner, "t", ids["t"]), init + 1, rtol=1e-6)
    assert wc.dirty_rows() == 14
    fourth = _step(wc, ids)
    assert wc.durable_through() == fourth
    np.testing.assert_allclose(_stored(inner, "t", ids["t"]), init + 4, rtol=1e-6)
    assert wc.dirty_rows() == 0
    assert wc.pinned_rows() == 0
    np.testing.assert_allclose(wc.gather(wc.reserve(ids))["t"].rows, init + 4, rtol=1e-6)


def test_a_gather_sees_every_step_applied_after_its_reservation() -> None:
    _, wc, _ = _copy(every=100)
    ids = {"t": _ids(0, 5)}
    ahead = wc.reserve(ids)  # prefetched before the two steps below trained the same rows
    assert wc.pinned_rows() == 5
    _step(wc, ids, 1.0)
    _step(wc, ids, 1.0)
    got = wc.gather(ahead)["t"]
    np.testing.assert_allclose(got.rows, wc.tables["t"].init_rows(ids["t"]) + 2, rtol=1e-6)
    assert wc.overlapped_rows == 5
    wc.release(ahead)
    wc.release(ahead)  # a second release changes nothing
    assert wc.pinned_rows() == 0


def test_pinned_rows_outlive_trims_and_unpinned_cold_rows_leave_first() -> None:
    inner, wc, _ = _copy(capacity=12, every=1)
    hot = {"t": _ids(0, 8)}
    for _ in range(4):
        _step(wc, hot)
    pinned = wc.reserve({"t": _ids(500, 4)})  # reserved, not trained yet
    for burst in range(6):  # one-off ids: each step writes them back and trims
        _step(wc, {"t": _ids(1000 + 20 * burst, 20)})
        assert wc.holds("t", _ids(500, 4)).all(), burst
    assert wc.holds("t", hot["t"]).all()
    got = wc.gather(pinned)["t"]
    wc.apply(pinned, {"t": (_ids(500, 4), got.rows - 1, got.state)})
    wc.flush()
    assert wc.rows_held() <= 12
    np.testing.assert_allclose(
        _stored(inner, "t", _ids(500, 4)), inner.tables["t"].init_rows(_ids(500, 4)) - 1
    )
    # The one-off rows left the tier, and their updates reached the store all the same.
    assert not wc.holds("t", _ids(1000, 20)).any()
    np.testing.assert_allclose(
        _stored(inner, "t", _ids(1000, 20)), inner.tables["t"].init_rows(_ids(1000, 20)) + 1
    )


class _WritesDuring(MemoryStore):
    """A store whose next push runs ``during`` first: a step writing rows while their write-back is on
    the way."""

    during = None

    def push_many(self, updates):  # type: ignore[no-untyped-def]
        hook, self.during = self.during, None
        if hook is not None:
            hook()
        return super().push_many(updates)


def test_a_row_written_again_during_its_write_back_stays_dirty_and_is_not_lost() -> None:
    inner = _WritesDuring(TABLES)
    _, wc, _ = _copy(inner, every=1)
    ids = {"t": _ids(0, 6)}
    init = inner.tables["t"].init_rows(ids["t"])
    _step(wc, ids)  # fresh rows, written at once
    second = _step(wc, ids, write_back=False)
    inner.during = lambda: _step(wc, ids, 10.0, write_back=False)  # while push 2's rows are on the way
    assert wc.durable_through() == second
    np.testing.assert_allclose(_stored(inner, "t", ids["t"]), init + 2, rtol=1e-6)  # the value copied before
    assert wc.dirty_rows() == 6  # the third step's update is still to go
    assert wc.durable_through(force=True) == second + 1
    np.testing.assert_allclose(_stored(inner, "t", ids["t"]), init + 12, rtol=1e-6)
    assert wc.dirty_rows() == 0


def test_new_rows_are_written_at_the_next_write_back_and_kept_rows_wait_for_their_period() -> None:
    inner, wc, _ = _copy(every=5)
    kept = {"t": _ids(0, 4)}
    _step(wc, kept)  # their first (fresh) value goes out at once
    _step(wc, kept)
    new = {"t": _ids(100, 3)}
    _step(wc, new)
    np.testing.assert_allclose(
        _stored(inner, "t", new["t"]), inner.tables["t"].init_rows(new["t"]) + 1, rtol=1e-6
    )
    np.testing.assert_allclose(
        _stored(inner, "t", kept["t"]), inner.tables["t"].init_rows(kept["t"]) + 1, rtol=1e-6
    )
    assert wc.dirty_rows() == 4


def test_a_failed_read_leaves_nothing_pinned() -> None:
    class Failing(MemoryStore):
        fail = False

        def pull_many(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if self.fail:
                raise ConnectionError("store down")
            return super().pull_many(*args, **kwargs)

    inner = Failing(TABLES)
    _, wc, _ = _copy(inner, capacity=4, every=1)
    _step(wc, {"t": _ids(0, 4)})
    inner.fail = True
    with pytest.raises(ConnectionError):
        wc.reserve({"t": np.concatenate([_ids(0, 4), _ids(50, 2)])})
    inner.fail = False
    assert wc.pinned_rows() == 0
    _step(wc, {"t": _ids(0, 4)})  # and training goes on
    assert wc.pinned_rows() == 0


def test_an_update_of_a_row_nobody_reserved_is_refused() -> None:
    _, wc, _ = _copy()
    res = wc.reserve({"t": _ids(0, 2)})
    got = wc.gather(res)["t"]
    with pytest.raises(RuntimeError, match="not resident"):
        wc.apply(res, {"t": (_ids(5, 2), got.rows, got.state)})


def test_nonfinite_rows_are_refused_and_the_rest_applied() -> None:
    inner, wc, _ = _copy(every=1)
    ids = _ids(0, 3)
    res = wc.reserve({"t": ids})
    got = wc.gather(res)["t"]
    rows = got.rows + 1
    rows[1, 0] = np.nan
    wc.apply(res, {"t": (ids, rows, got.state)})
    wc.flush()
    stored = _stored(inner, "t", ids)
    np.testing.assert_allclose(stored[[0, 2]], rows[[0, 2]], rtol=1e-6)
    assert np.isfinite(stored).all()
    assert wc.metrics.rows_quarantined.labels(table="t", reason="nonfinite_push")._value.get() == 1
    assert bool(torch.isfinite(wc.gather(wc.reserve({"t": ids}))["t"].rows).all())


def test_on_redis_a_restart_reads_back_every_row_a_durable_ticket_covers(redis_url: str) -> None:
    """Rows are durable in redis-server when ``durable_through`` says so, and a new process's working
    copy reads them back (what a restart after kill -9 trains on)."""
    cfg = StoreConfig(backend="redis", urls=[redis_url])
    cfg.hot_cache.enabled = True
    cfg.hot_cache.writeback_every_steps = 2
    ids = {"t": _ids(7, 50), "u": _ids(9, 20)}
    with build_store(cfg, TABLES, "wc-restart", trainers=1) as first:
        assert isinstance(first, WorkingCopy)
        tickets = [_step(first, ids) for _ in range(3)]
        durable = first.durable_through()
        assert durable in (2, 3) and durable <= tickets[-1]
        want = first.gather(first.reserve(ids))
        first.flush()
    with build_store(cfg, TABLES, "wc-restart", trainers=1) as second:
        assert isinstance(second, WorkingCopy)
        got = second.gather(second.reserve(ids))
        for name in ids:
            np.testing.assert_array_equal(got[name].rows, want[name].rows)
            np.testing.assert_array_equal(got[name].state, want[name].state)


def test_finite_rows_whose_sum_overflows_are_applied() -> None:
    inner, wc, _ = _copy(every=1)
    ids = _ids(0, 4)
    res = wc.reserve({"t": ids})
    rows = np.full((4, 2), 3e38, np.float32)  # each finite; their sum is not
    wc.apply(res, {"t": (ids, rows, np.ones(4, np.float32))})
    wc.flush()
    np.testing.assert_array_equal(_stored(inner, "t", ids), rows)
    refused = wc.metrics.rows_quarantined.labels(table="t", reason="nonfinite_push")._value.get()
    assert refused == 0


def test_a_sampled_trim_drops_cold_rows_and_keeps_the_hot_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``_TRIM_MIN_SAMPLE`` rows a trim scores a random sample, not every row: still the cold go."""
    from kelp.store.hot import tier

    monkeypatch.setattr(tier, "_TRIM_MIN_SAMPLE", 16)
    inner, wc, _ = _copy(capacity=256, every=1)
    hot = {"t": _ids(0, 32)}
    for _ in range(6):
        _step(wc, hot)
    for burst in range(12):  # 64 one-off ids a step: each step's trim samples 4 times its excess
        _step(wc, {"t": _ids(10_000 + 64 * burst, 64)})
        assert wc.holds("t", hot["t"]).all(), burst
    assert wc.rows_held() <= 256
    assert wc.metrics.hot_evictions._value.get() > 0
    np.testing.assert_allclose(  # evicted rows were written back first
        _stored(inner, "t", _ids(10_000, 64)), inner.tables["t"].init_rows(_ids(10_000, 64)) + 1, rtol=1e-6
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the same path runs on the CPU above)")
def test_on_cuda_the_rows_stay_on_the_device_and_reach_the_store() -> None:
    inner = MemoryStore(TABLES)
    cfg = HotCacheConfig(enabled=True, capacity_rows=100, writeback_every_steps=1)
    wc = WorkingCopy(inner, cfg, device="cuda")
    ids = {"t": _ids(0, 10), "u": _ids(3, 4)}
    res = wc.reserve(ids)
    got = wc.gather(res)
    assert got["t"].rows.device.type == "cuda"
    updates = {n: (ids[n], got[n].rows + 1, got[n].state + 1) for n in ids}
    wc.apply(res, updates)
    wc.flush()
    np.testing.assert_allclose(
        _stored(inner, "t", ids["t"]), inner.tables["t"].init_rows(ids["t"]) + 1, rtol=1e-6
    )


@pytest.mark.usefixtures("index_path")
def test_an_update_in_another_order_or_a_part_of_the_batch_lands_on_each_ids_own_row() -> None:
    """The reservation's slots serve an update that holds its resident rows in order; any other
    update (reordered, or fewer rows) finds its slots by id, and every row gets its own values."""
    inner, wc, _ = _copy(every=1)
    ids = {"t": _ids(0, 6)}
    for order in (np.arange(6), np.arange(5, -1, -1), np.array([4, 1])):
        res = wc.reserve(ids)
        got = wc.gather(res)
        chosen = ids["t"][order]
        rows = np.repeat(chosen.astype(np.float32)[:, None], 2, axis=1)  # row value = its id
        wc.apply(res, {"t": (chosen, rows, got["t"].state[order])})
        wc.durable_through()
        np.testing.assert_array_equal(_stored(inner, "t", chosen), rows)
    assert wc.pinned_rows() == 0


def test_distinct_slots_match_numpy_unique() -> None:
    from kelp.store.hot.rows import _distinct

    rng = np.random.default_rng(3)
    for n, high in ((0, 10), (5, 10), (1000, 50), (20_000, 1_000_000)):
        slots = rng.integers(0, high, size=n)
        np.testing.assert_array_equal(_distinct(slots, high), np.unique(slots))


@pytest.mark.usefixtures("index_path")
def test_ids_not_admitted_are_gathered_as_the_store_answered_beside_resident_rows() -> None:
    """A batch mixing resident rows with ids the admission policy turned away: the gather puts each
    resident row and each default row at its own id's position; only the admitted ones train."""
    inner = MemoryStore([TableSpec(name="t", dim=2, admission=AdmissionSpec(min_count=2))])
    cfg = HotCacheConfig(enabled=True, capacity_rows=100, writeback_every_steps=1)
    wc = WorkingCopy(inner, cfg)
    seen = {"t": _ids(0, 4)}
    _step(wc, seen)  # first sightings: turned away
    _step(wc, seen)  # second: admitted, resident, trained once
    mixed = {"t": np.array([0, 100, 1, 101, 2, 3], np.uint64)}
    res = wc.reserve(mixed)
    got = wc.gather(res)["t"]
    assert got.admitted.tolist() == [True, False, True, False, True, True]
    t = inner.tables["t"]
    np.testing.assert_allclose(got.rows[got.admitted], t.init_rows(_ids(0, 4)) + 1, rtol=1e-6)
    np.testing.assert_array_equal(got.rows[~got.admitted], t.default_rows(np.array([100, 101], np.uint64)))
    wc.release(res)
    assert wc.pinned_rows() == 0
