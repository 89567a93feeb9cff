"""A request's ids deduplicated across all tables at once, and its rows pooled with one gather per width.

The trainer's path (:attr:`MicroBatch.tables`, then
:meth:`~kelp.trainer.embedding.BatchTensors.from_batch` and
:func:`~kelp.trainer.embedding.pool_features`) works table by table: one sort
per table, then one ``F.embedding`` per feature. A scoring request has ~100
rows per table and 26 tables, so numpy's and torch's fixed cost per call,
paid ~300 times, would be most of the work (docs/performance.md, "Serving").
Serving computes the same pooled inputs with a handful of calls:

* **dedup**: every feature's ids in one array, tagged with their table's index;
  one ``lexsort`` by (table, id) gives each table's sorted unique ids (slices
  of one array) and every id's row in one index space over all tables;
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
        # The smallest tag type: lexsort compares uint8 keys faster than int32 ones.
        tag_type = np.min_scalar_type(max(len(used) - 1, 0))
        self.feature_table = np.array([index[f.table_name] for f in spec.sparse], dtype=tag_type)
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
        """Unique ids per table and every id's row index, with one sort for the whole request."""
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
        ids = np.concatenate([c.values for c in columns]) if columns else np.zeros(0, np.uint64)
        tags = np.repeat(self.feature_table, lengths)
        order = np.lexsort((ids, tags))
        sorted_ids, sorted_tags = ids[order], tags[order]
        first = np.empty(ids.size, dtype=bool)
        if ids.size:
            first[0] = True
            np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
            first[1:] |= sorted_tags[1:] != sorted_tags[:-1]
        inverse = np.empty(ids.size, dtype=np.int64)
        inverse[order] = np.cumsum(first) - 1
        unique_ids, unique_tags = sorted_ids[first], sorted_tags[first]
        bounds = np.searchsorted(unique_tags, np.arange(len(self.tables) + 1)).tolist()
        unique = {t: unique_ids[bounds[i] : bounds[i + 1]] for i, t in enumerate(self.tables)}
        return RequestIds(unique, inverse, [0, *accumulate(lengths)], one_hot, b)

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
