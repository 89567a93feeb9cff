"""What every kind of schema-v1 message decodes into before the value checks: columns, and a reject signal.

:mod:`~kelp.consumers.single` and :mod:`~kelp.consumers.columnar` each read
their kind of message into :class:`Cols`; :class:`~kelp.consumers.decode.Decoder`
concatenates them, runs the vectorised value checks and assembles a chunk.
:class:`FieldLayout` is the feature spec in the shape readers need (name ->
column index, ``max_ids``, defaults), computed once per decoder.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from kelp.config import FeatureSpec
from kelp.consumers.ids import str_id
from kelp.consumers.transforms import defaults_of

__all__ = [
    "U64_LIMIT",
    "Cols",
    "FieldLayout",
    "RejectError",
    "bin_array",
    "float_column",
    "ids_from_list",
    "is_one_id_each",
    "one_id_each",
]

U64_LIMIT = 1 << 64


class RejectError(Exception):
    """A record (or a field of it) fails the schema; ``reason`` is one of the documented reasons."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class FieldLayout:
    """The feature spec as column positions: what a reader needs to place each field."""

    dense_names: list[str]
    sparse_names: list[str]
    dense_index: dict[str, int]
    sparse_index: dict[str, int]
    max_ids: np.ndarray  # int32 [n_sparse]
    defaults: np.ndarray  # float32 [n_dense]: a missing dense value reads this
    default_row: list[float]
    label_name: str

    @classmethod
    def of(cls, spec: FeatureSpec) -> FieldLayout:
        dense = [f.name for f in spec.dense]
        sparse = [f.name for f in spec.sparse]
        defaults = defaults_of(spec.dense)
        return cls(
            dense_names=dense,
            sparse_names=sparse,
            dense_index={n: i for i, n in enumerate(dense)},
            sparse_index={n: i for i, n in enumerate(sparse)},
            max_ids=np.array([f.max_ids for f in spec.sparse], dtype=np.int32),
            defaults=defaults,
            default_row=defaults.astype(np.float64).tolist(),
            label_name=spec.label.name,
        )


@dataclass
class Cols:
    """Columns of one columnar message or of all single-sample messages of a run, before value checks."""

    labels: np.ndarray  # float64/32 [b]
    dense: np.ndarray  # float32 [b, d]
    ts: np.ndarray  # float64 [b]
    values: list[np.ndarray]  # per sparse feature uint64 [N_f]
    lengths: list[np.ndarray]  # per sparse feature int32 [b]
    bad_id_rows: list[np.ndarray]  # row indexes with a bad id (from conversion)
    row_record: np.ndarray  # int64 [b]: index of the record in the run


_ONE_ID_EACH: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def one_id_each(n: int) -> np.ndarray:
    """int32[n] of ones, read-only: the lengths column of every one-hot feature of a fast-path read.

    The fast paths hand the same array to all features; read-only, so nothing can write
    through one feature's lengths into another's. It is also remembered (weakly), so the
    batcher can tell one id per row without reading the column (:func:`is_one_id_each`).
    """
    ones = np.ones(n, dtype=np.int32)
    ones.flags.writeable = False
    _ONE_ID_EACH[id(ones)] = ones
    return ones


def is_one_id_each(lengths: np.ndarray) -> bool:
    """True if ``lengths`` is (exactly, not just equal to) an array made by :func:`one_id_each`."""
    return _ONE_ID_EACH.get(id(lengths)) is lengths


def bin_array(raw: bytes, dtype: str, count: int, what: str) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    if len(raw) != count * itemsize:
        raise RejectError("bad_shape", f"{what}: {len(raw)} bytes, expected {count} x {itemsize}")
    return np.frombuffer(raw, dtype=dtype)


def float_column(value: Any, n: int, what: str, dtype: str = "<f4") -> np.ndarray:
    if isinstance(value, bytes):
        return bin_array(value, dtype, n, what)
    if not isinstance(value, list):
        raise RejectError("bad_type", f"{what}: expected a list or packed bytes, got {type(value).__name__}")
    if len(value) != n:
        raise RejectError("bad_shape", f"{what}: {len(value)} values for a batch of {n}")
    try:
        return np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise RejectError("bad_type", f"{what}: non-numeric value") from None


def ids_from_list(items: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 ids, bad mask) for a list of int/str ids; bad = negative, too large, float, bool, other.

    Integers are converted by numpy in one call; only strings (and odd values) are read one by one,
    each string by :func:`~kelp.consumers.ids.str_id`.
    """
    arr = np.array(items) if items else np.empty(0, dtype=np.uint64)
    kind = arr.dtype.kind
    if kind == "u":
        return arr.astype(np.uint64, copy=False), np.zeros(arr.size, dtype=bool)
    if kind == "i":
        bad = arr < 0
        return arr.astype(np.uint64), bad
    # Slow path: strings, floats, bools or ints beyond int64 mixed in.
    out = np.zeros(len(items), dtype=np.uint64)
    bad = np.zeros(len(items), dtype=bool)
    for i, x in enumerate(items):
        t = type(x)
        if t is int and 0 <= x < U64_LIMIT:
            out[i] = x
        elif t is str:  # digits are that integer, anything else its hash (kelp.consumers.ids)
            try:
                out[i] = str_id(x)
            except UnicodeEncodeError:  # a lone surrogate (a lenient JSON parser's): no bytes to hash
                bad[i] = True
        else:
            bad[i] = True
    return out, bad
