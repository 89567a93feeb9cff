"""Quarantine: stored rows the store will not train through, and pushed rows it will not write.

A row can reach Redis without passing through Kelp's encoder: another client,
a bug, a bad restore. One non-finite row trained through makes the loss NaN,
and the NaN spreads to every dense parameter at the next step; one value of
the wrong length would fail every pull that touched it, on every restart.
So a stored value that is not a valid finite row of its table is *quarantined*
when read (the codec marks it, :data:`~kelp.store.rows.codec.FAULT_REASONS`)::

    reason         what was stored
    nonfinite      a NaN or an infinity in the embedding or the Adagrad state
    wrong_length   a value of another length than the table's rows
    bad_header     another format version, dtype or dim in the row header

and the pull goes on without it (:meth:`~kelp.store.flow.FlowStore.pull_many`
decides what it reads instead: an init row for training, so the next push
overwrites the bad value and the store heals; the default row for serving).
Pushes refuse non-finite rows the same way (reason ``nonfinite_push``): the
other rows are written, those are not.

Every such row is counted in ``kelp_store_rows_quarantined_total{table, reason}``;
a WARNING names the table, ids and where they are stored (the Redis key), at
most once per ``log_every_s`` for each table and reason, so a flood of bad rows
is counted in full but logged in a few lines.

>>> from kelp.store.metrics import StoreMetrics
>>> q = Quarantine(StoreMetrics())
>>> q.refuse_nonfinite("t", np.array([4, 5], np.uint64), np.array([[1.0], [np.nan]])).tolist()
[True, False]
>>> q.metrics.rows_quarantined.labels(table="t", reason="nonfinite_push")._value.get()
1.0
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from kelp.store.metrics import StoreMetrics
from kelp.store.rows.codec import FAULT_REASONS, finite_rows

__all__ = ["REASONS", "Quarantine", "Where"]

log = logging.getLogger("kelp.store.quarantine")

REASONS: tuple[str, ...] = (*FAULT_REASONS[1:], "nonfinite_push")
"""Every value of the ``reason`` label of ``kelp_store_rows_quarantined_total``."""

Where = Callable[[np.ndarray], list[str]]
"""Where the rows of some uint64 ids are stored, one description per id (a Redis key), for the log."""

_EXAMPLES = 3  # ids named in one log line


class Quarantine:
    """Counts (always) and logs (rate-limited per table and reason) the rows the store refuses.

    ``clock``: monotonic seconds, for the log's rate limit (tests pass their own).
    Thread-safe: serving pulls from several threads.
    """

    def __init__(
        self,
        metrics: StoreMetrics,
        *,
        log_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.log_every_s = log_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_line: dict[tuple[str, str], float] = {}
        self._unlogged: dict[tuple[str, str], int] = {}

    def found(self, table: str, reason: str, ids: np.ndarray, where: Where | None = None) -> None:
        """``ids`` of ``table`` were refused for ``reason`` (one of :data:`REASONS`): count, maybe log.

        ``where`` is called only when a line is logged, for the ids it names.
        """
        n = len(ids)
        if not n:
            return
        self.metrics.rows_quarantined.labels(table=table, reason=reason).inc(n)
        key = (table, reason)
        with self._lock:
            now = self._clock()
            if now < self._next_line.get(key, -np.inf):
                self._unlogged[key] = self._unlogged.get(key, 0) + n
                return
            self._next_line[key] = now + self.log_every_s
            since = self._unlogged.pop(key, 0)
        shown = np.asarray(ids[:_EXAMPLES], dtype=np.uint64)
        places = where(shown) if where is not None else [""] * len(shown)
        named = "; ".join(
            f"id {i} at {p}" if p else f"id {i}" for i, p in zip(shown.tolist(), places, strict=True)
        )
        more = f" and {n - len(shown)} more" if n > len(shown) else ""
        earlier = f" ({since} more since the last such line)" if since else ""
        if reason == "nonfinite_push":
            what = "pushed row(s) hold NaN or infinity, not written (nonfinite_push)"
        else:
            what = f"stored row(s) quarantined ({reason}): not trained through, the next push overwrites them"
        log.warning(
            "store table %r: %d %s: %s%s%s",
            table,
            n,
            what,
            named,
            more,
            earlier,
            extra={"table": table, "reason": reason, "rows": n},
        )

    def refuse_nonfinite(self, table: str, ids: np.ndarray, *columns: np.ndarray) -> np.ndarray | None:
        """bool[n] of the pushed rows to keep (every column finite there), counting and logging the
        others as ``nonfinite_push``; None when all are finite (the common case: nothing to copy).

        ``columns``: the push's float32[n, dim] rows, float32[n] state (and gradients, if any).
        """
        if not len(ids):
            return None
        ok = finite_rows(*columns)
        if ok.all():
            return None
        self.found(table, "nonfinite_push", ids[~ok])
        return ok
