"""Cut decoded chunks into micro-batches, bounded by size or by time.

A batch is emitted when it holds ``batch_size`` samples, or when its oldest
chunk has waited ``max_batch_delay_ms``. A chunk is cut only between records,
so a record's samples never span two batches (its offset belongs to exactly
one batch); a single columnar message bigger than ``batch_size`` is emitted
whole. Ranges of records that produced no samples (all rejected) ride along
with the next batch, or are returned as "handled" ranges when nothing else is
waiting, so their offsets still get committed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kelp.config import FeatureSpec
from kelp.consumers.batch import JaggedIds, MicroBatch, SourceRange, table_features
from kelp.consumers.columns import is_one_id_each
from kelp.consumers.decode import Chunk

__all__ = ["Batcher", "Emitted"]


@dataclass
class Emitted:
    """What :meth:`Batcher.take` returns: a batch (maybe None) and sample-less handled ranges."""

    batch: MicroBatch | None
    handled: list[SourceRange]


class Batcher:
    """Accumulates :class:`Chunk` s and cuts :class:`MicroBatch` es (single-threaded)."""

    def __init__(
        self,
        spec: FeatureSpec,
        batch_size: int,
        max_batch_delay_s: float,
        epoch_of: Callable[[str, int], int] = lambda topic, partition: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.batch_size = batch_size
        self.max_delay_s = max_batch_delay_s
        self.epoch_of = epoch_of
        self.clock = clock
        self._table_features = table_features(spec)
        self._sparse_names = [f.name for f in spec.sparse]
        self._chunks: deque[tuple[Chunk, int, int, float]] = (
            deque()
        )  # chunk, row start, first offset, arrival
        self._rows = 0

    @property
    def rows(self) -> int:
        """Samples waiting."""
        return self._rows

    def __len__(self) -> int:
        return len(self._chunks)

    def add(self, chunk: Chunk) -> None:
        self._chunks.append((chunk, 0, chunk.first_offset, self.clock()))
        self._rows += chunk.size

    def due(self) -> bool:
        """True when a batch should be cut now (size reached or the oldest chunk waited too long)."""
        if not self._chunks:
            return False
        return self._rows >= self.batch_size or self.clock() - self._chunks[0][3] >= self.max_delay_s

    def time_left(self) -> float:
        """Seconds until the oldest waiting chunk is due (for the poll timeout)."""
        if not self._chunks:
            return self.max_delay_s
        return max(0.0, self.max_delay_s - (self.clock() - self._chunks[0][3]))

    def drop_partitions(self, keep: Callable[[str, int], bool]) -> None:
        """Discard waiting chunks of partitions for which ``keep`` is False (revoked before emission)."""
        kept = deque(c for c in self._chunks if keep(c[0].topic, c[0].partition))
        self._chunks = kept
        self._rows = sum(c.size - start for c, start, _, _ in kept)

    def take(self, force: bool = False) -> Emitted | None:
        """Cut one batch if due (or if ``force`` and anything waits); None when nothing to emit."""
        if not self._chunks or not (force or self.due()):
            return None
        pieces: list[tuple[Chunk, int, int]] = []  # chunk, row lo, row hi
        ranges: dict[tuple[str, int], list[int]] = {}
        room = self.batch_size
        while self._chunks and (room > 0 or not pieces):
            chunk, start, first_off, arrived = self._chunks[0]
            avail = chunk.size - start
            if avail <= room:
                hi, last_off = chunk.size, chunk.last_offset
                self._chunks.popleft()
            else:
                # Cut between records: back up to the first row of the record at start + room.
                cut_off = chunk.row_offsets[start + room]
                hi = int(np.searchsorted(chunk.row_offsets, cut_off, side="left"))
                if hi <= start:  # the record at `start` alone is bigger than the room left
                    if pieces:
                        break
                    hi = int(np.searchsorted(chunk.row_offsets, cut_off, side="right"))
                if hi >= chunk.size:
                    last_off = chunk.last_offset
                    self._chunks.popleft()
                else:
                    next_off = int(chunk.row_offsets[hi])
                    last_off = next_off - 1
                    self._chunks[0] = (chunk, hi, next_off, arrived)
            pieces.append((chunk, start, hi))
            key = (chunk.topic, chunk.partition)
            if key in ranges:
                ranges[key][1] = last_off
            else:
                ranges[key] = [first_off, last_off]
            room -= hi - start
            self._rows -= hi - start
        sources = [SourceRange(t, p, lo, hi, self.epoch_of(t, p)) for (t, p), (lo, hi) in ranges.items()]
        if all(hi == lo for _, lo, hi in pieces):
            return Emitted(None, sources)
        return Emitted(self._assemble(pieces, sources), [])

    def _assemble(self, pieces: list[tuple[Chunk, int, int]], sources: list[SourceRange]) -> MicroBatch:
        pieces = [p for p in pieces if p[2] > p[1]]
        labels = np.concatenate([c.labels[lo:hi] for c, lo, hi in pieces])
        dense = np.concatenate([c.dense[lo:hi] for c, lo, hi in pieces])
        ts = np.concatenate([c.ts[lo:hi] for c, lo, hi in pieces])
        sparse: dict[str, JaggedIds] = {}
        for name in self._sparse_names:
            vals, lens = [], []
            one_hot = True
            for c, lo, hi in pieces:
                ln = c.lengths[name]
                v = c.values[name]
                if is_one_id_each(ln):  # one id per row: rows index the ids directly
                    vals.append(v[lo:hi])
                    continue
                one_hot = False
                if lo == 0 and hi == c.size:
                    vals.append(v)
                    lens.append(ln)
                else:
                    off = c.id_offsets(name)
                    vals.append(v[off[lo] : off[hi]])
                    lens.append(ln[lo:hi])
            values = vals[0] if len(vals) == 1 else np.concatenate(vals)
            if one_hot:
                sparse[name] = JaggedIds.one_hot(values)
                continue
            if lens and len(lens) < len(pieces):  # some pieces were one-hot: give them their ones back
                lens = [c.lengths[name][lo:hi] for c, lo, hi in pieces]
            lengths = lens[0] if len(lens) == 1 else np.concatenate(lens)
            sparse[name] = JaggedIds.from_lengths(values, lengths)
        first = pieces[0][0]
        weighted = any(c.weight is not None for c, _, _ in pieces)
        return MicroBatch(
            labels=labels,
            dense=dense,
            event_ts=ts,
            sparse=sparse,
            table_features=self._table_features,
            sources=sources,
            extra_labels={
                t: np.concatenate([c.extra_labels[t][lo:hi] for c, lo, hi in pieces])
                for t in first.extra_labels
            },
            weight=np.concatenate(
                [
                    np.ones(hi - lo, np.float32) if c.weight is None else c.weight[lo:hi]
                    for c, lo, hi in pieces
                ]
            )
            if weighted
            else None,
        )
