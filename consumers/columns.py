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
    "first_label",
    "float_column",
    "has_extras",
    "ids_from_list",
    "is_one_id_each",
    "one_id_each",
    "read_extras",
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
    extra_tasks: tuple[str, ...] = ()  # the tasks after the first (features.labels), in config order
    binary: tuple[bool, ...] = (True,)  # per task: label.kind is binary

    @property
    def rich(self) -> bool:
        """Messages carry more than one label: the fast paths (one label, no weight) never apply."""
        return bool(self.extra_tasks)

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
            extra_tasks=spec.task_names()[1:],
            binary=tuple(t.kind == "binary" for t in spec.tasks),
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
    extra_labels: np.ndarray | None = None  # float64 [b, T-1]: the labels of the tasks after the first
    weight: np.ndarray | None = None  # float64 [b]; None: every row weighs 1


def has_extras(msg: dict[str, Any]) -> bool:
    """A message with a ``labels`` map or a ``weight``: only the readers that give every reason take it."""
    return "labels" in msg or "weight" in msg


def first_label(layout: FieldLayout, msg: dict[str, Any]) -> None:
    """Put the first task's label where every reader looks (``msg[label_name]``), from ``labels`` if there.

    Raises ``bad_type`` for a ``labels`` that is not a map, ``bad_label`` for a
    task the config does not have, ``missing_label`` naming a task with no label.
    """
    labels = msg.get("labels")
    tasks = (layout.label_name, *layout.extra_tasks)
    if labels is not None:
        if type(labels) is not dict:
            raise RejectError("bad_type", f"labels is {type(labels).__name__}, expected a map task -> label")
        unknown = [k for k in labels if k not in tasks]
        if unknown:
            raise RejectError("bad_label", f"labels: task {unknown[0]!r} is not configured")
        if layout.label_name in labels:
            msg[layout.label_name] = labels[layout.label_name]
    for task in tasks:
        if task not in msg and (labels is None or task not in labels):
            raise RejectError("missing_label", f"no {task!r} field")


def read_extras(layout: FieldLayout, msg: dict[str, Any], n: int | None) -> tuple[list[Any], Any]:
    """``(extra labels, weight)`` of one message: numbers for a single sample (``n`` None), else columns.

    A task's label is ``labels[task]`` when the message has a ``labels`` map,
    else the top-level field named after the task. No ``weight`` reads 1.
    """
    labels = msg.get("labels") or {}
    extras = []
    for task in layout.extra_tasks:
        value = labels.get(task, msg.get(task))
        extras.append(_number_or_column(value, n, f"label {task!r}"))
    weight = msg.get("weight")
    weight = 1.0 if weight is None and n is None else weight
    if weight is not None:
        weight = _number_or_column(weight, n, "weight")
    return extras, weight


def _number_or_column(value: Any, n: int | None, what: str) -> Any:
    if n is None:
        if type(value) is not float and type(value) is not int:
            raise RejectError("bad_type", f"{what} is {type(value).__name__}")
        return value
    if type(value) is float or type(value) is int:
        return np.full(n, float(value))
    return float_column(value, n, what)


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
