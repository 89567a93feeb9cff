"""MicroBatch layout and per-table dedup (property-based)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kelp.config import FeatureSpec, SparseFeature
from kelp.consumers.batch import JaggedIds, MicroBatch, dedup_ids, dedup_many

ids_lists = st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=300)


@given(ids_lists)
def test_dedup_reconstructs_ids(ids: list[int]) -> None:
    arr = np.array(ids, dtype=np.uint64)
    unique, inverse = dedup_ids(arr)
    assert unique.dtype == np.uint64 and inverse.dtype == np.int64
    np.testing.assert_array_equal(unique[inverse], arr)
    assert len(set(unique.tolist())) == unique.size == len(set(ids))
    assert (np.diff(unique.astype(object)) > 0).all() if unique.size > 1 else True


# Ids that defeat the packed sort keys: same high bits, different low bits (the argsort fallback),
# small ints (the exact shifted keys), and full-range ones, mixed within and across columns.
id_values = st.one_of(
    st.integers(0, 2**64 - 1),
    st.integers(0, 300),
    st.integers(0, 2**12 - 1).map(lambda low: (0xDEADBEEF << 32) | low),
)


@given(st.lists(st.lists(id_values, max_size=40), max_size=8), st.integers(1, 40))
def test_dedup_many_equals_unique_per_column(columns: list[list[int]], width: int) -> None:
    # Half the columns share one length so that they are sorted together as rows of one array.
    arrays = [np.array(c, dtype=np.uint64) for c in columns]
    arrays += [np.resize(np.array(c or [0], dtype=np.uint64), width) for c in columns]
    results = dedup_many(arrays)
    assert len(results) == len(arrays)
    for ids, (unique, inverse) in zip(arrays, results, strict=True):
        want_unique, want_inverse = np.unique(ids, return_inverse=True)
        assert unique.dtype == np.uint64 and inverse.dtype == np.int64
        np.testing.assert_array_equal(unique, want_unique)
        np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))


@given(st.lists(st.lists(st.integers(0, 50), max_size=4), min_size=1, max_size=30), ids_lists)
def test_shared_table_inverse_covers_features_in_order(multi: list[list[int]], one: list[int]) -> None:
    b = len(multi)
    one = (one + [7] * b)[:b]
    spec = FeatureSpec(
        sparse=[SparseFeature(name="a", table="t"), SparseFeature(name="b", table="t", max_ids=4)]
    )
    lengths = np.array([len(x) for x in multi])
    batch = MicroBatch.from_columns(
        spec,
        labels=np.zeros(b),
        dense=np.zeros((b, 0)),
        sparse={
            "a": np.array(one, dtype=np.uint64),
            "b": JaggedIds.from_lengths(np.array([i for x in multi for i in x], dtype=np.uint64), lengths),
        },
    )
    t = batch.tables["t"]
    assert batch.tables is batch.tables  # cached
    for name in ("a", "b"):
        np.testing.assert_array_equal(
            t.unique_ids[t.inverse[t.feature_slices[name]]], batch.sparse[name].values
        )
    np.testing.assert_array_equal(batch.sparse["b"].lengths(), lengths)


def test_concat_keeps_rows_and_sources() -> None:
    from kelp.bench.synth import CriteoSynth

    synth = CriteoSynth(seed=1)
    a, b = synth.microbatch(5), synth.microbatch(7)
    c = MicroBatch.concat([a, b])
    assert c.size == 12
    np.testing.assert_array_equal(c.sparse["C3"].values[5:], b.sparse["C3"].values)
    assert c.sparse["C3"].offsets[-1] == 12
