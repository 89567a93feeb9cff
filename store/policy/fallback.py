"""Fallback rows: what an id that is not admitted yet reads and trains, instead of an untrained default.

With ``admission.fallback_buckets: K`` a table ``t`` gets a companion table
``t__fallback`` of K shared rows. An id without a stored row of its own reads
the row of its bucket, ``splitmix64(id ^ seed(t)) mod K``, and its gradient
trains that row, so a new user's first samples still carry signal (the hashing
trick, used only until the id earns its own row). Bucket rows are ordinary
rows: stored, TTL'd, pulled and pushed in the same round trips, and counted as
stored rows. Per batch and table at most ``min(K, unique ids)`` extra rows move::

    unique ids of t   [  7,  12,  40,  91 ]          pulled from t: admitted [T, F, T, F]
    bucket (K = 4)    [  2,   0,   2,   3 ]  ->  t__fallback ids [0, 2, 3] (all pulled: one round trip)
    position          [  1,   0,   1,   2 ]      index of each id's bucket among them
    rows read         [ t[7], fb[0], t[40], fb[3] ]

:meth:`Fallback.expand` says what to pull and :meth:`Fallback.compose` builds
the rows a not-admitted id reads (serving). The trainer composes with autograd
(:mod:`kelp.trainer.step`) so bucket gradients of several ids add up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from kelp.config import TableSpec
from kelp.store.rows.hashing import name_seed, splitmix64

__all__ = ["Buckets", "Fallback", "PullPlan"]


@dataclass(frozen=True)
class Buckets:
    """One table's fallback: its bucket table's name and size, and the id -> bucket hash seed."""

    table: str
    count: int
    seed: np.uint64

    def of(self, ids: np.ndarray) -> np.ndarray:
        """uint64[n] bucket ids (in ``[0, count)``) of uint64[n] ids."""
        return splitmix64(np.asarray(ids, dtype=np.uint64) ^ self.seed) % np.uint64(self.count)


@dataclass(frozen=True)
class PullPlan:
    """What to pull for a batch's unique ids, and where each id's bucket row lands.

    * ``ids``: per table to pull, uint64 ids: every table asked for, plus each
      fallback table's unique buckets;
    * ``position``: per table with fallback, int64[U]: the index of each id's
      bucket in ``ids[<table>__fallback]``.
    """

    ids: dict[str, np.ndarray]
    position: dict[str, np.ndarray]


class Fallback:
    """The fallback buckets of every table of a store that has them (empty when none do).

    >>> from kelp.config import TableSpec
    >>> fb = Fallback([TableSpec(name="user", admission={"min_count": 3, "fallback_buckets": 4})])
    >>> plan = fb.expand({"user": np.array([7, 12, 40], dtype=np.uint64)})
    >>> sorted(plan.ids), plan.position["user"].shape
    (['user', 'user__fallback'], (3,))
    """

    def __init__(self, tables: Iterable[TableSpec]) -> None:
        self.tables: dict[str, Buckets] = {}
        for spec in tables:
            table = spec.fallback_table()
            if table is not None:
                seed = name_seed("fallback", spec.name)
                self.tables[spec.name] = Buckets(table.name, spec.admission.fallback_buckets, seed)

    def __bool__(self) -> bool:
        return bool(self.tables)

    def expand(self, ids_by_table: Mapping[str, np.ndarray]) -> PullPlan:
        """The pull for ``ids_by_table`` (unique ids per table) with every fallback table's buckets added."""
        ids = dict(ids_by_table)
        position: dict[str, np.ndarray] = {}
        for name, unique in ids_by_table.items():
            buckets = self.tables.get(name)
            if buckets is None:
                continue
            ids[buckets.table], position[name] = np.unique(buckets.of(unique), return_inverse=True)
        return PullPlan(ids, position)

    def is_bucket_table(self, name: str) -> bool:
        return any(b.table == name for b in self.tables.values())

    def compose(
        self, rows: Mapping[str, np.ndarray], admitted: Mapping[str, np.ndarray], plan: PullPlan
    ) -> dict[str, np.ndarray]:
        """Per table asked for, float32[U, dim] rows: its own where ``admitted``, else its bucket's row.

        ``rows``/``admitted``: what the pull of ``plan.ids`` returned per table.
        Tables without fallback keep their rows (the default row where not
        admitted); the fallback tables themselves are left out.
        """
        out: dict[str, np.ndarray] = {}
        for name, table_rows in rows.items():
            if self.is_bucket_table(name):
                continue
            buckets = self.tables.get(name)
            missing = ~admitted[name]
            if buckets is None or not missing.any():
                out[name] = table_rows
                continue
            composed = table_rows.copy()
            composed[missing] = rows[buckets.table][plan.position[name][missing]]
            out[name] = composed
        return out
