"""kelp_native.splitmix64 / rendezvous behind kelp.store.rows.hashing: bit for bit the numpy code.

Shard placement, bucket choice and new rows' init values all derive from these,
so they are checked against the numpy code they replace and against plain Python
integers, on random ids (0 and 2**64-1 included), every shape and layout the
callers pass (2-D, strided, 0-d, lists, other integer dtypes), empty arrays and
bad buffers.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kelp_native import rendezvous as native_rendezvous
from kelp_native import splitmix64 as native_splitmix64

from kelp.store.rows.hashing import rendezvous, splitmix64

U64_MAX = 2**64 - 1
MASK = U64_MAX


def _ref_numpy(x: object) -> np.ndarray:
    """The numpy code splitmix64 ran before."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _ref_python(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _ref_rendezvous(ids: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The numpy code rendezvous ran before."""
    if len(seeds) == 1:
        return np.zeros(len(ids), dtype=np.int64)
    return np.argmax(_ref_numpy(ids[:, None] ^ seeds[None, :]), axis=1).astype(np.int64)


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    ids = rng.integers(0, U64_MAX, size=n, dtype=np.uint64, endpoint=True)
    return np.concatenate([ids, np.array([0, 1, U64_MAX, U64_MAX - 1], np.uint64)])


def test_the_documented_value() -> None:
    assert int(splitmix64(np.array([0], np.uint64))[0]) == 16294208416658607535


@given(st.lists(st.integers(0, U64_MAX), max_size=50))
def test_matches_plain_python_integers(ids: list[int]) -> None:
    got = splitmix64(np.array(ids, dtype=np.uint64))
    assert got.dtype == np.uint64
    assert got.tolist() == [_ref_python(i) for i in ids]


def test_matches_the_numpy_code_in_every_shape_and_layout() -> None:
    rng = np.random.default_rng(1)
    ids = _ids(rng, 20_000)
    grid = ids[:20_000].reshape(200, 100)
    cases = [
        ids,
        ids[::3],
        ids[::-1],
        grid,
        grid.T,
        grid[:, ::7],
        grid[:, None, :5] ^ ids[None, :4, None],  # rendezvous-like broadcast, 3-D
        np.uint64(12345) + np.arange(5, dtype=np.uint64)[:, None],  # initial_rows-like 2-D
        np.empty(0, np.uint64),
        np.empty((3, 0), np.uint64),
    ]
    for x in cases:
        got = splitmix64(x)
        want = _ref_numpy(x)
        assert got.shape == want.shape and got.dtype == np.uint64
        np.testing.assert_array_equal(got, want)
        assert not np.shares_memory(got, x)


def test_converts_what_numpy_converts() -> None:
    assert splitmix64([0, 1, 2]).tolist() == _ref_numpy([0, 1, 2]).tolist()
    signed = np.array([-1, -(2**63), 5], np.int64)
    np.testing.assert_array_equal(splitmix64(signed), _ref_numpy(signed))
    small = np.array([1, 200, 255], np.uint8)
    np.testing.assert_array_equal(splitmix64(small), _ref_numpy(small))
    scalar = splitmix64(np.uint64(7))
    assert isinstance(scalar, np.uint64) and scalar == _ref_numpy(np.uint64(7))
    assert splitmix64(7) == _ref_python(7)


@pytest.mark.parametrize("shards", [2, 3, 5, 8])
def test_rendezvous_matches_the_numpy_code(shards: int) -> None:
    rng = np.random.default_rng(shards)
    ids = _ids(rng, 30_000)
    seeds = rng.integers(0, U64_MAX, size=shards, dtype=np.uint64, endpoint=True)
    got = rendezvous(ids, seeds)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _ref_rendezvous(ids, seeds))
    np.testing.assert_array_equal(rendezvous(ids[::2], seeds[::-1]), _ref_rendezvous(ids[::2], seeds[::-1]))
    assert set(np.unique(got).tolist()) == set(range(shards))


def test_rendezvous_ties_go_to_the_first_shard_as_argmax_does() -> None:
    ids = np.arange(1000, dtype=np.uint64)
    seeds = np.array([9, 9, 4, 4], np.uint64)
    got = rendezvous(ids, seeds)
    np.testing.assert_array_equal(got, _ref_rendezvous(ids, seeds))
    assert set(got.tolist()) == {0, 2}


def test_rendezvous_edge_cases() -> None:
    assert rendezvous(np.empty(0, np.uint64), np.array([1, 2], np.uint64)).shape == (0,)
    assert rendezvous(np.arange(3, dtype=np.uint64), np.array([5], np.uint64)).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="at least one shard seed"):
        rendezvous(np.arange(3, dtype=np.uint64), np.empty(0, np.uint64))


def test_the_native_functions_refuse_bad_buffers() -> None:
    ids = np.arange(6, dtype=np.uint64)
    ro = np.empty(6, np.uint64)
    ro.flags.writeable = False
    for x, out in [
        (ids.astype(np.int64), np.empty(6, np.uint64)),
        (ids[::2], np.empty(3, np.uint64)),
        (list(range(6)), np.empty(6, np.uint64)),
        (ids, np.empty(5, np.uint64)),
        (ids, np.empty(6, np.int64)),
        (ids, ro),
        (ids, ids),
        (ids, np.empty(12, np.uint64)[::2]),
    ]:
        with pytest.raises(ValueError, match="splitmix64"):
            native_splitmix64(x, out)
    seeds = np.array([1, 2], np.uint64)
    for x, s, out in [
        (ids, seeds.astype(np.int64), np.empty(6, np.int64)),
        (ids, seeds, np.empty(6, np.uint64)),
        (ids, seeds, np.empty(7, np.int64)),
        (ids, np.empty(0, np.uint64), np.empty(6, np.int64)),
        (ids, seeds, ids.view(np.int64)),
    ]:
        with pytest.raises(ValueError, match="rendezvous"):
            native_rendezvous(x, s, out)
