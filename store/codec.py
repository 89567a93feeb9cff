"""The row encoding: one compact, versioned binary value per stored row.

Layout (little-endian, no padding), ``16 + dim * itemsize`` bytes::

    offset  size  field
    0       1     format version (ROW_FORMAT_VERSION = 1)
    1       1     dtype code: 0 = float32, 1 = float16
    2       2     dim (uint16)
    4       4     access count (uint32; see docs/store.md for who maintains it)
    8       4     last update, unix seconds (uint32)
    12      4     row-wise Adagrad accumulator (float32)
    16      ...   embedding, dim x float32 or float16

A dim-16 float32 row is 80 bytes, float16 48 bytes. Encoding and decoding are
vectorized through a numpy structured dtype: ``encode`` makes one buffer and
slices it into per-row ``bytes`` (what redis-py needs for MSET), ``decode``
joins the values and reads them back with one ``frombuffer``.

>>> codec = RowCodec(dim=2, dtype="float32")
>>> values = codec.encode(np.array([[1.0, 2.0]], np.float32), np.array([0.5], np.float32), updated_s=7)
>>> len(values[0]), codec.decode(values).rows.tolist()
(24, [[1.0, 2.0]])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not
from typing import Literal

import numpy as np

from kelp.store.errors import RowFormatError

__all__ = ["HEADER_BYTES", "ROW_FORMAT_VERSION", "DecodedRows", "RowCodec"]

ROW_FORMAT_VERSION = 1
HEADER_BYTES = 16
_DTYPE_CODES = {"float32": 0, "float16": 1}


@dataclass
class DecodedRows:
    """Decoded values of a batch; ``present[i]`` is False where the value was missing (None)."""

    present: np.ndarray  # bool[n]
    rows: np.ndarray  # float32[n, dim]; zeros where not present
    state: np.ndarray  # float32[n]
    count: np.ndarray  # uint32[n]
    updated_s: np.ndarray  # uint32[n]

    def part(self, start: int, end: int) -> DecodedRows:
        """Rows ``start:end`` (views): one decode of several tables' values, split per table."""
        return DecodedRows(*(getattr(self, f.name)[start:end] for f in dataclasses.fields(self)))

    def in_order(self, order: list[np.ndarray]) -> DecodedRows:
        """Rows decoded in reply order put back in id order: ``order`` holds, per command, the id
        positions it read (replies arrive grouped by shard)."""
        n = len(self.present)
        if not order or (len(order) == 1 and np.array_equal(order[0], np.arange(n))):
            return self
        where = np.concatenate(order)
        out = []
        for f in dataclasses.fields(self):
            arr = getattr(self, f.name)
            unsorted = np.empty_like(arr)
            unsorted[where] = arr
            out.append(unsorted)
        return DecodedRows(*out)


class RowCodec:
    """Encodes and decodes rows of one table (fixed ``dim`` and storage ``dtype``)."""

    def __init__(self, dim: int, dtype: Literal["float32", "float16"] = "float32") -> None:
        if not 1 <= dim <= 65_535:
            raise ValueError(f"dim must be in [1, 65535], got {dim}")
        self.dim = dim
        self.dtype = dtype
        self.code = _DTYPE_CODES[dtype]
        emb = "<f4" if dtype == "float32" else "<f2"
        self.record = np.dtype(
            [
                ("version", "u1"),
                ("dtype", "u1"),
                ("dim", "<u2"),
                ("count", "<u4"),
                ("updated", "<u4"),
                ("state", "<f4"),
                ("emb", emb, (dim,)),
            ]
        )
        self.nbytes = self.record.itemsize
        self._void = np.dtype(f"V{self.nbytes}")

    def pack(
        self,
        rows: np.ndarray,
        state: np.ndarray,
        count: np.ndarray | int = 0,
        updated_s: np.ndarray | int = 0,
    ) -> np.ndarray:
        """Structured array of records (the bytes of every row, back to back)."""
        n = len(rows)
        rec = np.empty(n, dtype=self.record)
        rec["version"] = ROW_FORMAT_VERSION
        rec["dtype"] = self.code
        rec["dim"] = self.dim
        rec["count"] = count
        rec["updated"] = updated_s
        rec["state"] = state
        rec["emb"] = rows
        return rec

    def encode(
        self,
        rows: np.ndarray,
        state: np.ndarray,
        count: np.ndarray | int = 0,
        updated_s: np.ndarray | int = 0,
    ) -> list[bytes]:
        """float32[n, dim] rows and float32[n] state -> n ``bytes`` values."""
        rec = self.pack(rows, state, count, updated_s)
        return rec.view(self._void).tolist()

    def decode(self, values: list[bytes | None]) -> DecodedRows:
        """n values from MGET (``None`` = missing key) -> :class:`DecodedRows` of length n.

        Raises :class:`RowFormatError` if any present value is not a row of this
        table (wrong length, version, dtype or dim): a batch is never half-garbage.
        """
        # C-level passes only (map/compress, no Python per value): a training pull decodes ~45,000.
        flags = list(map(is_not, values, repeat(None)))
        present = np.array(flags, dtype=bool).reshape(len(values))
        stored = values if all(flags) else list(compress(values, flags))
        if set(map(len, stored)) - {self.nbytes}:  # type: ignore[arg-type]
            raise RowFormatError(f"stored value has the wrong length for a dim-{self.dim} {self.dtype} row")
        return self.decode_present(present, np.frombuffer(b"".join(stored), dtype=self._void))  # type: ignore[arg-type]

    def decode_present(self, present: np.ndarray, values: np.ndarray) -> DecodedRows:
        """bool[n] ``present`` and the present values as one ``V<nbytes>`` array, in order (what
        :func:`~kelp.store.resp_rows.read_rows` parses off the socket) -> :class:`DecodedRows`."""
        n = len(present)
        rows = np.zeros((n, self.dim), dtype=np.float32)
        state = np.zeros(n, dtype=np.float32)
        count = np.zeros(n, dtype=np.uint32)
        updated = np.zeros(n, dtype=np.uint32)
        if len(values):
            rec = values.view(self.record)
            self.check(rec)
            whole = len(values) == n
            at = slice(None) if whole else present
            rows[at] = rec["emb"]
            state[at] = rec["state"]
            count[at] = rec["count"]
            updated[at] = rec["updated"]
        return DecodedRows(present, rows, state, count, updated)

    def check(self, rec: np.ndarray) -> None:
        bad = (rec["version"] != ROW_FORMAT_VERSION) | (rec["dtype"] != self.code) | (rec["dim"] != self.dim)
        if bad.any():
            first = rec[np.argmax(bad)]
            raise RowFormatError(
                f"stored row has format version {first['version']}, dtype code {first['dtype']}, dim "
                f"{first['dim']}; this table expects version {ROW_FORMAT_VERSION}, code {self.code}, "
                f"dim {self.dim}"
            )
