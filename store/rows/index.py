"""A hash map from uint64 id to int64 slot, for whole id arrays at a time.

The memory backend and the hot-row cache look up thousands of ids per call; a
Python dict would cost one interpreter round per id. Here every operation is
one call into Kelp's native extension (``kelp_native.IdMap``, native/src/index.rs):
open addressing with linear probing over a table at most half full, one pass
over the ids with the GIL released, so the trainer's other threads keep running.

Optional *tags* (0..253, one per id) make the key the pair (tag, id), so one
index can hold the ids of several tables (the hot tier looks up all 26 tables
of a step in one call). The tag lives in the entry's state byte, so untagged
use costs nothing extra; an untagged id is the same key as tag 0.

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
from kelp_native import ID_MAP_MAX_TAG, IdMap

from kelp.buffers import native_array

__all__ = ["IdIndex"]

MAX_TAG = ID_MAP_MAX_TAG
"""The largest tag (253): a full entry's state byte is 2 + its tag."""


def _tags(n: int, tags: np.ndarray | None) -> np.ndarray | None:
    """uint8[n] tags for the native map (None stays None: every id tag 0); ValueError if any is out of range.

    uint8 tags go as they are (the native map checks the range); any other dtype
    is checked here first, since casting would wrap a negative or large tag.
    """
    if tags is None:
        return None
    tags = np.asarray(tags)
    if len(tags) != n:
        raise ValueError(f"{len(tags)} tags for {n} ids")
    if tags.dtype != np.uint8:
        if len(tags) and (tags.min() < 0 or tags.max() > MAX_TAG):
            raise ValueError(f"tags must be in [0, {MAX_TAG}]")
        tags = tags.astype(np.uint8)
    return np.ascontiguousarray(tags)


class IdIndex:
    """uint64 id -> int64 slot; ``lookup`` returns -1 for absent ids. Not thread-safe.

    The table starts with room for ``capacity`` ids at most half full and grows
    (rehashing, which also drops the removed ids' tombstones) to keep them at
    most a third full when an insert would pass a half.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._map = IdMap(int(capacity))

    def __len__(self) -> int:
        return len(self._map)

    @property
    def size(self) -> int:
        """How many ids (or (tag, id) pairs) the index holds."""
        return len(self._map)

    def lookup(self, ids: np.ndarray, tags: np.ndarray | None = None) -> np.ndarray:
        """int64[n] slot of each uint64 id (of each (tag, id) pair with ``tags``), -1 where absent."""
        ids = native_array(ids, np.uint64)
        tags = _tags(len(ids), tags)
        out = np.empty(ids.shape, dtype=np.int64)
        self._map.lookup(ids, tags, out)
        return out

    def insert(self, ids: np.ndarray, vals: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Insert unique ids (or (tag, id) pairs) that are *not* present (callers look up first).

        Nothing checks either: an id given twice, or already present, gets one
        more entry, and a lookup then finds the value given last in the call
        (a removal frees that one and uncovers the next).
        """
        ids = native_array(ids, np.uint64)
        if len(ids) == 0:
            return
        tags = _tags(len(ids), tags)
        self._map.insert(ids, native_array(vals, np.int64), tags)

    def delete(self, ids: np.ndarray, tags: np.ndarray | None = None) -> np.ndarray:
        """Remove ids; returns the int64 slots they had (-1 where absent)."""
        ids = native_array(ids, np.uint64)
        tags = _tags(len(ids), tags)
        out = np.empty(ids.shape, dtype=np.int64)
        self._map.delete(ids, tags, out)
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids uint64[k], slots int64[k])`` of every entry, in table order."""
        keys = np.empty(len(self._map), dtype=np.uint64)
        vals = np.empty(len(self._map), dtype=np.int64)
        self._map.items(keys, vals)
        return keys, vals
