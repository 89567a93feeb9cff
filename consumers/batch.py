"""The one micro-batch type that flows from ``consumers/`` to the trainer and ``store/``.

Nothing else crosses those boundaries: sources build :class:`MicroBatch`, the
trainer moves its arrays to a device, and the store sees only
``batch.tables[t].unique_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from kelp_native import dedup_columns

from kelp.buffers import native_array

if TYPE_CHECKING:
    from kelp.config import FeatureSpec

__all__ = ["JaggedIds", "MicroBatch", "SourceRange", "TableIds", "dedup_ids", "dedup_many"]


@dataclass(frozen=True)
class SourceRange:
    """Where a batch's records came from: ``first_offset..last_offset`` inclusive.

    For Kafka: a topic partition and its record offsets. For file sources:
    ``topic`` is the file path, ``partition`` is 0 and offsets are record
    (row or message) indexes. Rejected records inside the range are included:
    their offsets count as handled. ``epoch`` is the source's assignment
    generation for the partition: a range from before a rebalance never
    commits for the partition's next owner (or for this one after it got the
    partition back).
    """

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.last_offset < self.first_offset:
            raise ValueError(f"empty range {self.first_offset}..{self.last_offset}")


@dataclass(frozen=True)
class JaggedIds:
    """Ids of one sparse feature for a whole batch, jagged (variable count per sample).

    ``values[offsets[i]:offsets[i + 1]]`` are sample *i*'s ids.

    * ``values``: uint64[N], N = total ids in the batch for this feature;
    * ``offsets``: int32[B + 1], ``offsets[0] == 0`` and ``offsets[-1] == N``.
    """

    values: np.ndarray
    offsets: np.ndarray

    def lengths(self) -> np.ndarray:
        """int32[B]: ids per sample (0 where the feature was missing)."""
        return np.diff(self.offsets).astype(np.int32, copy=False)

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: np.ndarray) -> JaggedIds:
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        return cls(native_array(values, np.uint64), offsets)

    @classmethod
    def one_hot(cls, values: np.ndarray) -> JaggedIds:
        """One id per sample (the common case): ``offsets = 0..B``."""
        return cls(native_array(values, np.uint64), np.arange(len(values) + 1, dtype=np.int32))


@dataclass(frozen=True)
class TableIds:
    """The ids of every feature that shares one embedding table, deduplicated (RecD's IKJT).

    Let ``ids`` be the concatenation, in config feature order, of the
    ``values`` of every feature using this table. Then:

    * ``unique_ids``: uint64[U], sorted, what the store pulls and pushes;
    * ``inverse``: int64[N_t], ``unique_ids[inverse] == ids``;
    * ``feature_slices[f]``: ``inverse[feature_slices[f]]`` belongs to feature ``f``
      (same order as ``batch.sparse[f].values``).
    """

    unique_ids: np.ndarray
    inverse: np.ndarray
    feature_slices: dict[str, slice]


def dedup_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(unique_ids uint64[U] sorted, inverse int64[N])`` with ``unique_ids[inverse] == ids``.

    The same result as ``np.unique(ids, return_inverse=True)`` (``ids`` read
    flat), computed as :func:`dedup_many` does.
    """
    return dedup_many([ids])[0]


def dedup_many(columns: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`dedup_ids` of each column, all in one native call (``kelp_native.dedup_columns``).

    A criteo-like batch has 26 tables of B ids each: one call dedups them all
    with the GIL released (a hash table per column, then a sort of only its
    distinct ids), so the Kafka poll thread and the trainer's other threads
    keep running meanwhile. Results equal ``np.unique(column,
    return_inverse=True)`` exactly; ``unique_ids`` are views into one array,
    and so are the inverses.
    """
    cols = [native_array(col, np.uint64) for col in columns]
    total = sum(col.size for col in cols)
    uniques = np.empty(total, dtype=np.uint64)
    inverse = np.empty(total, dtype=np.int64)
    counts = dedup_columns(cols, uniques, inverse)
    out: list[tuple[np.ndarray, np.ndarray]] = []
    u = at = 0
    for col, count in zip(cols, counts, strict=True):
        out.append((uniques[u : u + count], inverse[at : at + col.size]))
        u += count
        at += col.size
    return out


@dataclass
class MicroBatch:
    """A columnar micro-batch of ``B`` samples (the KeyedJaggedTensor idea, plus dedup).

    Layout for B = 3 samples, dense features ``[I1, I2]``, sparse features
    ``C1`` (table ``ads``), ``C2`` (table ``ads``, multi-hot) and ``C3``
    (table ``C3``)::

        sample:           0          1           2
        labels  f32[B]   [1.0,       0.0,        1.0      ]   the first task's label
        extra_labels     {"buy": f32[B] [0.0, 0.0, 1.0]}      the other tasks' (features.labels)
        weight  f32[B]   [1.0,       1.0,        0.5      ]   None = every sample weighs 1
        dense   f32[B,2] [[0.7,2.1], [0.0,1.3],  [4.2,0.0]]   column j = features.dense[j]
        event_ts f64[B]  [t0,        t1,         nan      ]   nan = producer sent no ts

        sparse["C1"]  values u64  [ 7,         9,          7        ]
                      offsets i32 [0,          1,          2,        3]
        sparse["C2"]  values u64  [ 7, 5,                  9, 9, 4  ]   sample 1 has no C2
                      offsets i32 [0,          2,          2,        5]
        sparse["C3"]  values u64  [ 11,        12,         11       ]
                      offsets i32 [0,          1,          2,        3]

        tables["ads"]  ids = C1.values ++ C2.values = [7, 9, 7, 7, 5, 9, 9, 4]
                       unique_ids u64 [4, 5, 7, 9]
                       inverse    i64 [2, 3, 2, 2, 1, 3, 3, 0]   unique_ids[inverse] == ids
                       feature_slices {"C1": slice(0, 3), "C2": slice(3, 8)}
        tables["C3"]   unique_ids [11, 12], inverse [0, 1, 0], {"C3": slice(0, 3)}

        sources: [SourceRange("events", 0, 120, 131), SourceRange("events", 3, 77, 80)]

    ``tables`` is computed on first access and cached (one native dedup call for every table);
    the store only ever sees ``unique_ids``. ``sources`` lists the record
    ranges the batch covers, rejected records included, so the source can
    commit them once the caller says the batch is durable.
    """

    labels: np.ndarray
    dense: np.ndarray
    event_ts: np.ndarray
    sparse: dict[str, JaggedIds]
    table_features: dict[str, list[str]]
    sources: list[SourceRange] = field(default_factory=list)
    extra_labels: dict[str, np.ndarray] = field(default_factory=dict)
    weight: np.ndarray | None = None
    _tables: dict[str, TableIds] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        b = self.labels.shape[0]
        for name, column in self.extra_labels.items():
            if column.shape != (b,):
                raise ValueError(f"extra_labels[{name!r}] has shape {column.shape}, expected ({b},)")
        if self.weight is not None and self.weight.shape != (b,):
            raise ValueError(f"weight has shape {self.weight.shape}, expected ({b},)")
        if self.dense.ndim != 2 or self.dense.shape[0] != b:
            raise ValueError(f"dense has shape {self.dense.shape}, expected ({b}, n_dense)")
        if self.event_ts.shape != (b,):
            raise ValueError(f"event_ts has shape {self.event_ts.shape}, expected ({b},)")
        for name, jag in self.sparse.items():
            if jag.offsets.shape != (b + 1,):
                raise ValueError(
                    f"sparse[{name!r}].offsets has shape {jag.offsets.shape}, expected ({b + 1},)"
                )

    @property
    def size(self) -> int:
        """B, the number of samples."""
        return int(self.labels.shape[0])

    def __len__(self) -> int:
        return self.size

    @property
    def tables(self) -> dict[str, TableIds]:
        """Per-table deduplicated ids (see :class:`TableIds`); computed once, then cached."""
        if self._tables is None:
            columns: list[np.ndarray] = []
            all_slices: list[dict[str, slice]] = []
            for features in self.table_features.values():
                parts = [self.sparse[f].values for f in features]
                slices: dict[str, slice] = {}
                start = 0
                for f, part in zip(features, parts, strict=True):
                    slices[f] = slice(start, start + part.size)
                    start += part.size
                columns.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
                all_slices.append(slices)
            self._tables = {
                table: TableIds(unique_ids, inverse, slices)
                for table, (unique_ids, inverse), slices in zip(
                    self.table_features, dedup_many(columns), all_slices, strict=True
                )
            }
        return self._tables

    def task_labels(self, tasks: Sequence[str]) -> np.ndarray:
        """f32[B, T]: column t is task ``tasks[t]``'s labels; the first task is ``labels``."""
        columns = [self.labels, *(self.extra_labels[t] for t in tasks[1:])]
        return np.stack(columns, axis=1).astype(np.float32, copy=False)

    def weights(self) -> np.ndarray:
        """f32[B] sample weights (ones when the batch carries none)."""
        if self.weight is None:
            return np.ones(self.size, dtype=np.float32)
        return np.asarray(self.weight, dtype=np.float32)

    def num_ids(self) -> int:
        """Total sparse ids in the batch (before dedup), across features."""
        return int(sum(j.values.size for j in self.sparse.values()))

    @classmethod
    def from_columns(
        cls,
        spec: FeatureSpec,
        *,
        labels: np.ndarray,
        dense: np.ndarray,
        sparse: Mapping[str, np.ndarray | JaggedIds],
        event_ts: np.ndarray | None = None,
        sources: Sequence[SourceRange] = (),
        extra_labels: Mapping[str, np.ndarray] | None = None,
        weight: np.ndarray | None = None,
        features_by_table: dict[str, list[str]] | None = None,
    ) -> MicroBatch:
        """Build a batch from already-clean columns (no validation, no transforms).

        ``sparse[f]`` is a ``uint64[B]`` one-hot column or a :class:`JaggedIds`;
        features of ``spec`` missing from ``sparse`` get zero ids per sample.
        ``extra_labels`` holds the labels of the tasks after the first.
        ``features_by_table``: :func:`table_features` of ``spec``, when the caller
        keeps it (batches may share it: nothing changes it), else worked out here.
        """
        b = int(np.shape(labels)[0])
        out: dict[str, JaggedIds] = {}
        for feature in spec.sparse:
            col = sparse.get(feature.name)
            if col is None:
                out[feature.name] = JaggedIds(np.empty(0, dtype=np.uint64), np.zeros(b + 1, dtype=np.int32))
            elif isinstance(col, JaggedIds):
                out[feature.name] = col
            else:
                out[feature.name] = JaggedIds.one_hot(col)
        ts = np.full(b, np.nan) if event_ts is None else np.asarray(event_ts, dtype=np.float64)
        return cls(
            labels=np.asarray(labels, dtype=np.float32),
            dense=np.asarray(dense, dtype=np.float32).reshape(b, -1),
            event_ts=ts,
            sparse=out,
            table_features=features_by_table if features_by_table is not None else table_features(spec),
            sources=list(sources),
            extra_labels={k: np.asarray(v, dtype=np.float32) for k, v in (extra_labels or {}).items()},
            weight=None if weight is None else np.asarray(weight, dtype=np.float32),
        )

    @classmethod
    def concat(cls, parts: Sequence[MicroBatch]) -> MicroBatch:
        """Join batches sample-wise (same features); sources are concatenated, not merged."""
        if not parts:
            raise ValueError("concat needs at least one batch")
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        sparse: dict[str, JaggedIds] = {}
        for name in first.sparse:
            jags = [p.sparse[name] for p in parts]
            lengths = np.concatenate([j.lengths() for j in jags])
            sparse[name] = JaggedIds.from_lengths(np.concatenate([j.values for j in jags]), lengths)
        return cls(
            labels=np.concatenate([p.labels for p in parts]),
            dense=np.concatenate([p.dense for p in parts]),
            event_ts=np.concatenate([p.event_ts for p in parts]),
            sparse=sparse,
            table_features=first.table_features,
            sources=[s for p in parts for s in p.sources],
            extra_labels={t: np.concatenate([p.extra_labels[t] for p in parts]) for t in first.extra_labels},
            weight=None
            if all(p.weight is None for p in parts)
            else np.concatenate([p.weights() for p in parts]),
        )


def table_features(spec: FeatureSpec) -> dict[str, list[str]]:
    """table name -> sparse feature names using it, in config order (tables without features omitted)."""
    out: dict[str, list[str]] = {}
    for feature in spec.sparse:
        out.setdefault(feature.table_name, []).append(feature.name)
    return out
