"""Messages read straight from their bytes, a whole run at a time, once their layout is known.

A producer writes plain messages (see :func:`~kelp.consumers.single.read_plain`)
with the same bytes again and again: the same keys in the same order, every
value with the same msgpack encoding (float64 labels and dense values,
uint64 ids), only the values' bytes differ. :class:`PlainLayouts` learns that
layout from a message ``read_plain`` accepted. Then, for a run of records,
every record of the right length is checked with numpy (each byte that is
not part of a value must be equal, ``fixint`` values must stay below 0x80)
and the matching ones are read as columns straight from the bytes: no
msgpack unpacking, no dict or list per sample, nothing per sample in Python.

Those records are, byte for byte, plain messages with the learned structure
and numbers of the learned kinds, so ``read_plain`` would read them to the
same values; any record that does not match takes the usual path, which
gives every reject reason. Single-sample ingest spent most of its time
unpacking and walking such dicts (docs/performance.md).

:class:`PackedLayouts` does the same for packed columnar messages (what
:class:`~kelp.consumers.columnar.PackedRun` accepts): there only the bins'
contents differ between messages of one layout, and each column is cut out
of all of a run's messages at once instead of unpacking every message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kelp.consumers.columns import Cols, FieldLayout, one_id_each

__all__ = ["PackedLayouts", "PlainLayouts"]

_MAX_LAYOUTS = 8  # distinct layouts kept per decoder (one per message length)

# msgpack number encodings a layout may hold: tag -> (payload bytes, big-endian dtype).
_UINTS = {0xCC: (1, ">u1"), 0xCD: (2, ">u2"), 0xCE: (4, ">u4"), 0xCF: (8, ">u8")}
_FLOATS = {0xCA: (4, ">f4"), 0xCB: (8, ">f8")}
_FIXINT = (0, "fixint")


@dataclass(frozen=True)
class _Slot:
    """One number in the message: where its payload starts, its encoding, what it is."""

    role: str  # "label", "ts", "dense", "id"
    index: int  # dense column or sparse feature
    pos: int  # first payload byte (the tag byte itself for a fixint)
    size: int
    dtype: str


@dataclass(frozen=True)
class _Layout:
    length: int
    fixed_pos: np.ndarray  # positions of the bytes that must equal ...
    fixed_val: np.ndarray  # ... these
    fixint_pos: np.ndarray  # tag bytes of fixint values: must be < 0x80
    slots: tuple[_Slot, ...]
    has_dense: bool
    batch: int = 1  # samples per message


class _Layouts:
    """Layouts learned so far (one per message length) and the reading of runs that match them."""

    def __init__(self, layout: FieldLayout) -> None:
        self.layout = layout
        self._by_length: dict[int, _Layout] = {}

    def __bool__(self) -> bool:
        return bool(self._by_length)

    def knows(self, length: int) -> bool:
        return length in self._by_length

    def learn(self, raw: bytes) -> None:
        """Remember the layout of ``raw``, a message the matching reader accepted (ignored if unusual)."""
        if len(self._by_length) >= _MAX_LAYOUTS or len(raw) in self._by_length:
            return
        learned = self._scan(raw)
        if learned is not None:
            self._by_length[len(raw)] = learned

    def read(self, raws: Sequence[bytes], tags: Sequence[int]) -> tuple[list[Cols], list[int], int]:
        """Columns of the records that match a layout (one part per layout), the others' tags, and
        the matching records' bytes.

        ``tags[i]`` becomes the ``row_record`` of ``raws[i]``'s rows.
        """
        by_length: dict[int, list[int]] = {}
        for i, raw in enumerate(raws):
            by_length.setdefault(len(raw), []).append(i)
        tag_of = np.asarray(tags, dtype=np.int64)
        parts: list[Cols] = []
        rest: list[int] = []
        nbytes = 0
        for length, idx in by_length.items():
            lay = self._by_length.get(length)
            if lay is None:
                rest.extend(tag_of[idx].tolist())
                continue
            data = np.frombuffer(b"".join([raws[i] for i in idx]), dtype=np.uint8).reshape(len(idx), length)
            ok = (data[:, lay.fixed_pos] == lay.fixed_val).all(axis=1)
            if lay.fixint_pos.size:
                ok &= (data[:, lay.fixint_pos] < 0x80).all(axis=1)
            picked = tag_of[idx]
            rest.extend(picked[~ok].tolist())
            if ok.any():
                parts.append(self._columns(lay, data if ok.all() else data[ok], picked[ok]))
                nbytes += length * int(np.count_nonzero(ok))
        return parts, sorted(rest), nbytes

    def _scan(self, raw: bytes) -> _Layout | None:
        raise NotImplementedError

    def _columns(self, lay: _Layout, rows: np.ndarray, tags: np.ndarray) -> Cols:
        raise NotImplementedError


class PlainLayouts(_Layouts):
    """Layouts of plain single-sample messages (see the module docstring)."""

    def _scan(self, raw: bytes) -> _Layout | None:
        return _scan(raw, self.layout)

    def _columns(self, lay: _Layout, rows: np.ndarray, tags: np.ndarray) -> Cols:
        b = rows.shape[0]
        n_dense = len(self.layout.dense_names)
        n_sparse = len(self.layout.sparse_names)
        labels = np.empty(b, dtype=np.float64)
        ts = np.full(b, np.nan)
        dense = np.empty((b, n_dense), dtype=np.float64) if lay.has_dense else None
        ids = np.empty((n_sparse, b), dtype=np.uint64)
        groups: dict[tuple[int, str], list[_Slot]] = {}
        for slot in lay.slots:
            groups.setdefault((slot.size, slot.dtype), []).append(slot)
        for slots in groups.values():
            values = _gather(rows, slots)
            for j, slot in enumerate(slots):
                col = values[:, j]
                if slot.role == "id":
                    ids[slot.index] = col
                elif slot.role == "dense":
                    assert dense is not None
                    dense[:, slot.index] = col
                elif slot.role == "label":
                    labels[:] = col
                else:
                    ts[:] = col
        ones = one_id_each(b)
        return Cols(
            labels=labels,
            dense=np.tile(self.layout.defaults, (b, 1)) if dense is None else dense.astype(np.float32),
            ts=ts,
            values=list(ids),
            lengths=[ones] * n_sparse,
            bad_id_rows=[],
            row_record=tags.astype(np.int64),
        )


def _gather(rows: np.ndarray, slots: Sequence[_Slot]) -> np.ndarray:
    """[b, len(slots)]: the scalar numbers ``slots`` (all of one size and dtype) of every row."""
    if slots[0].dtype == "fixint":
        return rows[:, [s.pos for s in slots]]
    at = np.array([s.pos for s in slots])[:, None] + np.arange(slots[0].size)
    return np.ascontiguousarray(rows[:, at]).view(slots[0].dtype).reshape(rows.shape[0], len(slots))


class PackedLayouts(_Layouts):
    """Layouts of packed one-id-per-sample columnar messages (see the module docstring)."""

    def _scan(self, raw: bytes) -> _Layout | None:
        return _scan_packed(raw, self.layout)

    def _columns(self, lay: _Layout, rows: np.ndarray, tags: np.ndarray) -> Cols:
        b = rows.shape[0] * lay.batch
        by_role = {(s.role, s.index): s for s in lay.slots}

        def column(slot: _Slot) -> np.ndarray:  # a bin's contents, of all rows, one after the other
            return np.ascontiguousarray(rows[:, slot.pos : slot.pos + slot.size]).view(slot.dtype).reshape(-1)

        ts_slot = by_role.get(("ts", 0))
        if ts_slot is None:
            ts = np.full(b, np.nan)
        elif ts_slot.dtype == "<f8":
            ts = column(ts_slot)
        else:  # one number for the whole message
            ts = np.repeat(_gather(rows, [ts_slot])[:, 0].astype(np.float64), lay.batch)
        dense_slot = by_role.get(("dense", 0))
        n_dense = len(self.layout.dense_names)
        return Cols(
            labels=column(by_role[("label", 0)]),
            dense=np.tile(self.layout.defaults, (b, 1))
            if dense_slot is None
            else column(dense_slot).reshape(b, n_dense),
            ts=ts,
            values=[column(by_role[("id", f)]) for f in range(len(self.layout.sparse_names))],
            lengths=[one_id_each(b)] * len(self.layout.sparse_names),
            bad_id_rows=[],
            row_record=np.repeat(tags.astype(np.int64), lay.batch),
        )


class _Reader:
    """Just enough msgpack to walk a plain message and note where its numbers are."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.raw):
            raise ValueError("truncated")
        out = self.raw[self.pos : self.pos + n]
        self.pos += n
        return out

    def container(self, fix_lo: int, fix_hi: int, tag16: int) -> int:
        tag = self._take(1)[0]
        if fix_lo <= tag <= fix_hi:
            return tag - fix_lo
        if tag == tag16:
            return int.from_bytes(self._take(2), "big")
        raise ValueError("not a small map/array")

    def text(self) -> str:
        tag = self._take(1)[0]
        if 0xA0 <= tag <= 0xBF:
            return self._take(tag - 0xA0).decode("utf-8")
        if tag == 0xD9:
            return self._take(self._take(1)[0]).decode("utf-8")
        raise ValueError("not a string")

    def bin(self, role: str, index: int, size: int, dtype: str) -> _Slot:
        """A bin of exactly ``size`` bytes holding a little-endian ``dtype`` column."""
        tag = self._take(1)[0]
        if tag not in (0xC4, 0xC5, 0xC6):
            raise ValueError("not a bin")
        if int.from_bytes(self._take(1 << (tag - 0xC4)), "big") != size:
            raise ValueError("bin of another size")
        start = self.pos
        self._take(size)
        return _Slot(role, index, start, size, dtype)

    def count(self) -> int:
        """A non-negative int read as a fixed part of the layout (its bytes must match exactly)."""
        tag = self._take(1)[0]
        if tag < 0x80:
            return tag
        if tag in (0xCC, 0xCD, 0xCE):
            return int.from_bytes(self._take(1 << (tag - 0xCC)), "big")
        raise ValueError("not a count")

    def number(self, role: str, index: int, ints_only: bool) -> _Slot:
        tag = self.raw[self.pos]
        if tag < 0x80:
            self.pos += 1
            return _Slot(role, index, self.pos - 1, *_FIXINT)
        kinds = _UINTS if ints_only else {**_FLOATS, **{t: k for t, k in _UINTS.items() if t != 0xCF}}
        if tag not in kinds:  # uint64 only for ids: a float column would round it twice
            raise ValueError("not a number of a supported kind")
        size, dtype = kinds[tag]
        self.pos += 1
        start = self.pos
        self._take(size)
        return _Slot(role, index, start, size, dtype)


