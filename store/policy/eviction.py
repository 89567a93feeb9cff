"""Eviction policies: when stored rows go away, as small strategy classes built from ``TableSpec.eviction``.

* :class:`TtlEviction` (``ttl_s``): a row not updated for ``ttl_s`` seconds expires.
* :class:`LfuCapacity` (``max_rows``): a table holds at most ``max_rows`` rows; the
  least-frequently-used leave first.

Which policies a backend enforces is a capability it declares
(``EmbeddingStore.enforces``): the memory backend enforces both, the Redis
backends only the TTL (``PX`` on every write; capacity there is Redis's own
``maxmemory`` + ``allkeys-lfu``). :func:`~kelp.store.factory.check_store_config`
reports a table asking for more than its backend enforces, and ``build_store``
refuses it.

>>> TtlEviction(10).expired(np.array([0.0, 95.0]), now=100.0).tolist()
[True, False]
>>> LfuCapacity(3).excess(rows=3, adding=2)
2
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from kelp.config import EvictionSpec

__all__ = ["EvictionPolicy", "LfuCapacity", "TtlEviction", "build_evictions"]


class EvictionPolicy(abc.ABC):
    """One eviction rule of a table; ``setting`` names the ``TableSpec.eviction`` field that asks for it."""

    setting: ClassVar[str]


class TtlEviction(EvictionPolicy):
    """Rows not updated for ``ttl_s`` seconds expire and read as not admitted."""

    setting = "ttl_s"

    def __init__(self, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s

    def expired(self, updated: np.ndarray, now: float) -> np.ndarray:
        """bool[n]: rows last updated at ``updated`` (unix seconds, float64[n]) have expired at ``now``."""
        return updated < now - self.ttl_s

    @property
    def ttl_ms(self) -> int:
        """The TTL as Redis ``PX`` milliseconds (at least 1)."""
        return max(1, int(self.ttl_s * 1000))

    def __repr__(self) -> str:
        return f"TtlEviction(ttl_s={self.ttl_s:g})"


class LfuCapacity(EvictionPolicy):
    """At most ``max_rows`` rows; the lowest access count goes first, the oldest update first on ties."""

    setting = "max_rows"

    def __init__(self, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows

    def excess(self, rows: int, adding: int) -> int:
        """How many rows must leave before ``adding`` more join ``rows``."""
        return max(0, rows + adding - self.max_rows)

    def victims(
        self, slots: np.ndarray, count: np.ndarray, updated: np.ndarray, protect: np.ndarray, excess: int
    ) -> np.ndarray:
        """``excess`` of ``slots`` (int64[k], with access ``count`` and ``updated`` time each) to evict.

        Slots in ``protect`` (the rows of the current batch) go last.
        """
        key = count.astype(np.float64)
        key[np.isin(slots, protect)] = np.inf
        return slots[np.lexsort((updated, key))[:excess]]

    def __repr__(self) -> str:
        return f"LfuCapacity(max_rows={self.max_rows})"


def build_evictions(spec: EvictionSpec) -> list[EvictionPolicy]:
    """The policies a table's ``eviction`` settings ask for (none by default)."""
    policies: list[EvictionPolicy] = []
    if spec.ttl_s is not None:
        policies.append(TtlEviction(spec.ttl_s))
    if spec.max_rows is not None:
        policies.append(LfuCapacity(spec.max_rows))
    return policies
