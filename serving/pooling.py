"""A request's ids deduplicated across all tables at once, and its rows pooled with one gather per width.

The trainer's path (:attr:`MicroBatch.tables`, then
:meth:`~kelp.trainer.embedding.BatchTensors.from_batch` and
:func:`~kelp.trainer.embedding.pool_features`) works table by table: one sort
per table, then one ``F.embedding`` per feature. A scoring request has ~100
rows per table and 26 tables, so numpy's and torch's fixed cost per call,
paid ~300 times, would be most of the work (docs/performance.md, "Serving").
Serving computes the same pooled inputs with a handful of calls:

* **dedup**: each table's ids (its features' ids side by side) go through one
  native call for the whole request (``kelp_native.dedup_columns``, the GIL
  released), which gives each table's sorted unique ids (slices of one array)
  and every id's row in one index space over all tables;
* **pool**: the tables' rows are concatenated (one array per embedding width);
  all one-hot features of a width are pooled by one ``take`` (a one-id bag's
  sum or mean is the row itself); a multi-hot feature, or one with empty bags,
  goes through ``F.embedding_bag`` as in training.

The result is the same as the trainer's pooling (``tests/serving/test_pooling.py``).

A sequence feature (``pooling: none``) is deduplicated with the rest but not
pooled: :meth:`PoolPlan.sequences` gathers one row per id from its table's
rows and pairs them with the request's offsets, the trainer's
:class:`~kelp.trainer.model_api.SequenceInput`. A spec without one pools as
before and never calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch
from kelp_native import dedup_columns
from torch.nn.functional import embedding_bag

from kelp.config import FeatureSpec
from kelp.consumers.batch import MicroBatch
from kelp.trainer.model_api import SequenceInput

__all__ = ["PoolPlan", "RequestIds"]


@dataclass(frozen=True)
class RequestIds:
    """One request's ids after dedup.

    * ``unique``: table -> sorted unique uint64 ids (what the store reads);
    * ``inverse``: int64[N], N = every feature's ids in config order; the row of
      id *k* in the concatenation of all tables' rows (tables in plan order);
    * ``one_hot``: per feature, whether every sample has exactly one id.
    """

    unique: dict[str, np.ndarray]
    inverse: np.ndarray
    bounds: list[int]
    one_hot: list[bool]
    size: int

    def of_feature(self, k: int) -> np.ndarray:
        """Feature *k*'s slice of ``inverse``."""
        return self.inverse[self.bounds[k] : self.bounds[k + 1]]