def _scan(raw: bytes, layout: FieldLayout) -> _Layout | None:
    """The layout of one plain message, or None if it holds anything else (then it is never used)."""
    r = _Reader(raw)
    slots: list[_Slot] = []
    has_dense = False
    try:
        for _ in range(r.container(0x80, 0x8F, 0xDE)):
            key = r.text()
            if key == "v":
                if r._take(1) != b"\x01":  # 1 as a fixint; the byte stays fixed, so matches have v == 1
                    return None
            elif key == layout.label_name:
                slots.append(r.number("label", 0, ints_only=False))
            elif key == "ts":
                slots.append(r.number("ts", 0, ints_only=False))
            elif key == "dense":
                if r.container(0x90, 0x9F, 0xDC) != len(layout.dense_names):
                    return None
                slots.extend(r.number("dense", j, ints_only=False) for j in range(len(layout.dense_names)))
                has_dense = True
            elif key == "sparse":
                if r.container(0x80, 0x8F, 0xDE) != len(layout.sparse_names):
                    return None
                for f, name in enumerate(layout.sparse_names):
                    if r.text() != name:
                        return None
                    slots.append(r.number("id", f, ints_only=True))
            else:
                return None
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    if r.pos != len(raw):
        return None
    return _layout_of(raw, slots, has_dense=has_dense, batch=1)


