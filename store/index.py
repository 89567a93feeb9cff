"""A vectorized open-addressing hash map from uint64 id to int64 slot.

The memory backend and the hot-row cache look up thousands of ids per call; a
Python dict would cost one interpreter round per id. Here every operation works
on whole arrays: linear probing advances all unresolved ids one step per numpy
round, and the load factor stays below 1/2 so a lookup needs few rounds.

>>> index = IdIndex()
>>> index.insert(np.array([7, 42], np.uint64), np.array([0, 1]))
>>> index.lookup(np.array([42, 5, 7], np.uint64)).tolist()
[1, -1, 0]
"""

from __future__ import annotations

import numpy as np

from kelp.store.hashing import splitmix64

__all__ = ["IdIndex"]

_EMPTY, _FULL, _TOMB = 0, 1, 2


class IdIndex:
    """uint64 id -> int64 slot; ``lookup`` returns -1 for absent ids. Not thread-safe."""

    def __init__(self, capacity: int = 1024) -> None:
        size = 1
        while size < max(capacity, 8) * 2:
            size *= 2
        self._alloc(size)
        self.size = 0

    def _alloc(self, size: int) -> None:
        self._mask = np.uint64(size - 1)
        self._keys = np.zeros(size, dtype=np.uint64)
        self._vals = np.full(size, -1, dtype=np.int64)
        self._state = np.zeros(size, dtype=np.uint8)
        self._used = 0  # full + tombstones

    def __len__(self) -> int:
        return self.size

    def _start(self, ids: np.ndarray) -> np.ndarray:
        """intp[n] home position of each uint64 id (intp: numpy indexes with it without converting)."""
        return (splitmix64(ids) & self._mask).astype(np.intp)

    def _probe(self, ids: np.ndarray) -> np.ndarray:
        """Table position of each id, or -1 (ids must be uint64).

        The first round covers every id without an index array (most ids resolve
        there at load factor < 1/2); later rounds carry only the unresolved ones.
        """
        keys, state, mask = self._keys, self._state, int(self._mask)
        pos = self._start(ids)
        st = state[pos]
        hit = (keys[pos] == ids) & (st == _FULL)
        out = np.where(hit, pos, -1)
        todo = np.flatnonzero(~hit & (st != _EMPTY))
        p = pos[todo]
        while len(todo):
            p = (p + 1) & mask
            st = state[p]
            hit = (st == _FULL) & (keys[p] == ids[todo])
            out[todo[hit]] = p[hit]
            cont = ~hit & (st != _EMPTY)
            todo, p = todo[cont], p[cont]
        return out

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.uint64)
        where = self._probe(ids)
        return np.where(where >= 0, self._vals[where], -1)

    def insert(self, ids: np.ndarray, vals: np.ndarray) -> None:
        """Insert unique ids that are *not* present (callers look up first)."""
        ids = np.asarray(ids, dtype=np.uint64)
        if len(ids) == 0:
            return
        if (self._used + len(ids)) * 2 > len(self._keys):
            self._grow(self.size + len(ids))
        vals = np.asarray(vals, dtype=np.int64)
        mask = int(self._mask)
        pos = self._start(ids)
        todo = np.arange(len(ids))
        while len(todo):
            p = pos[todo]
            free = self._state[p] != _FULL
            # Several pending ids may want the same free position: the first one wins.
            cand = todo[free]
            uniq, first = np.unique(p[free], return_index=True)
            winners = cand[first]
            self._used += int(np.count_nonzero(self._state[uniq] == _EMPTY))
            self._keys[uniq] = ids[winners]
            self._vals[uniq] = vals[winners]
            self._state[uniq] = _FULL
            placed = np.zeros(len(ids), dtype=bool)
            placed[winners] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & mask
        self.size += len(ids)

    def delete(self, ids: np.ndarray) -> np.ndarray:
        """Remove ids; returns the int64 slots they had (-1 where absent)."""
        ids = np.asarray(ids, dtype=np.uint64)
        where = self._probe(ids)
        found = where >= 0
        out = np.full(len(ids), -1, dtype=np.int64)
        out[found] = self._vals[where[found]]
        self._state[where[found]] = _TOMB
        self.size -= int(found.sum())
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        full = self._state == _FULL
        return self._keys[full].copy(), self._vals[full].copy()

    def _grow(self, need: int) -> None:
        keys, vals = self.items()
        size = len(self._keys)
        while need * 2 > size:
            size *= 2
        self._alloc(size)
        self.size = 0
        self.insert(keys, vals)
