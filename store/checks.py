"""Contract checks every :class:`~kelp.store.base.EmbeddingStore` backend must pass.

They live in the package (as River's ``river.checks`` do) so a new backend is
checked by one parametrized test: ``for check in ALL_CHECKS: check(make_store)``
where ``make_store(tables)`` returns a fresh, empty store for those tables.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kelp.config import TableSpec
from kelp.store.base import EmbeddingStore, ReadRows
from kelp.store.flow import FlowStore, RowWrite
from kelp.store.policy.initial_rows import init_rows

__all__ = ["ALL_CHECKS", "MakeStore"]

MakeStore = Callable[[list[TableSpec]], EmbeddingStore]


def _rows(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, dim)).astype(np.float32), rng.random(n).astype(np.float32)


def check_push_then_pull_roundtrip(make_store: MakeStore) -> None:
    """Pushed rows and state read back exactly (float32), in the order the ids are given."""
    with make_store([TableSpec(name="t", dim=8)]) as store:
        ids = np.arange(100, 300, dtype=np.uint64) * np.uint64(7919)
        rows, state = _rows(len(ids), 8)
        store.push("t", ids, rows, state)
        perm = np.random.default_rng(1).permutation(len(ids))
        got = store.pull("t", ids[perm], count=False)
        assert got.rows.dtype == np.float32 and got.rows.shape == (len(ids), 8)
        np.testing.assert_array_equal(got.rows, rows[perm])
        np.testing.assert_array_equal(got.state, state[perm])
        assert got.admitted.all()


def check_push_tickets_rise_and_become_durable(make_store: MakeStore) -> None:
    """Each acknowledged push returns a higher ticket; a forced ``durable_through`` covers them all."""
    with make_store([TableSpec(name="t", dim=4)]) as store:
        start = store.durable_through(force=True)
        tickets = []
        for k in range(3):
            ids = np.arange(10 * k, 10 * k + 10, dtype=np.uint64)
            rows, state = _rows(len(ids), 4, seed=k)
            store.pull("t", ids)  # admits them where admission is on
            tickets.append(store.push_many({"t": (ids, rows, state)}))
        assert tickets == sorted(set(tickets)) and tickets[0] > start, tickets
        assert store.durable_through() <= tickets[-1]
        assert store.durable_through(force=True) >= tickets[-1]


def check_large_ids_and_batches(make_store: MakeStore) -> None:
    """Ids up to 2**64-1 and batches larger than one command chunk."""
    with make_store([TableSpec(name="t", dim=2)]) as store:
        ids = np.concatenate(
            [np.array([0, 2**63, 2**64 - 1], np.uint64), np.arange(1, 5001, dtype=np.uint64)]
        )
        rows, state = _rows(len(ids), 2, seed=2)
        store.push("t", ids, rows, state)
        got = store.pull("t", ids, count=False)
        np.testing.assert_array_equal(got.rows, rows)
        assert got.admitted.all()


def check_admission_off_reads_init_row(make_store: MakeStore) -> None:
    """Admission off: an unseen id is admitted with its init row on count=True; count=False reads default."""
    spec = TableSpec(name="t", dim=6, init={"kind": "normal", "std": 0.1, "seed": 3})
    with make_store([spec]) as store:
        ids = np.array([5, 6, 7], np.uint64)
        serving = store.pull("t", ids, count=False)
        assert not serving.admitted.any()
        np.testing.assert_array_equal(serving.rows, np.zeros((3, 6), np.float32))
        got = store.pull("t", ids)
        assert got.admitted.all()
        np.testing.assert_allclose(got.rows, init_rows(spec.init, "t", ids, 6))
        np.testing.assert_array_equal(got.state, np.zeros(3, np.float32))


def check_admission_min_count(make_store: MakeStore) -> None:
    """min_count=3: sightings 1 and 2 read the default and discard pushes; sighting 3 admits."""
    spec = TableSpec(name="t", dim=4, admission={"min_count": 3}, init={"kind": "uniform", "scale": 0.5})
    with make_store([spec]) as store:
        ids = np.array([11, 12], np.uint64)
        rows, state = _rows(2, 4)
        for sighting in (1, 2):  # min_count - 1 sightings: not admitted
            got = store.pull("t", ids)
            assert not got.admitted.any(), f"admitted after {sighting} sightings"
            np.testing.assert_array_equal(got.rows, np.zeros((2, 4), np.float32))
            store.push("t", ids, rows, state)  # discarded
            assert not store.pull("t", ids, count=False).admitted.any()
        got = store.pull("t", ids)  # the min_count-th sighting admits, with the init row
        assert got.admitted.all()
        np.testing.assert_allclose(got.rows, init_rows(spec.init, "t", ids, 4))
        store.push("t", ids, rows, state)
        again = store.pull("t", ids, count=False)
        assert again.admitted.all()
        np.testing.assert_array_equal(again.rows, rows)


def check_admission_counts_occurrences(make_store: MakeStore) -> None:
    """min_count=3 counts occurrences by default: an id in 3 samples of one batch is admitted by that pull;
    with ``count: pulls`` the same pull is one sighting."""
    by_occurrence = TableSpec(name="occ", dim=2, admission={"min_count": 3})
    by_pull = TableSpec(name="pulls", dim=2, admission={"min_count": 3, "count": "pulls"})
    with make_store([by_occurrence, by_pull]) as store:
        ids = np.array([5, 6, 7], np.uint64)
        occurrences = np.array([3, 1, 2], np.int64)
        got = store.pull_many(
            {"occ": ids, "pulls": ids}, occurrences={"occ": occurrences, "pulls": occurrences}
        )
        assert got["occ"].admitted.tolist() == [True, False, False]
        assert not got["pulls"].admitted.any()
        again = store.pull_many(
            {"occ": ids, "pulls": ids}, occurrences={"occ": occurrences, "pulls": occurrences}
        )
        assert again["occ"].admitted.tolist() == [True, False, True]  # 2 + 2 occurrences
        assert not again["pulls"].admitted.any()  # 2 pulls
        assert store.pull("pulls", ids).admitted.all()  # the third pull; without occurrences: 1 each


def check_admitted_now_marks_the_admitting_pull(make_store: MakeStore) -> None:
    """``admitted_now`` is True only on the pull that admitted the id (its row is the init row then).

    A table without counting admission stores nothing on pull, so nothing is "admitted now" there.
    """
    counted = TableSpec(name="c", dim=2, admission={"min_count": 2})
    plain = TableSpec(name="p", dim=2)
    with make_store([counted, plain]) as store:
        ids = np.array([1, 2], np.uint64)
        first = store.pull_many({"c": ids, "p": ids}, occurrences={"c": np.array([2, 1])})
        assert first["c"].admitted_now is not None and first["c"].admitted_now.tolist() == [True, False]
        assert first["p"].admitted_now is not None and not first["p"].admitted_now.any()
        second = store.pull_many({"c": ids, "p": ids})
        assert second["c"].admitted_now is not None
        assert second["c"].admitted_now.tolist() == [False, True]  # id 1 was stored already
        assert not store.pull("c", ids, count=False).admitted_now.any()  # type: ignore[union-attr]


def check_fallback_table_is_a_table(make_store: MakeStore) -> None:
    """A table's fallback rows live in ``<table>__fallback``: admitted on sight, read and pushed like rows."""
    spec = TableSpec(name="u", dim=3, admission={"min_count": 5, "fallback_buckets": 4})
    bucket_table = spec.fallback_table()
    assert bucket_table is not None and bucket_table.name == "u__fallback"
    with make_store([spec, bucket_table]) as store:
        buckets = np.array([0, 3], np.uint64)
        got = store.pull("u__fallback", buckets)
        assert got.admitted.all()
        np.testing.assert_allclose(got.rows, init_rows(spec.init, "u__fallback", buckets, 3))
        rows, state = _rows(2, 3, seed=4)
        store.push("u__fallback", buckets, rows, state)
        np.testing.assert_array_equal(store.pull("u__fallback", buckets, count=False).rows, rows)


