"""One writer per row in a trainer group: each row has an owner rank, which applies every rank's gradient.

Without an owner, two ranks that train the same row within a few steps each
read it, each write their own update over the whole row, and the later write
erases the earlier one (last writer wins; ``kelp bench scale`` measures the
loss). TorchRec's model-parallel tables and DES's synchronous training give
each row one owner; Kelp does the same for the writes:

* ``owner(id) = mix(id) mod world``: the same on every rank, for every table;
* every rank still pulls and trains its own batch's rows. A row another rank
  owns may be a few steps old when this rank reads it (the owner writes it
  with its own pipeline, and with the hot tier at its write-back): gradients
  can be stale, updates are never lost;
* after backward, each rank sends each admitted row's gradient, weighted by
  its samples, to the row's owner (:meth:`RowOwners.exchange`: one
  all-to-all of lengths, one of ids, one of gradients per group step);
* the owner sums a row's gradients over the ranks and divides by the group's
  samples (the gradient of the mean loss over every sample of the step, as for
  the dense parameters), then applies one row-wise Adagrad step to its own copy
  of the row, which is exact because nobody else writes it. Only the owner
  pushes the row.

:class:`~kelp.daemon.pipeline.TrainPipeline` does the applying; this module
only decides owners and moves gradients.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from kelp.daemon.group import TrainingGroup

__all__ = ["RowGrads", "RowOwners", "owner_of"]

RowGrads = Mapping[str, tuple[np.ndarray, np.ndarray]]
"""Per table: ``(ids uint64[K], grads f32[K, dim])``."""

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: consecutive ids spread over every rank
_SHIFT = np.uint64(32)


def owner_of(ids: np.ndarray, world: int) -> np.ndarray:
    """The rank that owns each id's rows (int64 per id), the same on every rank and in every table.

    >>> owner_of(np.array([1, 2, 3, 4], dtype=np.uint64), 2).tolist()
    [1, 0, 0, 1]
    """
    mixed = (np.asarray(ids, dtype=np.uint64) * _MIX) >> _SHIFT
    return (mixed % np.uint64(world)).astype(np.int64)


class RowOwners:
    """This rank's side of the row ownership: which rows it writes, and the per-step gradient exchange.

    ``dims``: every store table's row width; the tables are exchanged in name order.
    """

    def __init__(self, group: TrainingGroup, dims: Mapping[str, int]) -> None:
        self.group = group
        self.tables = sorted(dims)
        self.dims = dict(dims)

    @property
    def rank(self) -> int:
        return self.group.rank

    def owned(self, ids: np.ndarray) -> np.ndarray:
        """bool per id: this rank writes its row (the hot tier keeps only these)."""
        return owner_of(ids, self.group.size) == self.group.rank

    def exchange(self, sent: RowGrads, samples: int) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
        """Every rank's gradients for the rows this rank owns, summed per id and divided by the group's
        samples; and the group's samples. Every rank calls it once per group step.

        ``sent``: this rank's admitted rows and their gradients, each the gradient of the mean loss over
        its ``samples`` (0 for a rank without a batch, or one whose step was skipped). A row appears at
        most once per table in the answer, ids ascending.
        """
        size = self.group.size
        header = np.zeros((size, 1 + len(self.tables)), dtype=np.int64)
        header[:, 0] = samples
        id_parts: list[list[np.ndarray]] = [[] for _ in range(size)]
        grad_parts: list[list[np.ndarray]] = [[] for _ in range(size)]
        for t, name in enumerate(self.tables):
            ids, grads = sent.get(name, (np.zeros(0, np.uint64), np.zeros((0, self.dims[name]), np.float32)))
            dest = owner_of(ids, size)
            order = np.argsort(dest, kind="stable")
            counts = np.bincount(dest, minlength=size)
            header[:, 1 + t] = counts
            cuts = np.cumsum(counts)[:-1]
            weighted = np.asarray(grads, dtype=np.float32)[order] * np.float32(samples)
            for d, (i, g) in enumerate(
                zip(np.split(np.asarray(ids, np.uint64)[order], cuts), np.split(weighted, cuts), strict=True)
            ):
                id_parts[d].append(i)
                grad_parts[d].append(g.reshape(-1))
        width = np.array([self.dims[name] for name in self.tables], dtype=np.int64)
        got_header, _ = self.group.all_to_all(
            torch.from_numpy(header.reshape(-1)), [header.shape[1]] * size, [header.shape[1]] * size
        )
        incoming = got_header.numpy().reshape(size, -1)
        ids_in, _ = self.group.all_to_all(
            torch.from_numpy(np.concatenate([p for parts in id_parts for p in parts]).view(np.int64)),
            header[:, 1:].sum(axis=1).tolist(),
            incoming[:, 1:].sum(axis=1).tolist(),
        )
        grads_in, _ = self.group.all_to_all(
            torch.from_numpy(np.concatenate([p for parts in grad_parts for p in parts])),
            (header[:, 1:] @ width).tolist(),
            (incoming[:, 1:] @ width).tolist(),
        )
        total = int(incoming[:, 0].sum())
        received = (incoming[:, 1:], ids_in.numpy(), grads_in.numpy())
        return _summed(self.tables, self.dims, received, total), total


def _summed(
    tables: list[str],
    dims: Mapping[str, int],
    received: tuple[np.ndarray, np.ndarray, np.ndarray],
    total: int,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The received ``(counts [rank, table], ids, flat gradients)``, rank-major then table, as
    per-table unique ids and their gradient sums over the ranks, divided by ``total``."""
    counts, ids, grads = received
    per_table: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {name: ([], []) for name in tables}
    at_id = at_grad = 0
    for rank_counts in counts:
        for name, n in zip(tables, rank_counts.tolist(), strict=True):
            dim = dims[name]
            per_table[name][0].append(ids[at_id : at_id + n])
            per_table[name][1].append(grads[at_grad : at_grad + n * dim].reshape(n, dim))
            at_id += n
            at_grad += n * dim
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, (id_list, grad_list) in per_table.items():
        table_ids = np.concatenate(id_list).view(np.uint64)
        if not len(table_ids):
            continue
        order = np.argsort(table_ids, kind="stable")
        sorted_ids = table_ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        summed = np.add.reduceat(np.concatenate(grad_list)[order], starts, axis=0)
        out[name] = (sorted_ids[starts], summed / np.float32(max(total, 1)))
    return out
