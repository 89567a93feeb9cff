"""Membership and intersection of id arrays by one sort and a search, not ``np.isin``/``np.intersect1d``.

``np.isin`` and ``np.intersect1d`` sort both arrays together. On a trainer's hot
paths one side is small or already sorted: the hot tier checks ~1k raced ids per
table against the rows a pull keeps, and the update ledger patches each pull's
sorted ids with each newer step's sorted update ids, 26 tables at a time. Sorting
only the other side (when it is not sorted yet) and searching it is cheaper
(docs/performance.md).
"""

from __future__ import annotations

import numpy as np

__all__ = ["member", "shared"]


def _search(ids: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(hit, at, order)``: ``hit[i]`` says ``ids[i]`` is in ``other``, found at ``at[i]`` of ``other``
    sorted by ``order`` (None: ``other`` was sorted already)."""
    order = None if (other[1:] > other[:-1]).all() else np.argsort(other, kind="stable")
    ordered = other if order is None else other[order]
    at = np.searchsorted(ordered, ids)
    np.minimum(at, len(ordered) - 1, out=at)
    return ordered[at] == ids, at, order


def member(ids: np.ndarray, among: np.ndarray) -> np.ndarray:
    """``np.isin(ids, among)``.

    >>> member(np.array([5, 1, 9], np.uint64), np.array([9, 2, 5, 5], np.uint64)).tolist()
    [True, False, True]
    """
    if not len(ids) or not len(among):
        return np.zeros(len(ids), dtype=bool)
    return _search(ids, among)[0]


def shared(ids: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``ids`` and in ``other`` (both unique) of the values they share: the indices of
    ``np.intersect1d(ids, other, return_indices=True)``, paired the same way, in ``ids`` order.

    >>> [a.tolist() for a in shared(np.array([2, 5, 9]), np.array([9, 4, 2]))]
    [[0, 2], [2, 0]]
    """
    if not len(ids) or not len(other):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    hit, at, order = _search(ids, other)
    at_other = at[hit]
    return np.flatnonzero(hit), at_other if order is None else order[at_other]
