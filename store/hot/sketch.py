"""A count-min sketch of id frequencies with periodic halving: what the hot tier calls "hot".

The hot tier (:mod:`kelp.store.hot.tier`) keeps the rows a trainer touches
most. Recency alone (LRU) lets a burst of one-off ids flush rows that are used
in every batch; exact per-id counters would cost memory per id ever seen. A
count-min sketch estimates each id's count in fixed memory (``depth`` rows of
``width`` counters; an estimate never undercounts what was added, and
overcounts by at most ~``e / width`` of the total with high probability), and
halving every counter once ``window`` sightings were added (TinyLFU's "reset")
makes the estimate follow the recent stream rather than all history.

Every operation takes a whole id array and runs in Kelp's native extension
(``kelp_native.sketch_add`` / ``sketch_estimate``, native/src/sketch.rs): one
pass per call over the ids and rows, with the GIL released. The numpy version
(``np.add.at`` per row) held the GIL for ~5.7 ms per 4096-sample training step,
the largest single item of the trainer's feed (docs/performance.md); the
counters stay a numpy array, and the halving stays here.

>>> sk = CountMinSketch(width=1024, depth=2, window=1_000_000)
>>> sk.add(np.array([7, 9], np.uint64), np.array([5, 1]))
>>> sk.estimate(np.array([7, 9, 11], np.uint64)).tolist()
[5, 1, 0]
"""

from __future__ import annotations

import numpy as np
from kelp_native import sketch_add, sketch_estimate

from kelp.store.rows.hashing import name_seed

__all__ = ["CountMinSketch"]


class CountMinSketch:
    """Approximate per-id counts; ``width`` is rounded up to a power of two. Not thread-safe."""

    def __init__(self, width: int, depth: int = 2, window: int | None = None, seed: str = "") -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        size = 64
        while size < width:
            size *= 2
        self.width = size
        self.depth = depth
        self._mask = np.uint64(size - 1)
        self._seeds = [int(name_seed("cms", seed, d)) for d in range(depth)]
        self._counts = np.zeros((depth, size), dtype=np.uint32)
        self.window = window if window is not None else 10 * size
        """Sightings added between two halvings (aging): the sketch follows roughly this many recent ones."""
        self._added = 0
        self.halvings = 0

    def add(self, ids: np.ndarray, counts: np.ndarray | int = 1) -> None:
        """Add ``counts`` sightings (int per id, or one int for all) of uint64 ``ids``."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        if not len(ids):
            return
        inc = np.asarray(counts, dtype=np.uint32)
        if inc.ndim == 0:
            sketch_add(self._counts, ids, int(inc), self._seeds, int(self._mask))
            self._added += int(inc) * len(ids)
        else:
            inc = np.ascontiguousarray(np.broadcast_to(inc, ids.shape))
            sketch_add(self._counts, ids, inc, self._seeds, int(self._mask))
            self._added += int(inc.sum(dtype=np.int64))
        while self._added >= self.window:
            self._counts >>= 1
            self._added -= self.window
            self.halvings += 1

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """uint32[n]: the estimated recent count of each id (the minimum over the rows)."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        out = np.empty(ids.shape, dtype=np.uint32)
        sketch_estimate(self._counts, ids.reshape(-1), self._seeds, int(self._mask), out.reshape(-1))
        return out

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes)