class PoolPlan:
    """The layout of one feature spec: tables grouped by width, each feature's place in them.

    Built once per replica; :meth:`dedup` and :meth:`pool` are per request and thread-safe
    (no state is kept between requests).
    """

    def __init__(self, spec: FeatureSpec) -> None:
        dims = {t.name: t.dim for t in spec.tables}
        used = list(dict.fromkeys(f.table_name for f in spec.sparse))
        # Tables of one width are neighbours in the index space, so each width's rows are one array.
        self.tables = sorted(used, key=lambda t: dims[t])
        index = {t: i for i, t in enumerate(self.tables)}
        self.features = [f.name for f in spec.sparse]
        self.modes = [f.pooling for f in spec.sparse]
        # Each table's features, in plan order: their ids side by side are the table's column.
        self.table_features = [
            [k for k, f in enumerate(spec.sparse) if index[f.table_name] == i] for i in range(len(used))
        ]
        # Whether the features laid out table by table are already in config order (every table one
        # feature, tables of one width, as in most specs): then the inverse needs no reordering.
        self.in_order = [k for ks in self.table_features for k in ks] == list(range(len(spec.sparse)))
        self.widths = sorted({dims[t] for t in used})
        self.width_tables = {w: [t for t in self.tables if dims[t] == w] for w in self.widths}
        self.feature_width = [dims[f.table_name] for f in spec.sparse]
        pooled = [k for k, mode in enumerate(self.modes) if mode != "none"]
        self.pooled_features = pooled
        """Indexes (into ``features``) of the pooled features: what :meth:`pool` returns, in order."""
        self.width_features = {w: [k for k in pooled if self.feature_width[k] == w] for w in self.widths}
        self.sequence_features = [
            (k, f.name, f.table_name) for k, f in enumerate(spec.sparse) if f.pooling == "none"
        ]
        """``(index, name, table)`` of each sequence feature (``pooling: none``), config order."""

    def dedup(self, batch: MicroBatch) -> RequestIds:
        """Unique ids per table and every id's row index, with one native call for the whole request."""
        columns = [batch.sparse[name] for name in self.features]
        b = batch.size
        lengths = [len(c.values) for c in columns]
        one_hot = [n == b for n in lengths]
        if any(one_hot):  # B ids could still be two in one bag and none in another: check the offsets
            maybe = [k for k, yes in enumerate(one_hot) if yes]
            offsets = np.concatenate([columns[k].offsets for k in maybe]).reshape(len(maybe), b + 1)
            same = (offsets == np.arange(b + 1)).all(axis=1)
            for k, yes in zip(maybe, same.tolist(), strict=True):
                one_hot[k] = yes
        by_table = [
            columns[ks[0]].values if len(ks) == 1 else np.concatenate([columns[k].values for k in ks])
            for ks in self.table_features
        ]
        total = sum(lengths)
        uniques = np.empty(total, np.uint64)
        local = np.empty(total, np.int64)
        counts = dedup_columns([np.ascontiguousarray(c, dtype=np.uint64) for c in by_table], uniques, local)
        bounds = [0, *accumulate(counts)]
        unique = {t: uniques[bounds[i] : bounds[i + 1]] for i, t in enumerate(self.tables)}
        # Positions among a table's own distinct ids, plus where that table's rows start.
        local += np.repeat(np.array(bounds[:-1], np.int64), [len(c) for c in by_table])
        inverse = local if self.in_order else self._feature_order(local, lengths)
        return RequestIds(unique, inverse, [0, *accumulate(lengths)], one_hot, b)

    def _feature_order(self, inverse: np.ndarray, lengths: list[int]) -> np.ndarray:
        """``inverse`` laid out table by table (plan order, each table's features in config order),
        rearranged into config order of the features."""
        starts: list[int] = [0] * len(lengths)
        at = 0
        for ks in self.table_features:
            for k in ks:
                starts[k] = at
                at += lengths[k]
        return np.concatenate([inverse[starts[k] : starts[k] + lengths[k]] for k in range(len(lengths))])

    def pool(self, batch: MicroBatch, ids: RequestIds, rows: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
        """Pooled f32[B, dim_f] per pooled sparse feature (config order), as the trainer pools them."""
        b = ids.size
        weights: dict[int, np.ndarray] = {}
        starts: dict[int, int] = {}
        start = 0
        for w in self.widths:
            parts = [rows[t] for t in self.width_tables[w]]
            weights[w] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            starts[w] = start
            start += len(weights[w])
        pooled: list[torch.Tensor | None] = [None] * len(self.features)
        for w in self.widths:
            gather = [k for k in self.width_features[w] if ids.one_hot[k]]
            if gather:
                if len(gather) == len(self.features):  # every feature one-hot, one width: the whole inverse
                    index = ids.inverse
                else:
                    index = np.concatenate([ids.of_feature(k) for k in gather])
                index = index - starts[w] if starts[w] else index
                block = torch.from_numpy(weights[w].take(index, axis=0).reshape(len(gather), b, w))
                for k, t in zip(gather, block.unbind(0), strict=True):
                    pooled[k] = t
        for k in self.pooled_features:
            if pooled[k] is None:
                name = self.features[k]
                w = self.feature_width[k]
                index = torch.from_numpy(ids.of_feature(k) - starts[w])
                bag_offsets = torch.from_numpy(batch.sparse[name].offsets.astype(np.int64))
                pooled[k] = embedding_bag(
                    index,
                    torch.from_numpy(weights[w]),
                    bag_offsets,
                    mode=self.modes[k],
                    include_last_offset=True,
                )
        if self.sequence_features:
            return [pooled[k] for k in self.pooled_features]  # type: ignore[misc]
        return pooled  # type: ignore[return-value]

    def sequences(
        self, batch: MicroBatch, ids: RequestIds, rows: Mapping[str, np.ndarray]
    ) -> dict[str, SequenceInput]:
        """Per sequence feature (config order), every id's row and the request's offsets, as in training.

        ``ids.inverse`` indexes the concatenation of all tables' unique ids in plan
        order, so a table's rows start after the unique ids of the tables before it.
        """
        if not self.sequence_features:
            return {}
        sizes = [len(ids.unique[t]) for t in self.tables]
        starts = dict(zip(self.tables, accumulate(sizes, initial=0), strict=False))  # one start too many
        out: dict[str, SequenceInput] = {}
        for k, name, table in self.sequence_features:
            values = rows[table].take(ids.of_feature(k) - starts[table], axis=0)
            offsets = batch.sparse[name].offsets.astype(np.int64)
            out[name] = SequenceInput(torch.from_numpy(values), torch.from_numpy(offsets))
        return out
