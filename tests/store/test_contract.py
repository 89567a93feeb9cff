"""The shared contract: every check in kelp.store.checks against every backend, and listing and
loading rows exactly (``row_scan_parts``, ``scan_rows``, ``load_rows``, ``drop_rows``: what row
snapshots, restore and import stand on) on every backend."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from kelp.config import HotCacheConfig, TableSpec
from kelp.errors import UserError
from kelp.store import MemoryStore
from kelp.store.base import EmbeddingStore
from kelp.store.checks import ALL_CHECKS, MakeStore
from kelp.store.flow import FlowStore, RowWrite
from kelp.store.rows.stored import StoredRows

pytestmark = pytest.mark.integration

_COLUMNS = ("ids", "rows", "state", "access_count", "updated_s")


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract(make_store: MakeStore, check) -> None:  # type: ignore[no-untyped-def]
    check(make_store)


def _block(
    ids: np.ndarray, dim: int, dtype: str = "float32", seed: int = 0, age_s: int = 10**6
) -> StoredRows:
    """Rows with every column distinct per row: counts up to 2**32-1, stamps up to ``age_s`` old."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    return StoredRows(
        ids=ids.astype(np.uint64),
        rows=rng.normal(size=(n, dim)).astype(dtype),
        state=rng.random(n).astype(np.float32),
        access_count=rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
        updated_s=(int(time.time()) - rng.integers(0, age_s, n)).astype(np.uint32),
    )


def _scan_blocks(store: EmbeddingStore, table: str, **kwargs: int) -> list[StoredRows]:
    return [b for part in range(store.row_scan_parts()) for b in store.scan_rows(table, part, **kwargs)]


def _by_id(blocks: list[StoredRows], dim: int, dtype: str = "float32") -> StoredRows:
    """Every part's blocks as one block sorted by id, once per id (a scan may yield a row twice)."""
    if not blocks:
        return StoredRows.empty(dim, dtype)
    cat = {c: np.concatenate([getattr(b, c) for b in blocks]) for c in _COLUMNS}
    _, first = np.unique(cat["ids"], return_index=True)
    return StoredRows(**{c: v[first] for c, v in cat.items()})


def _assert_same(got: StoredRows, want: StoredRows) -> None:
    order = np.argsort(want.ids)
    for column in _COLUMNS:
        expected = getattr(want, column)[order]
        actual = getattr(got, column)
        assert actual.dtype == expected.dtype, column
        np.testing.assert_array_equal(actual, expected, err_msg=column)


def test_rows_load_and_scan_back_exactly(make_store: MakeStore) -> None:
    """``load_rows`` writes rows exactly (embedding, state, access count, last update, float16 too);
    ``scan_rows`` over every part, in small blocks, lists exactly them; a pull reads them;
    ``updated_since_s`` keeps the newer ones; a second load replaces; bad arguments are refused."""
    with make_store([TableSpec(name="a", dim=3), TableSpec(name="h", dim=5, dtype="float16")]) as store:
        ids = np.concatenate([np.array([0, 2**64 - 1], np.uint64), np.arange(1, 699, dtype=np.uint64) * 7919])
        a, h = _block(ids, 3, seed=1), _block(ids[:40], 5, "float16", seed=2)
        assert store.load_rows("a", a) == len(ids) and store.load_rows("h", h) == 40
        blocks = _scan_blocks(store, "a", batch=64)
        assert len(blocks) > 1, "a scan reads in blocks, not the whole table"
        _assert_same(_by_id(blocks, 3), a)
        _assert_same(_by_id(_scan_blocks(store, "h"), 5, "float16"), h)
        pulled = store.pull("a", ids, count=False)
        assert pulled.admitted.all()
        np.testing.assert_array_equal(pulled.rows, a.rows)
        np.testing.assert_array_equal(pulled.updated_s, a.updated_s)
        since = int(np.median(a.updated_s))
        newer = _by_id(_scan_blocks(store, "a", batch=64, updated_since_s=since), 3)
        np.testing.assert_array_equal(newer.ids, np.sort(ids[a.updated_s >= since]))
        again = _block(ids[:100], 3, seed=3)
        store.load_rows("a", again)
        _assert_same(_by_id(_scan_blocks(store, "a"), 3), _by_id([again, _part(a, slice(100, None))], 3))
        with pytest.raises(ValueError, match="part must be in"):
            store.scan_rows("a", store.row_scan_parts())
        with pytest.raises(ValueError, match="batch must be >= 1"):
            store.scan_rows("a", 0, batch=0)
        with pytest.raises(ValueError, match=r"StoredRows.rows must be \[2, 3\]"):
            store.load_rows("a", _block(np.array([5, 6], np.uint64), 4))
        bad = _block(np.array([10**9, 10**9 + 1], np.uint64), 3)
        bad.state[1] = np.nan
        with pytest.raises(ValueError, match="1 of 2 rows hold a NaN"):
            store.load_rows("a", bad)
        assert not store.pull("a", bad.ids, count=False).admitted.any(), "a refused block writes nothing"


