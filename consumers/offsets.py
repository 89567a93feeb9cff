"""Contiguous-durable-offset bookkeeping: what may be committed, per partition.

Batches are registered in the order they are emitted (per partition their
ranges are increasing and cover every record, rejected ones included). The
caller may mark them durable in any order. The committable position of a
partition is one past the end of the longest durable *prefix* of its
registered batches: a later batch made durable early never lets an earlier,
still-pending one be skipped.

Example::

    >>> t = OffsetTracker()
    >>> for last in (9, 19, 29):
    ...     t.register(("ev", 0), last)
    >>> t.mark_durable(("ev", 0), 19)
    True
    >>> t.committable()
    {}
    >>> t.mark_durable(("ev", 0), 9)
    True
    >>> t.committable()
    {('ev', 0): 20}
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable

__all__ = ["OffsetTracker"]


class OffsetTracker:
    """Per-partition ordered batch ends with durable flags; not thread-safe (the poll thread owns it)."""

    def __init__(self) -> None:
        self._pending: dict[Hashable, deque[int]] = {}
        self._durable: dict[Hashable, set[int]] = {}
        self._position: dict[Hashable, int] = {}  # next offset to commit, per partition
        self._reported: dict[Hashable, int] = {}

    def register(self, tp: Hashable, last_offset: int) -> None:
        """A batch covering records up to ``last_offset`` (inclusive) of ``tp`` was emitted."""
        q = self._pending.setdefault(tp, deque())
        if q and last_offset <= q[-1]:
            raise ValueError(f"{tp}: batch end {last_offset} is not after {q[-1]}")
        q.append(last_offset)

    def mark_durable(self, tp: Hashable, last_offset: int) -> bool:
        """Mark the batch ending at ``last_offset`` durable; False if ``tp`` no longer has it (revoked)."""
        q = self._pending.get(tp)
        if q is None or last_offset not in q:
            return False
        durable = self._durable.setdefault(tp, set())
        durable.add(last_offset)
        while q and q[0] in durable:
            done = q.popleft()
            durable.discard(done)
            self._position[tp] = done + 1
        return True

    def committable(self, only: Callable[[Hashable], bool] | None = None) -> dict[Hashable, int]:
        """Partitions whose commit position advanced since the last call -> next offset to commit.

        ``only`` restricts the answer (and what counts as reported) to some partitions.
        """
        out = {
            tp: pos
            for tp, pos in self._position.items()
            if self._reported.get(tp) != pos and (only is None or only(tp))
        }
        self._reported.update(out)
        return out

    def forget_reported(self, tps: Iterable[Hashable]) -> None:
        """The commit of these partitions failed: report them again next time."""
        for tp in tps:
            self._reported.pop(tp, None)

    def positions(self) -> dict[Hashable, int]:
        """Every partition's current commit position (next offset to commit)."""
        return dict(self._position)

    def pending(self, tp: Hashable) -> int:
        """Batches of ``tp`` emitted but not yet committable."""
        return len(self._pending.get(tp, ()))

    def forget(self, tps: Iterable[Hashable]) -> None:
        """Drop partitions (revoked): later durable marks for their batches are ignored."""
        for tp in tps:
            self._pending.pop(tp, None)
            self._durable.pop(tp, None)
            self._position.pop(tp, None)
            self._reported.pop(tp, None)
