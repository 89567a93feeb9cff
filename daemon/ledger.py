"""The update ledger: what a prefetched pull may have missed, and the rows to patch it with.

Prefetching pulls batch k+1's rows while batch k trains, and write-behind
pushes batch k's updates while batch k+1 trains. Without care, batch k+1
would train on rows read *before* batch k's update reached the store: a lost
update. The ledger closes that gap exactly, with no staleness from the
trainer's own updates:

* steps are numbered 1, 2, 3... and acknowledged by the store in order, so
  one integer, ``acked``, says "every step <= acked is readable in the store";
* a pull records ``acked`` when it begins (its *watermark*): it saw every
  update of steps <= watermark, maybe some later ones, maybe not;
* each trained step records its updates here (the in-flight overlay) before
  they are pushed;
* before batch k trains, every recorded update of a step > its watermark is
  applied to its pulled rows, oldest first, so the newest write wins. Steps
  train one after another, so by then every step < k is recorded.

An entry is dropped once no pull that is still to be applied can need it:
its step is <= the watermark of the oldest open pull (or <= ``acked`` when
no pull is open, because a pull begun later sees it in the store).

Updates from *other* trainers are not covered (they arrive through the store
with the usual last-writer-wins); see docs/trainer.md for the staleness bound.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

from kelp.store.base import PullResult
from kelp.store.rows.id_sets import shared
from kelp.trainer.optim import SparseUpdate

__all__ = ["UpdateLedger"]


class UpdateLedger:
    """Thread-safe: pulls begin on the prefetch thread, acks arrive on the push thread."""

    def __init__(self, acked: int = 0) -> None:
        self._lock = threading.Lock()
        self._acked = acked
        self._open_pulls: deque[int] = deque()
        self._side_reads: list[int] = []  # watermarks of reads made outside the prefetch order
        self._updates: dict[int, Mapping[str, SparseUpdate]] = {}
        self.patched_rows = 0
        """Rows a prefetched pull had missed and the overlay supplied (a running total)."""

    @property
    def acked(self) -> int:
        return self._acked

    def begin_pull(self) -> int:
        """Call right before a pull starts; returns its watermark. Pulls are applied in begin order."""
        with self._lock:
            self._open_pulls.append(self._acked)
            return self._acked

    def record(self, step: int, updates: Mapping[str, SparseUpdate]) -> None:
        """The updates step ``step`` is about to push (call before handing them to the writer)."""
        with self._lock:
            self._updates[step] = updates

    def acknowledge(self, step: int) -> None:
        """The store acknowledged every push of steps <= ``step``."""
        with self._lock:
            if step < self._acked:
                raise ValueError(f"acknowledgements go forward: {step} after {self._acked}")
            self._acked = step
            self._collect()

    def apply(
        self, watermark: int, pulled: Mapping[str, PullResult], unique_ids: Mapping[str, np.ndarray]
    ) -> dict[str, PullResult]:
        """``pulled`` with every update newer than ``watermark`` applied; closes the oldest open pull.

        Pulled arrays are never modified in place: a patched table gets copies.
        """
        with self._lock:
            if not self._open_pulls or self._open_pulls[0] != watermark:
                raise RuntimeError("ledger: pulls must be applied in the order they began")
            self._open_pulls.popleft()
            newer = self._newer(watermark)
            self._collect()
        return self._overlay(newer, pulled, unique_ids)

    def side_read(
        self, read: Callable[[], Mapping[str, PullResult]], unique_ids: Mapping[str, np.ndarray]
    ) -> dict[str, PullResult]:
        """``read()`` of ``unique_ids`` made now, on the training thread, with every recorded update
        newer than what it saw applied: the row owner's read of rows only other ranks trained.

        It may overlap prefetched pulls in any order; while it runs, the updates it may have missed
        are kept. Every step before the one training now must be recorded already.
        """
        with self._lock:
            watermark = self._acked
            self._side_reads.append(watermark)
        try:
            got = read()
        finally:
            with self._lock:
                self._side_reads.remove(watermark)
                newer = self._newer(watermark)
                self._collect()
        return self._overlay(newer, got, unique_ids)

    def _newer(self, watermark: int) -> list[Mapping[str, SparseUpdate]]:
        return [self._updates[s] for s in sorted(self._updates) if s > watermark]

    def _overlay(
        self,
        newer: list[Mapping[str, SparseUpdate]],
        pulled: Mapping[str, PullResult],
        unique_ids: Mapping[str, np.ndarray],
    ) -> dict[str, PullResult]:
        """``pulled`` with ``newer``'s rows written over it, oldest first; patched tables are copies."""
        out = dict(pulled)
        for updates in newer:
            for table, update in updates.items():
                if table in out and len(update.ids):
                    out[table], n = _patched(
                        out[table], unique_ids[table], update, copied=out[table] is not pulled[table]
                    )
                    self.patched_rows += n
        return out

    def rows(self) -> int:
        """Rows held in the overlay (a gauge)."""
        with self._lock:
            return sum(len(u.ids) for updates in self._updates.values() for u in updates.values())

    def _collect(self) -> None:
        threshold = min([self._acked, *self._open_pulls, *self._side_reads])
        for step in [s for s in self._updates if s <= threshold]:
            del self._updates[step]


def _patched(got: PullResult, ids: np.ndarray, update: SparseUpdate, copied: bool) -> tuple[PullResult, int]:
    """``got`` with the rows of ``update`` written over the ids they share (both id arrays unique)."""
    at_batch, at_update = shared(ids, update.ids)
    if not len(at_batch):
        return got, 0
    if not copied:
        got = PullResult(
            rows=got.rows.copy(),
            state=got.state.copy(),
            admitted=got.admitted.copy(),
            updated_s=got.updated_s,
            admitted_now=None if got.admitted_now is None else got.admitted_now.copy(),
        )
    got.rows[at_batch] = update.rows[at_update]
    got.state[at_batch] = update.state[at_update]
    got.admitted[at_batch] = True  # an update exists only for an admitted id
    if got.admitted_now is not None:
        got.admitted_now[at_batch] = False  # the row holds a trained update now, not the init row
    return got, len(at_batch)
