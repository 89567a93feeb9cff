"""Which rows this rank has written since it started: a Bloom filter, so "no" is certain.

A row owner (:mod:`kelp.daemon.row_owners`) steps rows that only other ranks
trained. If it never wrote such a row in this process, the row in the store
is what it was before the group started (nobody else writes it), so the
sending rank's own pulled copy is the exact base and the owner needs no read
of the store. If it may have written the row, its write may not have reached
the store before the sender read it, so the owner reads the row itself.

A Bloom filter answers "maybe" for some rows never written (a read that was
not needed: safe) and never "no" for a row that was written (that would lose
an update). It only fills up: it is sized for tens of millions of rows, and
past that more rows get the read, which costs time but never correctness.

>>> seen = WrittenRows(bits=1 << 16)
>>> seen.add("t", np.array([1, 2], np.uint64))
>>> seen.maybe("t", np.array([1, 2, 3], np.uint64)).tolist()
[True, True, False]
"""

from __future__ import annotations

import numpy as np

from kelp.store.rows.hashing import name_seed, splitmix64

__all__ = ["WrittenRows"]

_PROBES = 4
_DEFAULT_BITS = 1 << 27  # 16 MiB: under 1% false "maybe" at 10M rows written


class WrittenRows:
    """A Bloom filter over (table, id) pairs; ``bits`` must be a power of two."""

    def __init__(self, bits: int = _DEFAULT_BITS) -> None:
        if bits & (bits - 1) or bits < 64:
            raise ValueError(f"bits must be a power of two >= 64, got {bits}")
        self._bits = np.zeros(bits // 8, dtype=np.uint8)
        self._mask = np.uint64(bits - 1)
        self._seeds: dict[str, np.uint64] = {}

    def _positions(self, table: str, ids: np.ndarray) -> np.ndarray:
        """int64[n, probes]: each id's bit positions (double hashing of one 64-bit mix)."""
        seed = self._seeds.get(table)
        if seed is None:
            seed = self._seeds[table] = name_seed("written-rows", table)
        mixed = splitmix64(np.asarray(ids, dtype=np.uint64) ^ seed)
        low, high = mixed & np.uint64(0xFFFFFFFF), (mixed >> np.uint64(32)) | np.uint64(1)
        with np.errstate(over="ignore"):
            probes = low[:, None] + np.arange(_PROBES, dtype=np.uint64)[None, :] * high[:, None]
        return (probes & self._mask).astype(np.int64)

    def add(self, table: str, ids: np.ndarray) -> None:
        """Remember that this rank wrote these rows of ``table``."""
        if not len(ids):
            return
        at = self._positions(table, ids).ravel()
        byte, bit = at >> 3, at & 7
        for b in range(8):  # one constant per pass, so repeated bytes need no np.bitwise_or.at
            where = byte[bit == b]
            self._bits[where] |= np.uint8(1 << b)

    def maybe(self, table: str, ids: np.ndarray) -> np.ndarray:
        """bool per id: True when this rank may have written its row (False is certain)."""
        if not len(ids):
            return np.zeros(0, dtype=bool)
        at = self._positions(table, ids)
        hit = (self._bits[at >> 3] >> (at & 7).astype(np.uint8)) & 1
        return hit.all(axis=1)