def _layout_of(raw: bytes, slots: list[_Slot], *, has_dense: bool, batch: int) -> _Layout:
    """Everything in ``raw`` but the slots' payloads is fixed; fixint slots only need to stay fixints."""
    fixed = np.ones(len(raw), dtype=bool)
    for slot in slots:
        fixed[slot.pos : slot.pos + max(slot.size, 1)] = False
    fixed_pos = np.flatnonzero(fixed)
    return _Layout(
        length=len(raw),
        fixed_pos=fixed_pos,
        fixed_val=np.frombuffer(raw, dtype=np.uint8)[fixed_pos].copy(),
        fixint_pos=np.array([s.pos for s in slots if s.dtype == "fixint"], dtype=np.int64),
        slots=tuple(slots),
        has_dense=has_dense,
        batch=batch,
    )


def _scan_packed(raw: bytes, layout: FieldLayout) -> _Layout | None:
    """The layout of one packed columnar message, or None if it holds anything else."""
    r = _Reader(raw)
    slots: list[_Slot] = []
    n = 0
    d = len(layout.dense_names)
    try:
        for _ in range(r.container(0x80, 0x8F, 0xDE)):
            key = r.text()
            if key == "v":
                if r._take(1) != b"\x01":
                    return None
            elif key == "batch":
                n = r.count()
            elif n <= 0:  # the columns' sizes depend on it: encode_columns writes it first
                return None
            elif key == layout.label_name:
                slots.append(r.bin("label", 0, 4 * n, "<f4"))
            elif key == "ts":
                tag = raw[r.pos]
                if tag in (0xC4, 0xC5, 0xC6):
                    slots.append(r.bin("ts", 0, 8 * n, "<f8"))
                else:
                    slots.append(r.number("ts", 0, ints_only=False))
            elif key == "dense":
                slots.append(r.bin("dense", 0, 4 * n * d, "<f4"))
            elif key == "sparse":
                if r.container(0x80, 0x8F, 0xDE) != len(layout.sparse_names):
                    return None
                for _ in layout.sparse_names:
                    f = layout.sparse_index.get(r.text())
                    if f is None or any(s.role == "id" and s.index == f for s in slots):
                        return None
                    slots.append(r.bin("id", f, 8 * n, "<u8"))
            else:
                return None
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    roles = {s.role for s in slots}
    ids = sum(s.role == "id" for s in slots)
    if r.pos != len(raw) or n <= 0 or "label" not in roles or ids != len(layout.sparse_names):
        return None
    return _layout_of(raw, slots, has_dense="dense" in roles, batch=n)
