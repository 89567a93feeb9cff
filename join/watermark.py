"""The joiner's clock: event time, as far as every input has got.

Windows close on event time, not on the wall clock, so a replay of
yesterday's topics closes them where live reading did. The watermark is the
slowest input partition's newest event time, minus ``allowed_lateness_s``:
an event up to that far behind its partition's newest still counts as on time.

A partition that is caught up and has given nothing for ``idle_partition_s``
stops holding the watermark back (a topic of rare purchases must not stop
every click window). When every partition is idle and ``advance_when_idle``
is on, the watermark follows the wall clock, so windows close on a quiet
stream too. It never moves backwards, across restarts included (the last
applied value is kept with the state), so it is only shown times the joiner
has bounded by its wall clock (``max_future_skew_s``, in the joiner): one
far-future time would otherwise close every window for good.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

__all__ = ["Watermark"]


class Watermark:
    """Newest event time per input partition, and the watermark they allow."""

    def __init__(
        self, allowed_lateness_s: float, advance_when_idle: bool, start: float | None = None
    ) -> None:
        self.lateness = allowed_lateness_s
        self.advance_when_idle = advance_when_idle
        self._newest: dict[Hashable, float] = {}
        self._value = start

    @property
    def value(self) -> float | None:
        """The current watermark; None until every partition has been heard from (or gone idle)."""
        return self._value

    def observe(self, partition: Hashable, event_ts: float) -> None:
        newest = self._newest.get(partition)
        if newest is None or event_ts > newest:
            self._newest[partition] = event_ts

    def advance(self, assigned: Iterable[Hashable], idle: set[Hashable], now: float) -> float | None:
        """Move the watermark as far as the ``assigned`` partitions allow (``idle`` ones aside)."""
        assigned = list(assigned)
        if not assigned:
            return self._value  # no partitions yet (the group is still joining): nothing is known
        holding = [p for p in assigned if p not in idle]
        candidate: float | None
        if holding:
            times = [self._newest.get(p) for p in holding]
            if any(t is None for t in times):
                return self._value  # a partition not heard from yet could hold anything
            candidate = min(t for t in times if t is not None) - self.lateness
        elif self.advance_when_idle:
            candidate = now - self.lateness
        else:
            candidate = None
        if candidate is not None and (self._value is None or candidate > self._value):
            self._value = candidate
        return self._value
