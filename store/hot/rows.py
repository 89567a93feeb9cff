"""The hot tier's rows of every table of one width, in one tagged table: one numpy call per step, not 26.

A training step touches every table (26 on criteo-synth), ~1,700 ids each. With
one :class:`~kelp.store.rows.slots.SlotTable` per table, each verb of the hot tier
(:mod:`kelp.store.hot.tier`) cost ~26 rounds of a dozen small numpy calls,
and the per-call overhead, not the work, dominated: under the GIL it cost the
step more CPU than Redis took to serve the rows the tier saved
(docs/performance.md). Here the
tables of one width share one table keyed by (table tag, id)
(:class:`~kelp.store.rows.index.IdIndex` with tags), one count-min sketch and one
set of columns, so a step's lookup, gather, write and dirty scan are each one
call over all its ids::

    ids_by_table  {C1: [..1.7k..], C2: [...], ...}
        │ concat (table order)                     tags  [0 0 0 ... 1 1 1 ... 25 25]
        ▼                                          bounds [0, 1.7k, 3.4k, ..., 45k]
    RowBatch.ids [....................45k....................]
        │ one lookup (tag, id) -> slot, one gather of rows / state / updated_s
        ▼
    RowBatch.split(rows) -> {C1: rows[0:1.7k], C2: rows[1.7k:3.4k], ...}   (views)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kelp.store.hot.sketch import CountMinSketch
from kelp.store.rows.index import MAX_TAG
from kelp.store.rows.slots import Column, SlotTable

__all__ = ["SKETCH_DEPTH", "HotRows", "RowBatch"]

SKETCH_DEPTH = 4
"""Rows of the tier's count-min sketch: each more makes a false "seen before" rarer, at one more hash."""

_TAG_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class RowBatch:
    """Several tables' arrays of one width, concatenated in table order."""

    names: list[str]
    ids: np.ndarray  # uint64[N]
    tags: np.ndarray  # uint8[N], the table of each id
    bounds: np.ndarray  # int64[k + 1]: table i holds positions bounds[i]:bounds[i + 1]

    def split(self, values: np.ndarray) -> dict[str, np.ndarray]:
        """Per table, its part of ``values`` (views, not copies)."""
        b = self.bounds.tolist()
        return {name: values[b[i] : b[i + 1]] for i, name in enumerate(self.names)}

    def counts(self, mask: np.ndarray) -> list[int]:
        """How many of each table's positions ``mask`` selects."""
        if not len(mask):
            return [0] * len(self.names)
        totals = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        return (totals[self.bounds[1:]] - totals[self.bounds[:-1]]).tolist()


def _values(width: int | None, device: torch.device | None) -> Column:
    """A column of row values: a float32 tensor on ``device`` (the working copy), else numpy."""
    if device is None:
        return Column(np.float32, width=width)
    return Column(torch.float32, width=width, device=device)


