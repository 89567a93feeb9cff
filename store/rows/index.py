"""A vectorized open-addressing hash map from uint64 id to int64 slot.

The memory backend and the hot-row cache look up thousands of ids per call; a
Python dict would cost one interpreter round per id. Here every operation works
on whole arrays: linear probing advances all unresolved ids one step per numpy
round, and the load factor stays below 1/2 so a lookup needs few rounds.

Optional *tags* (0..253, one per id) make the key the pair (tag, id), so one
index can hold the ids of several tables (the hot tier looks up all 26 tables
of a step in one call). The tag lives in the slot's state byte (full = 2 + tag),
so untagged use costs nothing extra.

>>> index = IdIndex()
>>> index.insert(np.array([7, 42], np.uint64), np.array([0, 1]))
>>> index.lookup(np.array([42, 5, 7], np.uint64)).tolist()
[1, -1, 0]
>>> tagged = IdIndex()
>>> tagged.insert(np.array([7, 7], np.uint64), np.array([0, 1]), tags=np.array([0, 3]))
>>> tagged.lookup(np.array([7, 7, 7], np.uint64), tags=np.array([3, 0, 1])).tolist()
[1, 0, -1]
"""

from __future__ import annotations

import numpy as np

from kelp.store.rows.hashing import splitmix64

__all__ = ["IdIndex"]

_EMPTY, _TOMB, _FULL = 0, 1, 2  # a full slot's state is _FULL + its tag
MAX_TAG = 253
_TAG_MIX = np.uint64(0xD6E8FEB86659FD93)


def _full_state(n: int, tags: np.ndarray | None) -> np.ndarray | int:
    if tags is None:
        return _FULL
    tags = np.asarray(tags)
    if len(tags) != n:
        raise ValueError(f"{len(tags)} tags for {n} ids")
    if len(tags) and (tags.min() < 0 or tags.max() > MAX_TAG):
        raise ValueError(f"tags must be in [0, {MAX_TAG}]")
    return (tags + _FULL).astype(np.uint8)


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

    def _start(self, ids: np.ndarray, full: np.ndarray | int) -> np.ndarray:
        """intp[n] home position of each uint64 id (intp: numpy indexes with it without converting)."""
        if isinstance(full, np.ndarray):  # tag 0 starts where an untagged id does
            with np.errstate(over="ignore"):
                ids = ids ^ ((full.astype(np.uint64) - np.uint64(_FULL)) * _TAG_MIX)
        return (splitmix64(ids) & self._mask).astype(np.intp)

    def _probe(self, ids: np.ndarray, full: np.ndarray | int = _FULL) -> np.ndarray:
        """Table position of each id, or -1 (ids must be uint64; ``full``: their full-slot states).

        The first round covers every id without an index array (most ids resolve
        there at load factor < 1/2); later rounds carry only the unresolved ones.
        """
        keys, state, mask = self._keys, self._state, int(self._mask)
        tagged = isinstance(full, np.ndarray)
        pos = self._start(ids, full)
        st = state[pos]
        hit = (keys[pos] == ids) & (st == full)
        out = np.where(hit, pos, -1)
        todo = np.flatnonzero(~hit & (st != _EMPTY))
        p = pos[todo]
        while len(todo):
            p = (p + 1) & mask
            st = state[p]
            hit = (st == (full[todo] if tagged else full)) & (keys[p] == ids[todo])  # type: ignore[index]
            out[todo[hit]] = p[hit]
            cont = ~hit & (st != _EMPTY)
            todo, p = todo[cont], p[cont]
        return out

    def lookup(self, ids: np.ndarray, tags: np.ndarray | None = None) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.uint64)
        where = self._probe(ids, _full_state(len(ids), tags))
        return np.where(where >= 0, self._vals[where], -1)

    def insert(self, ids: np.ndarray, vals: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Insert unique ids (or (tag, id) pairs) that are *not* present (callers look up first)."""
        ids = np.asarray(ids, dtype=np.uint64)
        if len(ids) == 0:
            return
        full = _full_state(len(ids), tags)
        if (self._used + len(ids)) * 2 > len(self._keys):
            self._grow(self.size + len(ids))
        vals = np.asarray(vals, dtype=np.int64)
        mask = int(self._mask)
        pos = self._start(ids, full)
        todo = np.arange(len(ids))
        while len(todo):
            p = pos[todo]
            free = self._state[p] < _FULL
            # Several pending ids may want the same free position: one of them wins. A free slot's
            # value is unused, so each candidate writes its own index there and the one that
            # reads itself back won (a scatter, not a sort: an np.unique of the candidates was a
            # large share of the hot tier's inserts).
            cand, at = todo[free], p[free]
            self._vals[at] = cand
            won = self._vals[at] == cand
            winners, slots = cand[won], at[won]
            self._used += int(np.count_nonzero(self._state[slots] == _EMPTY))
            self._keys[slots] = ids[winners]
            self._vals[slots] = vals[winners]
            self._state[slots] = full[winners] if isinstance(full, np.ndarray) else full
            placed = np.zeros(len(ids), dtype=bool)
            placed[winners] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & mask
        self.size += len(ids)

    def delete(self, ids: np.ndarray, tags: np.ndarray | None = None) -> np.ndarray:
        """Remove ids; returns the int64 slots they had (-1 where absent)."""
        ids = np.asarray(ids, dtype=np.uint64)
        where = self._probe(ids, _full_state(len(ids), tags))
        found = where >= 0
        out = np.full(len(ids), -1, dtype=np.int64)
        out[found] = self._vals[where[found]]
        self._state[where[found]] = _TOMB
        self.size -= int(found.sum())
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        full = self._state >= _FULL
        return self._keys[full].copy(), self._vals[full].copy()

    def _grow(self, need: int) -> None:
        """Rehash (dropping tombstones) into a table where ``need`` entries fill at most a third.

        A third, not a half: the rehash also clears the tombstones that removals
        leave, and a table rebuilt exactly at half load would be rebuilt again on
        the next insert. The hot tier removes ~10k rows and inserts as many per
        step at a steady 1M; at half load it rehashed 1M entries every step.
        """
        full = self._state >= _FULL
        keys, vals, states = self._keys[full], self._vals[full], self._state[full]
        size = len(self._keys)
        while need * 3 > size:
            size *= 2
        self._alloc(size)
        self.size = 0
        self.insert(keys, vals, tags=states.astype(np.int64) - _FULL)
