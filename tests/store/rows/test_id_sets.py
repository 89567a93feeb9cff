"""id_sets equal numpy's isin / intersect1d on sorted, unsorted, empty and 64-bit id arrays."""

from __future__ import annotations

import numpy as np
import pytest

from kelp.store.rows.id_sets import member, shared


def _cases() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    out = []
    for n, m in [(0, 4), (4, 0), (1, 1), (50, 3), (1700, 1700), (3000, 900)]:
        ids = np.unique(rng.integers(0, 4000, n)).astype(np.uint64)
        other = rng.permutation(np.unique(rng.integers(0, 4000, m))).astype(np.uint64)
        out += [(ids, other), (ids, np.sort(other))]
    big = np.unique(rng.integers(0, 2**64 - 1, 500, dtype=np.uint64))
    out.append((big, rng.permutation(np.r_[big[::3], np.uint64(2**64 - 1)])))
    return out


@pytest.mark.parametrize("ids, other", _cases())
def test_shared_pairs_the_same_positions_as_intersect1d(ids: np.ndarray, other: np.ndarray) -> None:
    at_ids, at_other = shared(ids, other)
    _, want_ids, want_other = np.intersect1d(ids, other, assume_unique=True, return_indices=True)
    assert sorted(zip(at_ids.tolist(), at_other.tolist(), strict=True)) == sorted(
        zip(want_ids.tolist(), want_other.tolist(), strict=True)
    )
    assert (ids[at_ids] == other[at_other]).all()


@pytest.mark.parametrize("ids, other", _cases())
def test_member_is_isin_also_for_repeated_ids(ids: np.ndarray, other: np.ndarray) -> None:
    repeated = np.r_[ids, ids[: len(ids) // 2]]
    assert member(repeated, other).tolist() == np.isin(repeated, other).tolist()
    assert member(repeated, np.r_[other, other]).tolist() == np.isin(repeated, other).tolist()
