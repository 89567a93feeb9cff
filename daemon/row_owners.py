"""One writer per row in a trainer group: each row has an owner rank, which applies every rank's gradient.

Without an owner, two ranks that train the same row within a few steps each
read it, each write their own update over the whole row, and the later write
erases the earlier one (last writer wins; ``kelp bench scale`` measures the
loss). TorchRec's model-parallel tables and DES's synchronous training give
each row one owner; Kelp does the same for the writes:

* ``owner(id) = mix(id) mod world``: the same on every rank, for every table;
* every rank still pulls and trains its own batch's rows. A row another rank
  owns and this rank has not trained lately comes from the store, where the
  owner's updates arrive after its push and its hot tier's write-back: such a
  gradient can be stale, but it is never lost;
* after backward, each rank sends each admitted row's gradient to the row's
  owner (:meth:`RowOwners.exchange`: one all-to-all of lengths, one of ids,
  one of gradients per group step);
* the owner applies each rank's gradient of a row as its own row-wise Adagrad
  step, in rank order, to its own copy of the row, which is exact because
  nobody else writes it. That is what the ranks' pushes would have done one
  after another had none been lost (and what ``compose`` does inside Redis):
  a hot row trained by N ranks takes N steps per group step, as it would
  alone. Only the owner pushes the row;
* the owner sends the stepped rows back the way the gradients came
  (:meth:`RowOwners.return_rows`), and each rank records them in its update
  ledger: its next batches train on other ranks' rows as fresh as on its own,
  instead of on a store copy that lags the owner's pushes and write-backs;
* a rank's offsets wait until every owner's push of that step is durable:
  each rank reports its durable step in the exchange's first message
  (:attr:`RowOwners.group_durable` is the lowest), so a crash of any rank
  loses no update whose offsets were committed.

:class:`~kelp.daemon.pipeline.TrainPipeline` does the applying; this module
only decides owners and moves gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from kelp.daemon.group import TrainingGroup
from kelp.trainer.optim import SparseUpdate

__all__ = ["Contributions", "RowOwners", "SentRows", "owner_of"]


class SentRows(NamedTuple):
    """One table's rows a rank trained, as it sends them to their owners.

    ``ids`` uint64[K]; ``grads`` f32[K, dim]; ``rows`` f32[K, dim] and ``state`` f32[K]: the
    copy it trained on, which its owner may step from (see :class:`~kelp.daemon.written_rows.WrittenRows`).
    """

    ids: np.ndarray
    grads: np.ndarray
    rows: np.ndarray
    state: np.ndarray


Contributions = dict[str, list[SentRows]]
"""Per table, each sending rank's rows that this rank owns, in rank order (only ranks that sent some)."""

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: consecutive ids spread over every rank
_SHIFT = np.uint64(32)


def owner_of(ids: np.ndarray, world: int) -> np.ndarray:
    """The rank that owns each id's rows (int64 per id), the same on every rank and in every table.

    >>> owner_of(np.array([1, 2, 3, 4], dtype=np.uint64), 2).tolist()
    [1, 0, 0, 1]
    """
    mixed = (np.asarray(ids, dtype=np.uint64) * _MIX) >> _SHIFT
    return (mixed % np.uint64(world)).astype(np.int64)


@dataclass(frozen=True)
class _Exchanged:
    """One exchange's layout, for sending the stepped rows back the way the gradients came."""

    counts: np.ndarray  # rows sent, [owner, table]
    sent: list[list[np.ndarray]]  # ids sent, [owner][table]
    incoming: np.ndarray  # rows received, [sender, table]
    received: np.ndarray  # ids received, sender-major then table