def check_count_false_never_counts(make_store: MakeStore) -> None:
    """Serving reads (count=False) never record sightings nor admit."""
    with make_store([TableSpec(name="t", dim=2, admission={"min_count": 2})]) as store:
        ids = np.array([1, 2, 3], np.uint64)
        for _ in range(5):
            assert not store.pull("t", ids, count=False).admitted.any()
        assert not store.pull("t", ids).admitted.any()  # first real sighting
        assert store.pull("t", ids).admitted.all()  # second


def check_default_row_init(make_store: MakeStore) -> None:
    """default_row='init': a not-admitted id reads its deterministic init row."""
    spec = TableSpec(name="t", dim=5, default_row="init", admission={"min_count": 10})
    with make_store([spec]) as store:
        ids = np.array([42, 43], np.uint64)
        got = store.pull("t", ids)
        assert not got.admitted.any()
        np.testing.assert_allclose(got.rows, init_rows(spec.init, "t", ids, 5))


def check_probability_admission(make_store: MakeStore) -> None:
    """probability=0.5 admits roughly half the new ids on their first sighting."""
    with make_store([TableSpec(name="t", dim=2, admission={"probability": 0.5})]) as store:
        ids = np.arange(2000, dtype=np.uint64)
        frac = store.pull("t", ids).admitted.mean()
        assert 0.35 < frac < 0.65, frac
        # admitted ones are stored: a serving read sees exactly them
        assert store.pull("t", ids, count=False).admitted.mean() == frac


