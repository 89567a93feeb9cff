"""From a :class:`~kelp.consumers.batch.MicroBatch` and pulled rows to pooled feature vectors.

This is the one place where batch arrays become device tensors
(:meth:`BatchTensors.from_batch`), so nothing else copies them twice.

Per table the trainer holds one leaf tensor ``rows`` f32[U, dim]: the rows of
the batch's ``unique_ids`` (pulled from the store, or gathered from the
in-memory baseline's tables). Each feature pools its own slice of the
table's ``inverse``::

    table "ads":  rows [U, dim]   (leaf, requires_grad)
                  inverse i64[N_t] = [2, 3, 2 | 2, 1, 3, 3, 0]
                                      C1       C2
    C1 pooled[B, dim] = embedding_bag(inverse[0:3], rows, offsets C1, mode)
    C2 pooled[B, dim] = embedding_bag(inverse[3:8], rows, offsets C2, mode)

After ``loss.backward()``, ``rows.grad`` [U, dim] is the gradient of every
unique id, summed over features and samples: exactly what the row-wise
optimizer needs, and proportional to unique ids, never to table size.
One-hot features (one id per sample) use a plain gather, which is cheaper
than an embedding bag and gives identical values.

A sequence feature (``pooling: none``) is not pooled: its rows are gathered
one per id, ``rows[indices]`` f32[N_f, dim], and handed to the model with the
batch's offsets (:func:`gather_sequences`, a
:class:`~kelp.trainer.model_api.SequenceInput`). The gather is in the graph
too, so its gradients land in the same ``rows.grad`` as the pooled features'.
A spec without sequence features has no sequence bags and takes the pooled
path alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the PyTorch convention
from torch import Tensor

from kelp.config import FeatureSpec
from kelp.consumers.batch import MicroBatch
from kelp.trainer.model_api import ModelInput, SequenceInput

__all__ = [
    "BatchTensors",
    "FeatureBag",
    "gather_sequences",
    "model_input",
    "pool_features",
    "rows_to_leaf",
]


@dataclass(frozen=True)
class FeatureBag:
    """One sparse feature's lookup plan on the device.

    * ``indices``: int64[N_f], rows of the table's ``rows`` tensor, this feature's slice of ``inverse``;
    * ``offsets``: int64[B + 1] bag boundaries (``include_last_offset``), or None when one-hot
      (never None for a sequence feature: the model reads them);
    * ``mode``: ``"sum"`` or ``"mean"`` (an empty bag pools to zeros either way), or
      ``"none"`` for a sequence feature.
    """

    name: str
    table: str
    indices: Tensor
    offsets: Tensor | None
    mode: str


@dataclass(frozen=True)
class BatchTensors:
    """A micro-batch's arrays on one device, ready for the forward pass.

    * ``labels``: f32[B];
    * ``dense``: f32[B, n_dense];
    * ``bags``: one :class:`FeatureBag` per pooled sparse feature, in config order;
    * ``unique_ids``: per table, the numpy uint64[U] ids whose rows the bags index
      (kept on the host: they only matter when rows cross the store boundary);
    * ``sequences``: one :class:`FeatureBag` per sequence feature (``pooling: none``),
      in config order; empty when there is none.
    """

    labels: Tensor
    dense: Tensor
    bags: tuple[FeatureBag, ...]
    unique_ids: dict[str, np.ndarray]
    sequences: tuple[FeatureBag, ...] = ()

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def from_batch(cls, batch: MicroBatch, spec: FeatureSpec, device: torch.device) -> BatchTensors:
        """Move labels, dense, inverse slices and offsets to ``device`` once (non-blocking copies)."""
        tables = batch.tables
        labels = _to(batch.labels, device)
        dense = _to(batch.dense, device)
        inverses = {name: _to(t.inverse, device) for name, t in tables.items()}
        bags: list[FeatureBag] = []
        sequences: list[FeatureBag] = []
        for feature in spec.sparse:
            table = tables[feature.table_name]
            indices = inverses[feature.table_name][table.feature_slices[feature.name]]
            offsets_np = batch.sparse[feature.name].offsets
            if feature.pooling == "none":
                offsets = _to(offsets_np.astype(np.int64), device)
                sequences.append(FeatureBag(feature.name, feature.table_name, indices, offsets, "none"))
                continue
            one_hot = indices.shape[0] == batch.size and bool(np.all(np.diff(offsets_np) == 1))
            offsets = None if one_hot else _to(offsets_np.astype(np.int64), device)
            bags.append(FeatureBag(feature.name, feature.table_name, indices, offsets, feature.pooling))
        unique = {name: t.unique_ids for name, t in tables.items()}
        return cls(
            labels=labels, dense=dense, bags=tuple(bags), unique_ids=unique, sequences=tuple(sequences)
        )


def _to(array: np.ndarray, device: torch.device) -> Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def to_device(values: np.ndarray | Tensor, device: torch.device) -> Tensor:
    """float32 ``values`` (numpy from the store, or a tensor: a working copy's rows) on ``device``,
    detached; no copy where they are there already."""
    tensor = _to(np.asarray(values, dtype=np.float32), device) if isinstance(values, np.ndarray) else values
    return tensor.detach().to(device, dtype=torch.float32)


def rows_to_leaf(rows: np.ndarray | Tensor, device: torch.device) -> Tensor:
    """f32[U, dim] rows (numpy from the store, or a tensor) -> a fresh leaf on ``device`` with grad."""
    return to_device(rows, device).requires_grad_(True)


def pool_features(bt: BatchTensors, rows: Mapping[str, Tensor]) -> list[Tensor]:
    """Pooled f32[B, dim_f] per sparse feature (config order) from per-table ``rows`` f32[U, dim]."""
    pooled: list[Tensor] = []
    for bag in bt.bags:
        weight = rows[bag.table]
        if bag.offsets is None:
            pooled.append(F.embedding(bag.indices, weight))
        else:
            pooled.append(
                F.embedding_bag(bag.indices, weight, bag.offsets, mode=bag.mode, include_last_offset=True)
            )
    return pooled


def gather_sequences(bt: BatchTensors, rows: Mapping[str, Tensor]) -> dict[str, SequenceInput]:
    """Per sequence feature (config order), every id's row ``rows[table][indices]`` and the offsets.

    ``F.embedding`` is the gather: its backward sums each id's gradient into
    its row of the leaf, as the pooled features' gathers do. Empty when the
    spec has no sequence feature.
    """
    return {
        bag.name: SequenceInput(F.embedding(bag.indices, rows[bag.table]), bag.offsets)  # type: ignore[arg-type]
        for bag in bt.sequences
    }


def model_input(
    bt: BatchTensors, pooled: list[Tensor], sequences: Mapping[str, SequenceInput] | None = None
) -> ModelInput:
    """The model's :class:`ModelInput`: ``bt.dense``, ``pooled`` keyed by feature name (config order)
    and the sequence features' rows (:func:`gather_sequences`; none when ``sequences`` is None)."""
    return ModelInput(
        dense=bt.dense,
        sparse={bag.name: vec for bag, vec in zip(bt.bags, pooled, strict=True)},
        sequences=dict(sequences) if sequences else {},
    )