class RowOwners:
    """This rank's side of the row ownership: which rows it writes, and the per-step gradient exchange.

    ``dims``: every store table's row width; the tables are exchanged in name order.
    """

    def __init__(self, group: TrainingGroup, dims: Mapping[str, int]) -> None:
        self.group = group
        self.tables = sorted(dims)
        self.dims = dict(dims)
        self._last: _Exchanged | None = None
        self.group_durable = 0
        """The lowest ``durable_step`` any rank sent in the last exchange: every rank's pushes of
        every step up to it are durable, so each rank may commit the offsets of those steps."""

    @property
    def rank(self) -> int:
        return self.group.rank

    def owned(self, ids: np.ndarray) -> np.ndarray:
        """bool per id: this rank writes its row (the hot tier re-reads the others sooner)."""
        return owner_of(ids, self.group.size) == self.group.rank

    def exchange(self, sent: Mapping[str, SentRows], durable_step: int) -> Contributions:
        """Every rank's rows that this rank owns, per table in rank order. Every rank calls it once
        per group step, with what it trained (nothing: a rank without a batch, or whose step was
        skipped).

        ``sent``: this rank's admitted rows, their gradients (each the gradient of the mean loss
        over its own batch, what a lone trainer applies) and the rows it trained on.
        ``durable_step``: every step up to it that this rank pushed is durable; the lowest over the
        group becomes :attr:`group_durable` (the same message, no extra collective).
        """
        size = self.group.size
        counts = np.zeros((size, len(self.tables)), dtype=np.int64)
        id_parts: list[list[np.ndarray]] = [[] for _ in range(size)]
        value_parts: list[list[np.ndarray]] = [[] for _ in range(size)]
        for t, name in enumerate(self.tables):
            rows = sent.get(name)
            if rows is None:  # every table keeps its place in each destination's list
                for d in range(size):
                    id_parts[d].append(np.zeros(0, np.uint64))
                    value_parts[d].append(np.zeros(0, np.float32))
                continue
            dest = owner_of(rows.ids, size)
            order = np.argsort(dest, kind="stable")
            counts[:, t] = np.bincount(dest, minlength=size)
            cuts = np.cumsum(counts[:, t])[:-1]
            values = np.column_stack([rows.grads, rows.rows, rows.state]).astype(np.float32, copy=False)
            by_dest = zip(
                np.split(np.asarray(rows.ids, np.uint64)[order], cuts),
                np.split(values[order], cuts),
                strict=True,
            )
            for d, (i, v) in enumerate(by_dest):
                id_parts[d].append(i)
                value_parts[d].append(v.reshape(-1))
        width = np.array([2 * self.dims[name] + 1 for name in self.tables], dtype=np.int64)
        tables = len(self.tables)
        header = np.column_stack([counts, np.full(size, durable_step, dtype=np.int64)])
        got_header = self.group.all_to_all(
            torch.from_numpy(header.reshape(-1)), [tables + 1] * size, [tables + 1] * size
        )
        got = got_header.numpy().reshape(size, tables + 1)
        incoming = got[:, :tables]
        self.group_durable = int(got[:, tables].min())
        ids_in = self.group.all_to_all(
            torch.from_numpy(_flat([p for parts in id_parts for p in parts], np.uint64).view(np.int64)),
            counts.sum(axis=1).tolist(),
            incoming.sum(axis=1).tolist(),
        )
        values_in = self.group.all_to_all(
            torch.from_numpy(_flat([p for parts in value_parts for p in parts], np.float32)),
            (counts @ width).tolist(),
            (incoming @ width).tolist(),
        )
        received = ids_in.numpy().view(np.uint64)
        self._last = _Exchanged(counts, id_parts, incoming, received)
        return self._split(incoming, received, values_in.numpy())

    def return_rows(self, stepped: Mapping[str, SparseUpdate]) -> dict[str, SparseUpdate]:
        """The owners' new rows and state of what this rank sent in the last :meth:`exchange`, from
        every owner but itself: the inverse all-to-all. Every rank calls it right after stepping its
        own rows (``stepped``: per table, every row it owns that any rank sent, ids ascending).

        A rank records them in its update ledger, so its next prefetched batches train on the rows
        as their owners left them instead of a copy several steps old.
        """
        last = self._last
        if last is None:
            raise RuntimeError("return_rows answers the last exchange(); there was none")
        size = self.group.size
        width = np.array([self.dims[name] + 1 for name in self.tables], dtype=np.int64)
        blocks: list[np.ndarray] = []
        at = 0
        for rank_counts in last.incoming:
            for name, n in zip(self.tables, rank_counts.tolist(), strict=True):
                if n:
                    update = stepped[name]
                    pos = np.searchsorted(update.ids, last.received[at : at + n])
                    blocks.append(np.column_stack([update.rows[pos], update.state[pos]]).reshape(-1))
                at += n
        send = np.concatenate(blocks).astype(np.float32, copy=False) if blocks else np.zeros(0, np.float32)
        got = self.group.all_to_all(
            torch.from_numpy(send), (last.incoming @ width).tolist(), (last.counts @ width).tolist()
        )
        flat = got.numpy()
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        at = 0
        for owner in range(size):
            for t, name in enumerate(self.tables):
                n, w = int(last.counts[owner, t]), self.dims[name] + 1
                if n and owner != self.rank:
                    parts.setdefault(name, []).append(
                        (last.sent[owner][t], flat[at : at + n * w].reshape(n, w))
                    )
                at += n * w
        out: dict[str, SparseUpdate] = {}
        for name, pieces in parts.items():
            block = np.concatenate([b for _, b in pieces])
            ids = np.concatenate([i for i, _ in pieces])
            out[name] = SparseUpdate(
                ids=ids, rows=np.ascontiguousarray(block[:, :-1]), state=block[:, -1].copy()
            )
        return out

    def _split(self, counts: np.ndarray, ids: np.ndarray, values: np.ndarray) -> Contributions:
        """The received ids and flat values (rank-major, then table) as each table's per-rank parts."""
        out: Contributions = {}
        at_id = at_value = 0
        for rank_counts in counts:
            for name, n in zip(self.tables, rank_counts.tolist(), strict=True):
                dim = self.dims[name]
                width = 2 * dim + 1
                if n:
                    block = values[at_value : at_value + n * width].reshape(n, width)
                    part = SentRows(
                        ids[at_id : at_id + n], block[:, :dim], block[:, dim : 2 * dim], block[:, -1]
                    )
                    out.setdefault(name, []).append(part)
                at_id += n
                at_value += n * width
        return out


def _flat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