def check_multi_table(make_store: MakeStore) -> None:
    """pull_many / push_many over tables with different dims and dtypes keep tables apart."""
    tables = [TableSpec(name="a", dim=3), TableSpec(name="b", dim=7, dtype="float16")]
    with make_store(tables) as store:
        ids = np.arange(50, dtype=np.uint64)
        ra, sa = _rows(50, 3, 1)
        rb, sb = _rows(50, 7, 2)
        store.push_many({"a": (ids, ra, sa), "b": (ids, rb, sb)})
        got = store.pull_many({"a": ids, "b": ids[::-1].copy()}, count=False)
        np.testing.assert_array_equal(got["a"].rows, ra)
        np.testing.assert_allclose(got["b"].rows, rb[::-1], rtol=1e-3, atol=1e-4)
        np.testing.assert_array_equal(got["b"].state, sb[::-1])


def check_one_id_table_first(make_store: MakeStore) -> None:
    """A pull whose first table has one id (a serving request's user feature) keeps every other
    table's rows in order, whichever shard that one id lives on (this once broke on 3 shards)."""
    with make_store([TableSpec(name="user", dim=2), TableSpec(name="item", dim=2)]) as store:
        ids = np.arange(1, 65, dtype=np.uint64)
        rows = np.repeat(ids.astype(np.float32)[:, None], 2, axis=1)
        state = np.zeros(len(ids), np.float32)
        store.push_many({"user": (ids, rows, state), "item": (ids, rows, state)})
        for one in ids[:16]:
            got = store.pull_many({"user": np.array([one]), "item": ids}, count=False)
            assert got["user"].rows[0, 0] == float(one)
            np.testing.assert_array_equal(got["item"].rows[:, 0], ids.astype(np.float32))