def _part(block: StoredRows, at: slice) -> StoredRows:
    return StoredRows(**{c: getattr(block, c)[at] for c in _COLUMNS})


def test_scan_leaves_out_expired_and_faulty_rows(
    make_store: MakeStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows past the TTL are neither loaded nor listed, as reads hide them; a stored value that is no
    valid row (NaN) is left out of the listing and counted in a WARNING."""
    with make_store([TableSpec(name="t", dim=2, eviction={"ttl_s": 3600})]) as store:
        now = int(time.time())
        live, soon, gone = (np.arange(k, k + 20, dtype=np.uint64) for k in (0, 100, 200))
        rows = _block(np.concatenate([live, soon, gone]), 2)
        rows.updated_s[:] = np.repeat(np.array([now, now - 3599, now - 3700], np.uint32), 20)
        assert store.load_rows("t", rows) == 40, "the row already past its TTL is not written"
        assert isinstance(store, FlowStore)
        # Two seconds on: a layout that judges TTLs by the rows' stamps (memory, buckets) hides the "soon"
        # rows at once, as Redis itself will expire their keys within a second.
        store._clock = lambda: time.time() + 2
        planted = _block(np.array([300, 301], np.uint64), 2)
        planted.rows[0, 1] = np.nan
        write = RowWrite(planted.ids, planted.rows, planted.state, create=True)
        store._write_rows({"t": write}, store._clock())
        deadline = time.monotonic() + 60
        while store.pull("t", soon, count=False).admitted.any():
            assert time.monotonic() < deadline, "rows past their TTL still read"
            time.sleep(0.2)
        with caplog.at_level(logging.WARNING):
            listed = _by_id(_scan_blocks(store, "t", batch=16), 2)
        np.testing.assert_array_equal(listed.ids, np.sort(np.concatenate([live, planted.ids[1:]])))
        assert any("left out" in r.getMessage() for r in caplog.records), caplog.text


def test_drop_rows_deletes_one_table_of_one_deployment(make_store: MakeStore) -> None:
    """``drop_rows`` deletes a table's rows and admission counters; another table and the same table
    of another deployment (on the same servers) keep theirs."""
    counted = TableSpec(name="a", dim=2, admission={"min_count": 2})
    with make_store([counted, TableSpec(name="b", dim=2)]) as mine, make_store([counted]) as other:
        rows = _block(np.arange(300, dtype=np.uint64), 2)
        mine.load_rows("a", rows)
        mine.load_rows("b", _part(rows, slice(0, 50)))
        other.load_rows("a", _part(rows, slice(0, 80)))
        unseen = np.arange(10**6, 10**6 + 5, dtype=np.uint64)
        assert not mine.pull("a", unseen).admitted.any() and not other.pull("a", unseen).admitted.any()
        assert mine.drop_rows("a") == 300
        assert _scan_blocks(mine, "a") == []
        assert not mine.pull("a", rows.ids, count=False).admitted.any()
        assert len(_by_id(_scan_blocks(mine, "b"), 2)) == 50
        assert len(_by_id(_scan_blocks(other, "a"), 2)) == 80
        assert not mine.pull("a", unseen).admitted.any(), "the sighting counters went with the rows"
        assert other.pull("a", unseen).admitted.all(), "the other deployment's counters stay"


def test_a_hot_tier_refuses_to_list_rows() -> None:
    """The hot tier holds rows the store has not seen yet: listing through it is refused in one line."""
    from kelp.store.hot.tier import HotRowCache

    inner = MemoryStore([TableSpec(name="t", dim=2)])
    cache = HotRowCache(inner, HotCacheConfig(enabled=True))
    with pytest.raises(UserError, match="cannot list"):
        cache.scan_rows("t", 0)
    cache.close()
