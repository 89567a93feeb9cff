"""The working copy: every row a trainer trains lives in the hot tier, and the step updates it there.

The hot tier (:mod:`kelp.store.hot.tier`) used to be a cache in front of the
store: a prefetched pull copied rows out of it, the step trained the copies,
and a separate push wrote the result back into the tier (hot rows) or through
to Redis (the rest). Between the prefetch and the push, the trainer needed an
overlay of in-flight updates (:mod:`kelp.daemon.ledger`) so that the next
batch never trained on a copy older than the last step, and every row outside
the tier cost a Redis write per step.

Here the tier is the only copy a trainer works on, as in TorchRec's dynamic
embedding and FBGEMM's cache: a resident row is authoritative and Redis holds
it as of its last write-back::

    prefetch thread        reserve(ids)   hits: pin;  misses: read from the store, enter the tier, pin
    main thread            gather(res)    the rows as they are *now* (no overlay: nothing is in flight)
                           step           forward, backward, row-wise Adagrad
                           apply(res, u)  written in place (dirty), unpinned; the ticket is the push number
    push thread            durable_through()   due rows written back once per period, however many
                                               steps wrote them; offsets commit by the durable ticket

Rules it keeps, beyond the tier's own:

* **pinned rows stay.** A reserved row is pinned until its step applied (or
  the batch was dropped): trims and staleness re-reads never remove it, so the
  step's gather finds every row its prefetch read, and its updates have a slot.
* **every admitted row enters.** A fetched admitted row enters the tier
  whatever its frequency (no ``min_count``, no room check): its update has
  nowhere else to go. The tier may hold more than ``capacity_rows`` until the
  next write-back's trim, by the rows that are dirty or pinned then; trims drop
  clean unpinned rows, the least frequent first (count-min estimate), so the
  long tail leaves first.
* **new rows are written soon.** A row admitted by this reservation, or one the
  store holds nothing for (its store copy is the init row, or none), is
  ``fresh``: once trained it is written at the next write-back, not at the end
  of the period, so serving sees a new id within a step or two. A kept row's
  update waits for its period (``writeback_every_steps`` / ``writeback_interval_s``).
* **nothing lost.** A write-back copies the due rows under the lock and writes
  them without it; a row that a step writes again meanwhile keeps its dirty flag
  (its ``last`` push moved) and is written at its next period. Offsets commit
  only once the schedule says every push up to theirs is in the store.

Used by the trainer's pipeline for one trainer (:mod:`kelp.daemon.pipeline`).
A trainer group with row owners still uses the tier's ``pull_many`` and
``push_many`` with the overlay, because another rank steps some of its rows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kelp.config import HotCacheConfig
from kelp.store.base import EmbeddingStore, PullResult
from kelp.store.hot.rows import HotRows, RowBatch
from kelp.store.hot.tier import HotRowCache, _add_misses, _weights
from kelp.store.rows.slots import host_view

__all__ = ["Reservation", "WorkingCopy"]


@dataclass
class _Held:
    """One width group's part of a reservation.

    ``slots``: each id's slot (-1: no row, the id is not admitted); ``outside``: positions with
    slot -1 and their pulled values (rows, state, updated_s) as the store answered;
    ``admitted_now``: bool per id, admitted by this reservation's read.
    """

    group: HotRows
    batch: RowBatch
    slots: np.ndarray
    admitted_now: np.ndarray
    outside: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    outside_rows: np.ndarray | None = None
    outside_state: np.ndarray | None = None
    outside_updated_s: np.ndarray | None = None


@dataclass
class Reservation:
    """The rows one prepared batch will train, pinned in the working copy until :meth:`WorkingCopy.apply`."""

    held: list[_Held]
    pushes: int
    """The tier's push count when it was made: a row written by a later push changed after its read."""
    done: bool = False


Rows = np.ndarray | Tensor
"""Row values or Adagrad state as a step hands them back: numpy, or a tensor on any device."""