class HotRows:
    """The tier's rows of ``names`` (all ``dim`` wide): one tagged SlotTable and one sketch.

    Columns: ``rows``, ``state``, ``loaded`` (tier clock when read from the
    store), ``updated_s`` (unix seconds of the last update), ``dirty``, ``since``
    (the push that dirtied the row first since its last write-back), ``last`` (the
    push that wrote it last: a write-back that ran while a step wrote the row again
    keeps it dirty), ``pins`` (prepared batches that will train the row: it may not
    leave), ``fresh`` (admitted and trained, but its trained value never written:
    due at the next write-back, not at the end of the period).
    """

    def __init__(
        self, names: Sequence[str], dim: int, capacity: int, device: torch.device | None = None
    ) -> None:
        if len(names) > MAX_TAG + 1:
            raise ValueError(f"at most {MAX_TAG + 1} tables of one width in the hot tier, got {len(names)}")
        self.names = list(names)
        self.dim = dim
        self.tag_of = {name: i for i, name in enumerate(self.names)}
        self.table = SlotTable(
            {
                "rows": _values(dim, device),
                "state": _values(None, device),
                "loaded": Column(np.float64),
                "updated_s": Column(np.uint32),
                "dirty": Column(bool),
                "since": Column(np.int64),
                "last": Column(np.int64),
                "pins": Column(np.int32),
                "fresh": Column(bool),
            },
            capacity=min(capacity, 1 << 18),
            tagged=True,
        )
        # Depth 4, not 2: once the sketch fills, a never-seen id often shares both of two cells with
        # other ids, looks seen before and enters the tier on its first sighting; its row then waits
        # for the write-back instead of being written through at once (docs/performance.md).
        self.sketch = CountMinSketch(width=2 * capacity, depth=SKETCH_DEPTH, seed=",".join(self.names))
        self._fresh: list[np.ndarray] = []  # slots written while fresh, since the last take_fresh

    def wrote_fresh(self, slots: np.ndarray) -> None:
        """``slots`` were just written dirty: those that are fresh are due at the next write-back."""
        fresh = slots[self.table["fresh"][slots]]
        if len(fresh):
            self._fresh.append(fresh)

    def take_fresh(self) -> np.ndarray:
        """Slots of the dirty fresh rows written since the last call (each once), without a scan of
        the whole table: a write-back after every step must not cost a pass over a million rows."""
        if not self._fresh:
            return np.zeros(0, dtype=np.int64)
        t = self.table
        slots = _distinct(np.concatenate(self._fresh), t.high)
        self._fresh.clear()
        return slots[t["dirty"][slots] & t["fresh"][slots]]

    def batch(self, arrays: Mapping[str, np.ndarray]) -> RowBatch | None:
        """The ids of this width's tables in ``arrays`` (uint64, checked), or None if there are none."""
        names = [n for n in self.names if n in arrays]
        if not names:
            return None
        parts = [arrays[n] for n in names]
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        tags = np.repeat(np.array([self.tag_of[n] for n in names], dtype=np.uint8), lengths)
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return RowBatch(names, ids, tags, bounds)

    def sketch_keys(self, ids: np.ndarray, tags: np.ndarray) -> np.ndarray:
        """What the sketch counts: ids of different tables kept apart (a collision only adds noise)."""
        with np.errstate(over="ignore"):
            return ids ^ (tags.astype(np.uint64) * _TAG_MIX)

    def lookup(self, batch: RowBatch) -> np.ndarray:
        return self.table.lookup(batch.ids, batch.tags)

    def clean_rows(
        self, sample: int | None = None, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the rows that may leave (clean, and no prepared batch will train them), and their
        estimated frequencies; with ``sample``, of about that many slots drawn at random (``rng``)."""
        t = self.table
        if sample is None or sample >= t.high:
            slots = t.live_slots()
        else:
            assert rng is not None
            slots = _distinct(rng.integers(0, t.high, size=sample), t.high)
            slots = slots[t.live[slots]]
        clean = slots[~t["dirty"][slots] & (t["pins"][slots] == 0)]
        return clean, self.sketch.estimate(self.sketch_keys(t.ids[clean], t.tags[clean]))

    def due(self, cutoff: int) -> np.ndarray:
        """Slots of the dirty rows whose first update since their last write-back is at push ``cutoff`` or
        earlier, and of every dirty ``fresh`` row."""
        t = self.table
        high = t.high
        dirty = t["dirty"][:high]
        return np.flatnonzero(dirty & ((t["since"][:high] <= cutoff) | t["fresh"][:high]))

    def by_table(self, slots: np.ndarray) -> tuple[np.ndarray, dict[str, tuple[int, int]]]:
        """``slots`` sorted by their table (one stable sort of the tags), and each table's range in
        them: a write-back gathers all its rows with one read and hands each table a slice, instead of
        one read per table (26 on criteo-synth, each a round of small calls)."""
        if not len(slots):
            return slots, {}
        tags = self.table.tags[slots]
        order = np.argsort(tags, kind="stable")
        slots, tags = slots[order], tags[order]
        cuts = np.searchsorted(tags, np.arange(len(self.names) + 1)).tolist()
        parts = {name: (cuts[i], cuts[i + 1]) for i, name in enumerate(self.names) if cuts[i + 1] > cuts[i]}
        return slots, parts


def _distinct(slots: np.ndarray, high: int) -> np.ndarray:
    """The distinct values of ``slots`` (each in ``[0, high)``), ascending: a mark per slot, not a
    sort, since a trim's sample and a write-back's fresh slots are a large share of the table."""
    marked = np.zeros(high, dtype=bool)
    marked[slots] = True
    return np.flatnonzero(marked)
