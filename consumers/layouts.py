"""Plain single-sample messages read straight from their bytes, a whole run at a time.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kelp.consumers.columns import Cols, FieldLayout, one_id_each

__all__ = ["PlainLayouts"]

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


class PlainLayouts:
    """Byte layouts of plain messages seen so far, and the reading of runs that match them."""

    def __init__(self, layout: FieldLayout) -> None:
        self.layout = layout
        self._by_length: dict[int, _Layout] = {}

    def __bool__(self) -> bool:
        return bool(self._by_length)

    def knows(self, length: int) -> bool:
        return length in self._by_length

    def learn(self, raw: bytes) -> None:
        """Remember the layout of ``raw``, a message ``read_plain`` accepted (ignored if unusual)."""
        if len(self._by_length) >= _MAX_LAYOUTS or len(raw) in self._by_length:
            return
        learned = _scan(raw, self.layout)
        if learned is not None:
            self._by_length[len(raw)] = learned

    def read(self, raws: Sequence[bytes], tags: Sequence[int]) -> tuple[list[Cols], list[int]]:
        """Columns of the records that match a layout (one part per layout), and the others' positions.

        ``tags[i]`` becomes the ``row_record`` of ``raws[i]``'s row; positions are indexes in ``raws``.
        """
        by_length: dict[int, list[int]] = {}
        for i, raw in enumerate(raws):
            by_length.setdefault(len(raw), []).append(i)
        parts: list[Cols] = []
        rest: list[int] = []
        for length, idx in by_length.items():
            lay = self._by_length.get(length)
            if lay is None:
                rest.extend(idx)
                continue
            data = np.frombuffer(b"".join([raws[i] for i in idx]), dtype=np.uint8).reshape(len(idx), length)
            ok = (data[:, lay.fixed_pos] == lay.fixed_val).all(axis=1)
            if lay.fixint_pos.size:
                ok &= (data[:, lay.fixint_pos] < 0x80).all(axis=1)
            picked = np.asarray(idx)
            rest.extend(picked[~ok].tolist())
            if ok.any():
                rows = data if ok.all() else data[ok]
                parts.append(self._columns(lay, rows, np.asarray(tags)[picked[ok]]))
        return parts, sorted(rest)

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
        for (size, dtype), slots in groups.items():
            if dtype == "fixint":
                values = rows[:, [s.pos for s in slots]]
            else:
                at = np.array([s.pos for s in slots])[:, None] + np.arange(size)
                values = np.ascontiguousarray(rows[:, at]).view(dtype).reshape(b, len(slots))
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
    fixed = np.ones(len(raw), dtype=bool)
    fixint = [s.pos for s in slots if s.dtype == "fixint"]
    for s in slots:
        fixed[s.pos : s.pos + max(s.size, 1)] = False
    fixed_pos = np.flatnonzero(fixed)
    return _Layout(
        length=len(raw),
        fixed_pos=fixed_pos,
        fixed_val=np.frombuffer(raw, dtype=np.uint8)[fixed_pos].copy(),
        fixint_pos=np.array(fixint, dtype=np.int64),
        slots=tuple(slots),
        has_dense=has_dense,
    )