class WorkingCopy(HotRowCache):
    """The hot tier, with the verbs a single trainer's pipeline trains through (see the module).

    Row values and Adagrad state live in tensors on ``device`` (the trainer's): :meth:`gather` hands
    the step tensors already there, and :meth:`apply` writes its tensors back in place, so a CUDA
    trainer's rows cross the bus only when they are read from or written to the store.
    """

    def __init__(
        self, inner: EmbeddingStore, cfg: HotCacheConfig, *, device: torch.device | str = "cpu", **kwargs: Any
    ) -> None:
        """As :class:`~kelp.store.hot.tier.HotRowCache` (``clock``, ``metrics``, ``owned``), on ``device``."""
        self.device = torch.device(device)
        super().__init__(inner, cfg, device=self.device, **kwargs)

    overlapped_rows = 0
    """Rows a step gathered that an earlier step wrote after their reservation (a running total): the
    updates a prefetched copy would have missed, which gathering at step time keeps."""

    def reserve(
        self, ids_by_table: Mapping[str, np.ndarray], *, occurrences: Mapping[str, np.ndarray] | None = None
    ) -> Reservation:
        """Pin the rows of ``ids_by_table`` (unique ids per table), reading the missing ones from the
        store into the tier; their occurrences feed admission and the tier's frequency sketch.

        Raises what the store's read raises, with nothing left pinned.
        """
        checked = {name: self.table(name).check_ids(raw) for name, raw in ids_by_table.items()}
        occurrences = occurrences or {}
        held: list[_Held] = []
        need: dict[str, np.ndarray] = {}
        need_occ: dict[str, np.ndarray] = {}
        with self._lock:
            now = self._clock()
            for g in self._groups:
                batch = g.batch(checked)
                if batch is None:
                    continue
                g.sketch.add(g.sketch_keys(batch.ids, batch.tags), _weights(batch, occurrences))
                slots = g.lookup(batch)
                self._reread_stale(g, batch, slots, now)
                miss = slots < 0
                g.table["pins"][slots[~miss]] += 1
                held.append(_Held(g, batch, slots, np.zeros(len(slots), dtype=bool)))
                _add_misses(batch, miss, occurrences, need, need_occ)
                self._count_hits(batch, miss)
        reservation = Reservation(held, pushes=self._schedule.pushes)
        try:
            fetched = self.inner.pull_many(need, count=True, occurrences=need_occ) if need else {}
        except BaseException:
            self.release(reservation)
            raise
        with self._lock:
            now = self._clock()
            for h in held:
                self._enter(h, fetched, now)
            self._update_gauges()
        return reservation

    def _enter(self, h: _Held, fetched: Mapping[str, PullResult], now: float) -> None:
        """The fetched rows of ``h``'s misses: admitted ones enter the tier pinned, the rest stay outside."""
        got = [fetched[name] for name in h.batch.names if name in fetched]
        if not got:
            return
        where = np.flatnonzero(h.slots < 0)
        rows = np.concatenate([f.rows for f in got])
        state = np.concatenate([f.state for f in got])
        admitted = np.concatenate([f.admitted for f in got])
        updated_s = np.concatenate(
            [f.updated_s if f.updated_s is not None else np.zeros(len(f), np.uint32) for f in got]
        )
        admitted_now = np.concatenate(
            [f.admitted_now if f.admitted_now is not None else np.zeros(len(f), bool) for f in got]
        )
        h.admitted_now[where] = admitted_now
        t = h.group.table
        enter = np.flatnonzero(admitted)
        if len(enter):
            at = where[enter]
            # Another caller of the tier's pull_many may have brought some in meanwhile: the tier's copy wins.
            present = t.lookup(h.batch.ids[at], h.batch.tags[at])
            new = present < 0
            if new.any():
                k = enter[new]
                present[new] = t.insert(
                    h.batch.ids[where[k]],
                    h.batch.tags[where[k]],
                    rows=rows[k],
                    state=state[k],
                    loaded=now,
                    updated_s=updated_s[k],
                    fresh=admitted_now[k] | (updated_s[k] == 0),
                )
                self._held += int(new.sum())
            t["pins"][present] += 1
            h.slots[at] = present
        out = np.flatnonzero(~admitted)
        h.outside = where[out]
        h.outside_rows, h.outside_state, h.outside_updated_s = rows[out], state[out], updated_s[out]

    def gather(self, reservation: Reservation) -> dict[str, PullResult]:
        """The reserved rows as they are now, per table in the order reserved (a pull's result whose
        ``rows`` and ``state`` are tensors on :attr:`device`)."""
        out: dict[str, PullResult] = {}
        with self._lock:
            for h in reservation.held:
                t = h.group.table
                inside = np.flatnonzero(h.slots >= 0)
                at = h.slots[inside]
                self.overlapped_rows += int((t["last"][at] > reservation.pushes).sum())
                if len(inside) == len(h.slots):  # the common case: one gather, no scatter
                    rows, state = _take(t["rows"], at), _take(t["state"], at)
                else:
                    rows, state = self._assemble(h, inside, at)
                updated_s = np.zeros(len(h.slots), dtype=np.uint32)
                updated_s[inside] = t["updated_s"][at]
                if len(h.outside):
                    updated_s[h.outside] = h.outside_updated_s
                admitted = h.slots >= 0
                parts = [h.batch.split(a) for a in (rows, state, admitted, updated_s, h.admitted_now)]
                out.update({name: PullResult(*(p[name] for p in parts)) for name in h.batch.names})
        return out

    def _assemble(self, h: _Held, inside: np.ndarray, at: np.ndarray) -> tuple[Tensor, Tensor]:
        """Rows and state of ``h``'s ids: resident ones from their slots, the rest as the store answered."""
        t = h.group.table
        n = len(h.slots)
        rows = torch.empty((n, h.group.dim), dtype=torch.float32, device=self.device)
        state = torch.empty(n, dtype=torch.float32, device=self.device)
        _put(rows, inside, _take(t["rows"], at))
        _put(state, inside, _take(t["state"], at))
        if len(h.outside):
            assert h.outside_rows is not None and h.outside_state is not None
            _put(rows, h.outside, torch.from_numpy(h.outside_rows).to(self.device))
            _put(state, h.outside, torch.from_numpy(h.outside_state).to(self.device))
        return rows, state

    def apply(self, reservation: Reservation, updates: Mapping[str, tuple[np.ndarray, Rows, Rows]]) -> int:
        """Write a step's updated rows in place (dirty) and unpin its reservation; returns the ticket
        (the tier's push number) that :meth:`durable_through` reaches once they are in the store.

        ``updates``: per table, admitted ids and their rows and state (tensors on any device, or
        numpy). Every updated id must be reserved: an admitted row of the batch. Rows holding a NaN
        or an infinity are refused (counted), as the store refuses them. Writes nothing to the store.
        """
        checked = {name: self._checked(name, *u) for name, u in updates.items()}
        groups = []  # per width group: its updated ids (table tags too), rows and state, finite only
        for g in self._groups:
            batch = g.batch({name: c[0] for name, c in checked.items()})
            if batch is not None:
                rows = _cat([checked[n][1] for n in batch.names])
                state = _cat([checked[n][2] for n in batch.names])
                groups.append((g, *self._finite_only_rows(batch, rows, state)))
        # A released reservation's rows may have left: look those up (and refuse the missing ones).
        held = {} if reservation.done else {id(h.group): h for h in reservation.held}
        with self._lock:
            writes = []
            for g, ids, tags, rows, state in groups:
                slots = _reserved_slots(held.get(id(g)), ids, tags)
                if slots is None:
                    slots = g.table.lookup(ids, tags)
                if (slots < 0).any():
                    lost = ids[slots < 0][:5].tolist()
                    raise RuntimeError(
                        f"working copy: {int((slots < 0).sum())} updated rows are not resident "
                        f"(ids {lost}...); only a reserved batch's admitted rows can be applied"
                    )
                writes.append((g, slots, rows, state))
            push = self._schedule.begin_push()
            stamp = np.uint32(time.time())
            for g, slots, rows, state in writes:
                t = g.table
                newly = slots[~t["dirty"][slots]]
                t["since"][newly] = push
                self._schedule.dirtied(push, len(newly))
                _put(t["rows"], slots, rows)
                _put(t["state"], slots, state)
                t.write(slots, updated_s=stamp, dirty=True, last=push)
                g.wrote_fresh(slots)
            self._unpin(reservation)
        return push

    def _checked(
        self, name: str, ids: np.ndarray, rows: Rows, state: Rows
    ) -> tuple[np.ndarray, Tensor, Tensor]:
        """One table's update as tensors on :attr:`device`, shaped as the store checks a push."""
        spec = self.table(name)
        ids = spec.check_ids(ids)
        rows_t = _tensor(rows, self.device)
        state_t = _tensor(state, self.device)
        if tuple(rows_t.shape) != (len(ids), spec.dim) or tuple(state_t.shape) != (len(ids),):
            raise ValueError(
                f"table {name}: rows must be [{len(ids)}, {spec.dim}] and state [{len(ids)}], "
                f"got {tuple(rows_t.shape)} and {tuple(state_t.shape)}"
            )
        return ids, rows_t, state_t

    def _finite_only_rows(
        self, batch: RowBatch, rows: Tensor, state: Tensor
    ) -> tuple[np.ndarray, np.ndarray, Tensor, Tensor]:
        """``batch``'s ids, tags, rows and state, less the rows holding a NaN or an infinity (counted
        and logged per table, as the store does): one check for all its tables."""
        if not len(batch.ids) or _finite_sum(rows, state):
            # A NaN or an infinity anywhere makes the sum one: a finite sum is the common case's proof,
            # one reduction where the row-wise check below costs several passes.
            return batch.ids, batch.tags, rows, state
        ok = (torch.isfinite(rows).all(dim=1) & torch.isfinite(state)).cpu().numpy()
        if ok.all():  # finite values whose sum overflowed
            return batch.ids, batch.tags, rows, state
        ids_by = batch.split(batch.ids)
        for name, good in batch.split(ok).items():
            if not good.all():
                self.quarantine.found(name, "nonfinite_push", ids_by[name][~good])
        keep = _device_index(np.flatnonzero(ok), self.device)
        return batch.ids[ok], batch.tags[ok], rows.index_select(0, keep), state.index_select(0, keep)

    def release(self, reservation: Reservation) -> None:
        """Unpin a reservation that will not be applied (its batch was dropped before training)."""
        with self._lock:
            self._unpin(reservation)

    def pinned_rows(self) -> int:
        """Rows some prepared batch still holds (reserved, not applied or released)."""
        with self._lock:
            return int(sum((g.table["pins"][: g.table.high] > 0).sum() for g in self._groups))

    def _unpin(self, reservation: Reservation) -> None:
        if reservation.done:
            return
        reservation.done = True
        for h in reservation.held:
            pinned = h.slots[h.slots >= 0]
            h.group.table["pins"][pinned] -= 1


