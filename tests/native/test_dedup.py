"""kelp_native.dedup_columns behind dedup_ids / dedup_many: exactly np.unique(..., return_inverse=True).

Random columns of batch sizes with few or many repeats, ids that share their high
or their low bits, that cluster or have a far outlier, the extremes 0 and
2**64-1, empty and one-id columns, columns of different lengths in one call, the
inputs callers may pass (lists, other dtypes, strided views), and bad buffers to
the native function.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kelp_native import dedup_columns

from kelp.consumers.batch import dedup_ids, dedup_many

U64_MAX = 2**64 - 1


def _check(columns: list[np.ndarray], results: list[tuple[np.ndarray, np.ndarray]]) -> None:
    assert len(results) == len(columns)
    for ids, (unique, inverse) in zip(columns, results, strict=True):
        want_unique, want_inverse = np.unique(np.asarray(ids, dtype=np.uint64).ravel(), return_inverse=True)
        assert unique.dtype == np.uint64 and inverse.dtype == np.int64
        np.testing.assert_array_equal(unique, want_unique)
        np.testing.assert_array_equal(inverse, want_inverse)


def _columns(rng: np.random.Generator, b: int) -> list[np.ndarray]:
    hashed = rng.integers(0, U64_MAX, size=b, dtype=np.uint64, endpoint=True)
    hashed[: min(b, 2)] = [0, U64_MAX][: min(b, 2)]
    return [
        hashed,
        np.concatenate([np.arange(b - 1, dtype=np.uint64)[::-1], [np.uint64(U64_MAX)]]),  # one far outlier
        (rng.integers(0, 256, size=b).astype(np.uint64) << np.uint64(32))
        | rng.integers(0, 8, size=b).astype(np.uint64),  # clusters of a few
        rng.integers(0, 2**20, size=b).astype(np.uint64),
        rng.integers(0, 30, size=b).astype(np.uint64),  # few distinct
        hashed[rng.integers(0, max(1, b // 4), size=b)],  # repeats of hashed ids
        (rng.integers(0, 64, size=b).astype(np.uint64) << np.uint64(58)),  # only the high bits differ
        np.uint64(0xDEADBEEF << 32) | rng.integers(0, 4096, size=b).astype(np.uint64),
        np.resize(np.array([0, U64_MAX], np.uint64), b),
        np.full(b, 7, np.uint64),
    ]


@pytest.mark.parametrize("b", [1, 2, 17, 4096])
def test_batch_sized_columns_match_np_unique(b: int) -> None:
    rng = np.random.default_rng(b)
    columns = _columns(rng, b) * 4
    _check(columns, dedup_many(columns))
    for col in columns[:7]:
        _check([col], [dedup_ids(col)])


def test_columns_of_different_lengths_in_one_call() -> None:
    rng = np.random.default_rng(8)
    columns = [
        rng.integers(0, 50, size=n).astype(np.uint64) for n in (0, 5, 4096, 0, 1, 9000, 3, 4096, 100_000)
    ]
    results = dedup_many(columns)
    _check(columns, results)
    # The unique ids are views into one array (as are the inverses).
    bases = {id(u.base) for u, _ in results if u.base is not None}
    assert len(bases) == 1


def test_empty_and_no_columns() -> None:
    assert dedup_many([]) == []
    unique, inverse = dedup_ids(np.empty(0, np.uint64))
    assert unique.shape == inverse.shape == (0,)
    assert unique.dtype == np.uint64 and inverse.dtype == np.int64


def test_the_micro_batch_example() -> None:
    unique, inverse = dedup_ids(np.array([7, 9, 7, 7, 5, 9, 9, 4], np.uint64))
    assert unique.tolist() == [4, 5, 7, 9]
    assert inverse.tolist() == [2, 3, 2, 2, 1, 3, 3, 0]


def test_converted_inputs() -> None:
    rng = np.random.default_rng(2)
    base = rng.integers(0, 100, size=600).astype(np.uint64)
    columns: list[np.ndarray] = [
        base[::3],
        base[::-1],
        base.astype(np.int64) - 50,  # negatives wrap, as numpy's conversion to uint64 does
        base.astype(np.uint16),
        base.tolist(),  # type: ignore[list-item]
        base.reshape(20, 30)[:, 4],
    ]
    _check(columns, dedup_many(columns))
    _check([base.reshape(20, 30)], [dedup_ids(base.reshape(20, 30))])


@given(
    st.lists(
        st.lists(
            st.one_of(
                st.integers(0, U64_MAX),
                st.integers(0, 40),
                st.integers(0, 63).map(lambda j: j << 58),
                st.sampled_from([0, U64_MAX]),
            ),
            max_size=60,
        ),
        max_size=8,
    )
)
def test_any_columns_match_np_unique(columns: list[list[int]]) -> None:
    arrays = [np.array(c, dtype=np.uint64) for c in columns]
    _check(arrays, dedup_many(arrays))


def test_the_native_function_refuses_bad_buffers() -> None:
    col = np.arange(6, dtype=np.uint64)
    u, inv = np.empty(6, np.uint64), np.empty(6, np.int64)
    ro = np.empty(6, np.int64)
    ro.flags.writeable = False
    both = np.empty(12, np.uint64)
    for columns, uniques, inverse in [
        ([col.astype(np.int64)], u, inv),
        ([np.arange(12, dtype=np.uint64)[::2]], u, inv),
        ([list(range(6))], u, inv),
        ([col], np.empty(5, np.uint64), inv),
        ([col], u, np.empty(7, np.int64)),
        ([col], u.view(np.int64), inv),
        ([col], u, inv.astype(np.int32)),
        ([col], u, ro),
        ([col], col, inv),
        ([col], u, col.view(np.int64)),
        ([col], both[:6], both[3:9].view(np.int64)),
    ]:
        with pytest.raises(ValueError, match="dedup_columns"):
            dedup_columns(columns, uniques, inverse)
    with pytest.raises(ValueError, match="dedup_columns"):
        dedup_columns(col, u, inv)  # one array: its items are no columns
