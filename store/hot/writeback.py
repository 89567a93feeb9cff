"""When the hot tier's dirty rows are due, and which pushes are durable: the write-back bookkeeping.

The hot tier (:mod:`kelp.store.hot.tier`) numbers its pushes 1, 2, 3... A row
that becomes dirty remembers the push that dirtied it first since its last
write-back (its *since*). Writing back, at each push, only the rows whose
*since* is at least ``every_steps`` pushes (or ``interval_s`` seconds) old
spreads the write-back evenly over the steps, instead of one burst that stalls
the trainer every period, and keeps both staleness bounds::

    push      1    2    3    4    5    6        every_steps = 3
    dirtied   a,b  b,c  c    a    d
    due at              3:a,b  4:c       6:a,d  (a again: re-dirtied at 4, so since = 4)

and the rule the trainer commits Kafka offsets by: every push up to
:attr:`WritebackSchedule.durable` is in the store, because each row dirtied by
those pushes was either written back since, or was re-dirtied later (its
newest value, which contains the older update, is still waiting).

>>> clock = [0.0]
>>> s = WritebackSchedule(every_steps=3, interval_s=60.0, clock=lambda: clock[0])
>>> p = s.begin_push(); s.dirtied(p, 2); s.due(), s.durable
(0, 0)
>>> p = s.begin_push(); p = s.begin_push(); s.due()
1
>>> s.written(1); s.durable, s.all_durable
(3, True)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

__all__ = ["WritebackSchedule"]


class WritebackSchedule:
    """Push numbers, dirty-row counts per push and the durable watermark. Callers hold their own lock."""

    def __init__(self, every_steps: int, interval_s: float, clock: Callable[[], float]) -> None:
        self.every_steps = every_steps
        self.interval_s = interval_s
        self._clock = clock
        self.pushes = 0
        """Pushes begun so far."""
        self._pending: dict[int, int] = {}  # push number -> rows it dirtied first, not written back yet
        self._push_no: list[int] = []  # pushes not known durable yet, ascending ...
        self._push_at: list[float] = []  # ... and when each began

    def begin_push(self) -> int:
        """A new push: its number."""
        self.pushes += 1
        self._push_no.append(self.pushes)
        self._push_at.append(self._clock())
        return self.pushes

    def dirtied(self, push: int, rows: int) -> None:
        """``rows`` clean rows became dirty in ``push``."""
        if rows:
            self._pending[push] = self._pending.get(push, 0) + rows

    def forget(self, pushes: list[int]) -> None:
        """Dirty rows that left without a write-back (deleted): one entry per row, its *since*."""
        for push in pushes:
            left = self._pending.get(push, 0) - 1
            if left > 0:
                self._pending[push] = left
            else:
                self._pending.pop(push, None)

    def due(self, force: bool = False) -> int:
        """The highest push number whose dirty rows must be written back now (0: none).

        Due: rows dirtied ``every_steps`` pushes ago or earlier, and rows dirtied
        by a push that began ``interval_s`` seconds ago or earlier; ``force``: all.
        """
        if not self._pending:
            return 0
        if force:
            return self.pushes
        by_steps = self.pushes - self.every_steps + 1
        by_time = bisect.bisect_right(self._push_at, self._clock() - self.interval_s)
        cutoff = max(by_steps, self._push_no[by_time - 1] if by_time else 0)
        return cutoff if cutoff >= min(self._pending) else 0

    def written(self, cutoff: int) -> None:
        """Every row dirtied by pushes up to ``cutoff`` is now in the store."""
        for push in [p for p in self._pending if p <= cutoff]:
            del self._pending[push]
        keep = bisect.bisect_right(self._push_no, self.durable)
        del self._push_no[:keep], self._push_at[:keep]

    @property
    def durable(self) -> int:
        """Every push up to this number is durable (write-through rows at once, tier rows once written)."""
        return min(self._pending) - 1 if self._pending else self.pushes

    @property
    def all_durable(self) -> bool:
        return not self._pending

    def dirty_age(self) -> float:
        """Seconds since the push of the oldest update not written back yet (0 when all are durable)."""
        if not self._pending:
            return 0.0
        oldest = min(self._pending)
        at = self._push_at[bisect.bisect_left(self._push_no, oldest)]
        return max(0.0, self._clock() - at)