def _take(column: Tensor, slots: np.ndarray) -> Tensor:
    """``column``'s values at ``slots``, on its device: a numpy gather where the column is in host
    memory (:func:`~kelp.store.rows.slots.host_view`), one ``index_select`` on a device."""
    view = host_view(column)
    if view is not None:
        return torch.from_numpy(view[slots])
    return column.index_select(0, _device_index(slots, column.device))


def _put(column: Tensor, slots: np.ndarray, values: Tensor) -> None:
    """``column[slots] = values`` (``values`` on ``column``'s device), as :func:`_take` reads."""
    view = host_view(column)
    if view is not None:
        view[slots] = values.numpy()
        return
    column.index_copy_(0, _device_index(slots, column.device), values)


def _cat(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``, joined by numpy where every part is in host memory (as :func:`_take`)."""
    views = [host_view(p) for p in parts]
    if all(v is not None for v in views):
        return torch.from_numpy(np.concatenate(views))
    return torch.cat(parts)


def _finite_sum(rows: Tensor, state: Tensor) -> bool:
    """Whether ``rows.sum() + state.sum()`` is finite: a NaN or an infinity anywhere makes it not
    (a finite sum that overflows does too; the caller checks row by row then)."""
    r, s = host_view(rows), host_view(state)
    if r is not None and s is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(np.isfinite(r.sum() + s.sum()))
    return bool(torch.isfinite(rows.sum() + state.sum()))


def _device_index(slots: np.ndarray, device: torch.device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(device)


def _tensor(values: Any, device: torch.device) -> Tensor:
    """float32 values on ``device``, without a copy where they already are."""
    if isinstance(values, Tensor):
        return values.detach().to(device=device, dtype=torch.float32)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(device)


def _reserved_slots(h: _Held | None, ids: np.ndarray, tags: np.ndarray) -> np.ndarray | None:
    """The slots of ``ids`` (with their table ``tags``) as ``h`` reserved them, when the update holds
    exactly the reservation's resident rows in order (a step's common case); otherwise None.

    Pinned slots cannot move or leave, so the reservation's slots are still theirs: a comparison
    of two arrays instead of a lookup of every updated id in the index."""
    if h is None:
        return None
    inside = h.slots >= 0
    if int(inside.sum()) != len(ids):
        return None
    if not (np.array_equal(h.batch.ids[inside], ids) and np.array_equal(h.batch.tags[inside], tags)):
        return None
    return h.slots[inside]
