"""``SlotTable``: uint64 id -> slot, plus named columns grown by doubling, with freed slots reused.

Four places keep "some values per id" in memory, and all use this one structure:
the memory backend (rows, and admission counters), the hot-row cache (rows on
the trainer's device), serving's local row cache, and the in-memory training
baseline (rows on the device)::

    index  IdIndex (store/rows/index.py)      id ──> slot
    ids    uint64[capacity]              the id held by each slot
    live   bool[capacity]                slot holds a row
    columns, by name, e.g.
           rows   float32[capacity, dim] numpy, or a torch tensor on a device
           state  float32[capacity]
           ...
    slots [0, high) were handed out at least once; freed ones are reused before high moves

Every operation takes whole arrays (no per-id Python loop). Growing doubles the
capacity and copies each column once. Not thread-safe: callers hold their lock.

>>> t = SlotTable({"rows": Column(np.float32, width=2), "hits": Column(np.uint32)}, capacity=4)
>>> slots = t.insert(np.array([7, 9], np.uint64), rows=np.ones((2, 2), np.float32))
>>> t.lookup(np.array([9, 5], np.uint64)).tolist(), float(t["rows"][slots].sum()), len(t)
([1, -1], 4.0, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kelp.store.rows.index import IdIndex

__all__ = ["Column", "SlotTable", "host_view"]


@dataclass(frozen=True)
class Column:
    """One named column: ``width`` values of ``dtype`` per slot (None: one); new slots read ``fill``.

    With ``device`` set the column is a torch tensor on that device and
    ``dtype`` a torch dtype; otherwise a numpy array.
    """

    dtype: Any
    width: int | None = None
    fill: float = 0
    device: Any = None

    def allocate(self, capacity: int) -> Any:
        shape = (capacity,) if self.width is None else (capacity, self.width)
        if self.device is not None:
            import torch

            return torch.full(shape, self.fill, dtype=self.dtype, device=self.device)
        if self.fill == 0:
            return np.zeros(shape, dtype=self.dtype)
        return np.full(shape, self.fill, dtype=self.dtype)


def host_view(column: Any) -> np.ndarray | None:
    """``column`` as a numpy array when its values sit in host memory (a numpy column, or a torch
    tensor on the CPU: a view sharing its storage), else None (a device tensor).

    Row-sized gathers and scatters go through numpy where they can: torch's CPU indexing kernels
    split each call over its intra-op threads, which on a busy host costs several times numpy's
    single-threaded copy in CPU and more in wall time."""
    if isinstance(column, np.ndarray):
        return column
    if column.device.type == "cpu" and not column.requires_grad:
        return column.numpy()
    return None


class _DeviceIndex:
    """``slots`` as an index tensor per device, made once per call (one host-to-device copy per call)."""

    def __init__(self, slots: np.ndarray) -> None:
        self.slots = slots
        self._on: dict[Any, Any] = {}

    def on(self, device: Any) -> Any:
        if device not in self._on:
            import torch

            self._on[device] = torch.from_numpy(np.ascontiguousarray(self.slots, dtype=np.int64)).to(device)
        return self._on[device]


class SlotTable:
    """Values per uint64 id in named columns (see the module docstring); ``table["rows"]`` is a column."""

    def __init__(self, columns: Mapping[str, Column], capacity: int = 1024, tagged: bool = False) -> None:
        self.capacity = max(1, int(capacity))
        self.index = IdIndex(self.capacity)
        self.tagged = tagged
        """Keys are (tag, id) pairs (``tags`` arguments, 0..253): one table for several id spaces."""
        self._specs = dict(columns)
        self._columns = {name: spec.allocate(self.capacity) for name, spec in self._specs.items()}
        self.ids = np.zeros(self.capacity, dtype=np.uint64)
        self.tags = np.zeros(self.capacity if tagged else 0, dtype=np.uint8)
        self.live = np.zeros(self.capacity, dtype=bool)
        self.high = 0
        self._free: list[np.ndarray] = []
        self.n_free = 0  # freed slots waiting for reuse

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, name: str) -> Any:
        return self._columns[name]

    @property
    def room(self) -> int:
        """How many rows fit before the columns must grow."""
        return self.capacity - self.high + self.n_free

    def lookup(self, ids: np.ndarray, tags: np.ndarray | None = None) -> np.ndarray:
        """int64[n] slot of each id (of each (tag, id) pair in a tagged table), -1 where absent."""
        return self.index.lookup(ids, tags)

    def insert(self, ids: np.ndarray, tags: np.ndarray | None = None, **values: Any) -> np.ndarray:
        """Add rows for unique ``ids`` that are not present; returns their int64[n] slots.

        Each keyword names a column and gives its values (an array of ``len(ids)``
        rows, or one scalar); columns not named read their ``fill``. Slots never
        handed out before already hold ``fill`` (columns are allocated with it), so
        only reused slots are refilled: an insert writes each value once.
        """
        unknown = set(values) - set(self._specs)
        if unknown:
            raise KeyError(f"unknown column(s) {sorted(unknown)}; columns: {sorted(self._specs)}")
        ids = np.asarray(ids, dtype=np.uint64)
        if (tags is not None) != self.tagged:
            raise ValueError("a tagged table takes tags with every id, an untagged one none")
        slots, reused = self._alloc(len(ids))
        self.index.insert(ids, slots, tags)
        self.ids[slots] = ids
        if tags is not None:
            self.tags[slots] = tags
        self.live[slots] = True
        if values:
            self.write(slots, **values)
        if reused:
            fills = {name: spec.fill for name, spec in self._specs.items() if name not in values}
            if fills:
                self.write(slots[:reused], **fills)
        return slots

    def remove(self, slots: np.ndarray) -> None:
        """Free live ``slots``: their ids leave the index; column values stay until a slot is reused."""
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) == 0:
            return
        self.index.delete(self.ids[slots], self.tags[slots] if self.tagged else None)
        self.live[slots] = False
        self._free.append(slots.copy())
        self.n_free += len(slots)

    def remove_ids(self, ids: np.ndarray) -> int:
        """Free the rows of those ``ids`` that are present; returns how many were."""
        slots = self.lookup(ids)
        slots = slots[slots >= 0]
        self.remove(slots)
        return len(slots)

    def live_slots(self) -> np.ndarray:
        """int64 slots holding a row, ascending."""
        return np.flatnonzero(self.live[: self.high])

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids uint64[k], slots int64[k])`` of every row."""
        slots = self.live_slots()
        return self.ids[slots], slots

    def write(self, slots: np.ndarray, **values: Any) -> None:
        """``column[slots] = value`` per named column; numpy values are copied to a torch column's device."""
        index = _DeviceIndex(slots)
        for name, value in values.items():
            column = self._columns[name]
            view = host_view(column)
            if view is not None:
                view[slots] = value
                continue
            if isinstance(value, np.ndarray):
                import torch

                column[index.on(column.device)] = torch.from_numpy(np.ascontiguousarray(value)).to(
                    column.device, column.dtype
                )
            else:
                column[index.on(column.device)] = value

    def read(self, slots: np.ndarray, *names: str) -> list[np.ndarray]:
        """``[column[slots] for each name]`` as numpy arrays (copied from the device for torch columns)."""
        index = _DeviceIndex(slots)
        out = []
        for name in names:
            column = self._columns[name]
            view = host_view(column)
            if view is not None:
                out.append(view[slots])
            else:
                out.append(column[index.on(column.device)].cpu().numpy())
        return out

    def reserve(self, rows: int) -> None:
        """Grow now so that slots ``[0, rows)`` exist."""
        if rows > self.capacity:
            self._grow(rows)

    def nbytes(self) -> int:
        """Bytes held by the columns, ids and live flags (not the index)."""
        total = self.ids.nbytes + self.live.nbytes
        for column in self._columns.values():
            total += (
                column.nbytes if isinstance(column, np.ndarray) else column.element_size() * column.numel()
            )
        return int(total)

    # -- allocation -----------------------------------------------------------------------------

    def _alloc(self, k: int) -> tuple[np.ndarray, int]:
        """``k`` slots, freed ones first; returns them and how many of them (a prefix) were reused."""
        out: list[np.ndarray] = []
        need = k
        while need and self._free:
            chunk = self._free.pop()
            take, rest = chunk[:need], chunk[need:]
            if len(rest):
                self._free.append(rest)
            out.append(take)
            need -= len(take)
        reused = k - need
        self.n_free -= reused
        if need:
            self.reserve(self.high + need)
            out.append(np.arange(self.high, self.high + need, dtype=np.int64))
            self.high += need
        return (np.concatenate(out) if out else np.zeros(0, dtype=np.int64)), reused

    def _grow(self, need: int) -> None:
        capacity = self.capacity
        while capacity < need:
            capacity *= 2
        for name, spec in self._specs.items():
            old = self._columns[name]
            new = spec.allocate(capacity)
            new[: self.capacity] = old
            self._columns[name] = new
        for attr in ("ids", "live", *(("tags",) if self.tagged else ())):
            old = getattr(self, attr)
            new = np.zeros(capacity, dtype=old.dtype)
            new[: self.capacity] = old
            setattr(self, attr, new)
        self.capacity = capacity