def check_float16_error_bound(make_store: MakeStore) -> None:
    """float16 storage: relative error <= 2**-11 for normal-range values; state stays float32."""
    with make_store([TableSpec(name="h", dim=16, dtype="float16")]) as store:
        ids = np.arange(500, dtype=np.uint64)
        rows, state = _rows(500, 16, 5)
        store.push("h", ids, rows, state)
        got = store.pull("h", ids, count=False)
        big = np.abs(rows) > 1e-3
        rel = np.abs(got.rows[big] - rows[big]) / np.abs(rows[big])
        assert rel.max() <= 2.0**-11 + 1e-7, rel.max()
        np.testing.assert_array_equal(got.state, state)


def check_delete(make_store: MakeStore) -> None:
    """delete returns how many rows existed; deleted ids read as not admitted."""
    with make_store([TableSpec(name="t", dim=2)]) as store:
        ids = np.arange(10, dtype=np.uint64)
        store.push("t", ids, *_rows(10, 2))
        assert store.delete("t", np.arange(5, 15, dtype=np.uint64)) == 5
        got = store.pull("t", ids, count=False)
        assert got.admitted.tolist() == [True] * 5 + [False] * 5


def check_empty_batch(make_store: MakeStore) -> None:
    """Zero ids is a valid batch with correctly shaped, empty results."""
    with make_store([TableSpec(name="t", dim=4)]) as store:
        none = np.zeros(0, np.uint64)
        store.push("t", none, np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
        got = store.pull("t", none)
        assert got.rows.shape == (0, 4) and got.state.shape == (0,) and got.admitted.shape == (0,)


def check_overwrite_last_writer_wins(make_store: MakeStore) -> None:
    """A second push of the same ids replaces whole rows (and state)."""
    with make_store([TableSpec(name="t", dim=3)]) as store:
        ids = np.arange(20, dtype=np.uint64)
        store.push("t", ids, *_rows(20, 3, 1))
        rows2, state2 = _rows(20, 3, 2)
        store.push("t", ids, rows2, state2)
        got = store.pull("t", ids, count=False)
        np.testing.assert_array_equal(got.rows, rows2)
        np.testing.assert_array_equal(got.state, state2)


def check_stats_and_errors(make_store: MakeStore) -> None:
    """stats() reports the backend; bad shapes and unknown tables are ValueError / UnknownTableError."""
    from kelp.store.base import UnknownTableError

    with make_store([TableSpec(name="t", dim=3)]) as store:
        store.push("t", np.arange(4, dtype=np.uint64), *_rows(4, 3))
        stats = store.stats()
        assert stats.backend and set(stats.rows) == {"t"}
        assert stats.rows["t"] in (None, 4)
        for bad in (
            lambda: store.push("t", np.arange(4, dtype=np.uint64), np.zeros((4, 2), np.float32), np.zeros(4)),
            lambda: store.pull("t", np.array([-1])),
        ):
            try:
                bad()
            except ValueError:
                pass
            else:
                raise AssertionError("expected ValueError")
        try:
            store.pull("nope", np.arange(2, dtype=np.uint64))
        except UnknownTableError:
            pass
        else:
            raise AssertionError("expected UnknownTableError")


def check_updated_s(make_store: MakeStore) -> None:
    """``updated_s``: each stored row's last update (unix s, for serving freshness); 0 where none."""
    import time

    with make_store([TableSpec(name="t", dim=2)]) as store:
        ids = np.arange(10, dtype=np.uint64)
        before = int(time.time())
        store.push("t", ids[:6], *_rows(6, 2))
        after = int(time.time())
        got = store.pull("t", ids, count=False)
        assert got.updated_s is not None, "backends must report updated_s"
        assert got.updated_s.dtype == np.uint32 and got.updated_s.shape == (10,)
        stored = got.updated_s[:6].astype(np.int64)
        assert ((stored >= before - 1) & (stored <= after + 1)).all(), (before, after, stored)
        assert (got.updated_s[6:] == 0).all()
        again = store.pull("t", ids, count=False)  # a cache in front of the store must keep the times
        np.testing.assert_array_equal(again.updated_s, got.updated_s)


def _quarantined(store: EmbeddingStore, table: str, reason: str) -> float:
    metrics = getattr(store, "metrics", None)
    return (
        0.0 if metrics is None else metrics.rows_quarantined.labels(table=table, reason=reason)._value.get()
    )


def check_nonfinite_rows_are_quarantined(make_store: MakeStore) -> None:
    """Rows holding NaN or infinity never come back from a pull and are never written.

    A push writes its finite rows and refuses the others (``nonfinite_push``). A
    non-finite row already stored (planted past that guard, as another writer
    could) is quarantined (``nonfinite``): serving reads the default row, not
    admitted; training reads the id's init row with ``initial_state``, admitted,
    and the push that follows overwrites the stored value. The other rows of the
    batch are untouched.
    """
    spec = TableSpec(name="t", dim=4, init={"kind": "normal", "std": 0.1, "seed": 3})
    with make_store([spec]) as store:
        ids = np.array([1, 2, 3, 4], np.uint64)
        rows, state = _rows(4, 4, seed=4)
        rows[1, 2] = np.nan
        state[3] = np.inf
        good = np.array([True, False, True, False])
        store.push("t", ids, rows, state)
        serving = store.pull("t", ids, count=False)
        assert serving.admitted.tolist() == good.tolist()
        np.testing.assert_array_equal(serving.rows[good], rows[good])
        assert np.isfinite(serving.rows).all() and np.isfinite(serving.state).all()
        if not isinstance(store, FlowStore):  # the rest plants rows through the flow's primitives
            return
        assert _quarantined(store, "t", "nonfinite_push") == 2.0
        store._write_rows({"t": RowWrite(ids, rows, state, create=True)}, store._clock())
        serving = store.pull("t", ids, count=False)
        assert serving.admitted.tolist() == good.tolist()
        np.testing.assert_array_equal(serving.rows[good], rows[good])
        np.testing.assert_array_equal(serving.rows[~good], store.table("t").default_rows(ids[~good]))
        assert _quarantined(store, "t", "nonfinite") == 2.0
        training = store.pull("t", ids)
        assert training.admitted.all() and np.isfinite(training.rows).all()
        np.testing.assert_array_equal(training.rows[good], rows[good])
        np.testing.assert_allclose(training.rows[~good], init_rows(spec.init, "t", ids[~good], 4))
        np.testing.assert_array_equal(training.state[~good], np.zeros(2, np.float32))
        np.testing.assert_array_equal(training.state[good], state[good])
        assert _quarantined(store, "t", "nonfinite") == 4.0
        store.push("t", ids, training.rows + 1, training.state)  # heals the store
        healed = store.pull("t", ids, count=False)
        assert healed.admitted.all()
        np.testing.assert_allclose(healed.rows, training.rows + 1)
        assert _quarantined(store, "t", "nonfinite") == 4.0


def _row_ops(store: EmbeddingStore) -> dict[str, float]:
    metrics = getattr(store, "metrics", None)
    if metrics is None:
        return {}
    return {op: metrics.backend_row_ops.labels(op=op)._value.get() for op in ("read", "count", "write")}


def check_backend_row_ops_count_the_rows_moved(make_store: MakeStore) -> None:
    """``kelp_store_backend_row_ops_total`` counts each row the backend reads, counts and writes once.

    Two pulls of ids new to the store (min_count=2) read and count them twice
    and store their init rows on the second; a push writes them once more (a
    hot tier in front writes it back when made durable).
    """
    spec = TableSpec(name="t", dim=2, admission={"min_count": 2})
    with make_store([spec]) as store:
        if not _row_ops(store):
            return  # a store without Kelp's metrics has nothing to count
        ids = np.arange(5, dtype=np.uint64)
        assert not store.pull("t", ids).admitted.any()
        assert store.pull("t", ids).admitted.all()
        store.push("t", ids, *_rows(5, 2))
        store.durable_through(force=True)
        assert _row_ops(store) == {"read": 10.0, "count": 10.0, "write": 10.0}


def _assert_same_read(got: ReadRows, want: ReadRows) -> None:
    """The same per table (a backend may order the tables in its flat arrays as it reads them)."""
    assert sorted(got.tables) == sorted(want.tables) and got.bounds[-1] == want.bounds[-1]
    assert (got.updated_s is None) == (want.updated_s is None)
    for table in want.tables:
        np.testing.assert_array_equal(got.rows[table], want.rows[table], err_msg=table)
        np.testing.assert_array_equal(got.admitted[got.span(table)], want.admitted[want.span(table)])
        if want.updated_s is not None and got.updated_s is not None:
            np.testing.assert_array_equal(got.updated_s[got.span(table)], want.updated_s[want.span(table)])


def check_read_many_is_a_serving_pull(make_store: MakeStore) -> None:
    """``read_many`` answers exactly what ``pull_many(count=False)`` does, flat: stored rows, the
    default row (zeros or init) where none is stored, quarantined values not admitted, across tables
    of several widths and dtypes, and never counts or admits."""
    specs = [
        TableSpec(name="a", dim=3, admission={"min_count": 2}),
        TableSpec(name="b", dim=5, dtype="float16"),
        TableSpec(name="c", dim=3, default_row="init", admission={"min_count": 2}),
        TableSpec(name="d", dim=3),
    ]
    with make_store(specs) as store:
        ids = np.arange(1, 41, dtype=np.uint64)
        stored = ids[::2]
        for name, dim in (("a", 3), ("b", 5), ("c", 3)):
            store.pull(name, stored)
            store.pull(name, stored)  # admitted where admission counts
            store.push(name, stored, *_rows(len(stored), dim, seed=dim))
        asked = {"a": ids, "b": ids[::-1].copy(), "c": ids[5:], "d": np.zeros(0, np.uint64)}
        want = ReadRows.of(store.pull_many(asked, count=False))
        got = store.read_many(asked)
        _assert_same_read(got, want)
        assert got.admitted.sum() == 20 + 20 + 17
        for _ in range(3):
            store.read_many(asked)
        assert not store.pull("a", ids[1::2], count=False).admitted.any()  # no sightings were counted
        assert not store.pull("a", ids[1::2]).admitted.any()  # the first counted sighting
        if isinstance(store, FlowStore):  # a stored value that is no valid row: quarantined alike
            rows, state = _rows(2, 3, seed=9)
            rows[0, 0] = np.nan
            store._write_rows({"d": RowWrite(ids[:2], rows, state, create=True)}, store._clock())
            asked = {"d": ids[:4], "a": ids[:4]}
            _assert_same_read(store.read_many(asked), ReadRows.of(store.pull_many(asked, count=False)))
            expected = [False, True, False, False, True, False, True, False]
            assert store.read_many(asked).admitted.tolist() == expected
            assert _quarantined(store, "d", "nonfinite") == 3.0  # one bad row, read three times


ALL_CHECKS: list[Callable[[MakeStore], None]] = [
    check_push_then_pull_roundtrip,
    check_push_tickets_rise_and_become_durable,
    check_large_ids_and_batches,
    check_admission_off_reads_init_row,
    check_admission_min_count,
    check_admission_counts_occurrences,
    check_admitted_now_marks_the_admitting_pull,
    check_fallback_table_is_a_table,
    check_count_false_never_counts,
    check_default_row_init,
    check_probability_admission,
    check_multi_table,
    check_one_id_table_first,
    check_read_many_is_a_serving_pull,
    check_float16_error_bound,
    check_delete,
    check_empty_batch,
    check_overwrite_last_writer_wins,
    check_stats_and_errors,
    check_updated_s,
    check_nonfinite_rows_are_quarantined,
    check_backend_row_ops_count_the_rows_moved,
]
