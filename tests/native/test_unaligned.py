"""Ids decoded from the middle of a message are often not 8-byte aligned: every native entry point
takes them (a copy where needed) and answers as for aligned ids."""

from __future__ import annotations

import numpy as np

from kelp.consumers.batch import dedup_many
from kelp.store.rows.hashing import rendezvous, splitmix64
from kelp.store.rows.index import IdIndex


def _unaligned(values: np.ndarray) -> np.ndarray:
    raw = b"\x00" + np.ascontiguousarray(values, dtype=np.uint64).tobytes()
    out = np.frombuffer(raw, dtype=np.uint64, count=len(values), offset=1)
    assert not out.flags.aligned
    return out


def test_unaligned_ids_are_deduplicated_hashed_and_indexed_as_aligned_ones() -> None:
    ids = np.array([5, 9, 5, 2**63 + 7, 9, 1], dtype=np.uint64)
    odd = _unaligned(ids)
    (got_u, got_i), (want_u, want_i) = dedup_many([odd])[0], np.unique(ids, return_inverse=True)
    np.testing.assert_array_equal(got_u, want_u)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(splitmix64(odd), splitmix64(ids))
    seeds = np.array([3, 11, 17], dtype=np.uint64)
    np.testing.assert_array_equal(rendezvous(odd, seeds), rendezvous(ids, seeds))
    index = IdIndex()
    index.insert(_unaligned(want_u), np.arange(len(want_u)))
    np.testing.assert_array_equal(index.lookup(odd), want_i)
    np.testing.assert_array_equal(index.delete(_unaligned(want_u[:1])), [0])
