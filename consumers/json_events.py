"""Events as users have them: JSON objects (or a plug-in decoder's dicts) mapped onto the features.

``source.json`` (:class:`~kelp.config.JsonMapping`) says where each field
is, as a dotted path into nested objects::

    {"clicked": 1, "ts": 1700000000.5,
     "user": {"id": "alice", "age": 31},
     "ctx": {"page": {"category": [12, "sports"]}}}

    json: {label_field: clicked, event_time_field: ts,
           dense_fields: {age: user.age}, sparse_fields: {user: user.id, cat: ctx.page.category}}

:class:`MappedDecoder` parses every record of a poll, walks the mapped paths
into plain lists, and builds the columns once per run with numpy; the value
checks (finite and binary labels, ``max_ids``, dense transforms and
finiteness) are the msgpack decoder's, shared through
:class:`~kelp.consumers.decode.Decoder`. Field rules:

* a missing path or ``null``: dense -> the feature's default, sparse -> no id,
  label -> ``missing_label``, event time -> no ts;
* the label, weight, event time and dense values are numbers (not ``true``/``false``),
  else ``bad_type``, unless ``casts`` declares how to read the path (:func:`cast_reader`:
  ``bool``, ``number``, ``seconds``, ``milliseconds``, ``iso8601``, ``iso8601_utc``);
  a value its cast cannot read is ``bad_type`` naming the field and the cast;
* a path through a value that is not an object is ``bad_type``;
* a sparse field is one id or a list of ids, read by the one id rule
  (:func:`kelp.consumers.ids.id_of`): a float, bool or out-of-range integer
  is ``bad_id``, an object ``bad_type``;
* a record that is not JSON, or not an object, is ``bad_json``.

Keys the mapping does not name are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kelp.config import FeatureSpec, JsonMapping
from kelp.consumers.columns import Cols, RejectError, one_id_each
from kelp.consumers.decode import Chunk, Decoder, RawRecord, Rejection
from kelp.consumers.errors import SourceUserError
from kelp.consumers.ids import MAX_ID, id_of
from kelp.consumers.textfiles import open_binary

__all__ = ["MappedDecoder", "cast_reader", "iter_json_lines", "parse_json"]

FieldPath = tuple[str, ...]  # a dotted path, split: ("ctx", "page", "id")


def parse_json(value: bytes) -> dict[str, Any]:
    """One JSON object; :class:`RejectError` ``bad_json`` for anything else."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise RejectError("bad_json", f"not JSON: {exc}"[:300]) from None
    if type(obj) is not dict:
        raise RejectError("bad_json", f"top level is {type(obj).__name__}, expected an object")
    return obj


def iter_json_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line, bytes)`` per non-blank line of a JSON Lines file (1-based; ``.gz`` read through gzip)."""
    with open_binary(path) as fh:
        for line_no, line in enumerate(fh, 1):
            text = line.strip()
            if text:
                yield line_no, text


def _split(path: str) -> FieldPath:
    return tuple(path.split("."))


def _get(obj: dict[str, Any], path: FieldPath) -> Any:
    """The value at ``path`` (None when absent); ``bad_type`` when a step is not an object."""
    value: Any = obj
    for depth, key in enumerate(path):
        if type(value) is not dict:
            if value is None:
                return None
            where = ".".join(path[:depth])
            raise RejectError(
                "bad_type", f"{'.'.join(path)}: {where} is {type(value).__name__}, not an object"
            )
        value = value.get(key)
    return value


def _number(value: Any, what: str) -> float | int:
    if type(value) is float or type(value) is int:
        return value
    hint = " (source.json.casts can declare how to read it)" if type(value) in (bool, str) else ""
    raise RejectError("bad_type", f"{what} is {type(value).__name__}, expected a number{hint}")


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: a hostile value must not make a huge error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_bool(value: Any) -> float | int:
    """``true``/``false`` -> 1/0; a number stays as it is (a topic may mix both)."""
    if value is True or value is False:
        return int(value)
    if type(value) is int or type(value) is float:
        return value
    raise ValueError(f"{_short(value)} is not true/false (casts: bool)")


def _as_number(value: Any) -> float | int:
    """A number, or a string holding one (``"9.5"``, ``" 3 "``, ``"1e3"``); never a bool."""
    if type(value) is int or type(value) is float:
        return value
    if type(value) is str:
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{_short(value)} is not a number (casts: number)")


def _epoch(value: Any, cast: str, unit: str) -> float | int:
    """An epoch time as a finite number: a ``"nan"`` string must not pass for a time."""
    try:
        t = _as_number(value)
    except ValueError:
        t = math.nan
    if not math.isfinite(t):
        raise ValueError(f"{_short(value)} is not a finite number of epoch {unit} (casts: {cast})")
    return t


def _as_milliseconds(value: Any) -> float:
    return _epoch(value, "milliseconds", "milliseconds") / 1000.0


def _as_seconds(value: Any) -> float | int:
    return _epoch(value, "seconds", "seconds")


def _iso8601(value: Any, zoneless_utc: bool) -> float:
    """Epoch seconds of an ISO-8601 string; a zone-less one only when ``zoneless_utc``."""
    cast = "iso8601_utc" if zoneless_utc else "iso8601"
    if type(value) is not str:
        raise ValueError(f"{_short(value)} is not an ISO-8601 string (casts: {cast})")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{_short(value)} is not an ISO-8601 time (casts: {cast})") from None
    if when.tzinfo is None:
        if not zoneless_utc:
            raise ValueError(
                f"{_short(value)} has no zone (Z or +hh:mm); casts: iso8601_utc reads such a time as UTC"
            )
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


_CASTS: dict[str, Callable[[Any], float | int]] = {
    "bool": _as_bool,
    "number": _as_number,
    "seconds": _as_seconds,
    "milliseconds": _as_milliseconds,
    "iso8601": lambda value: _iso8601(value, zoneless_utc=False),
    "iso8601_utc": lambda value: _iso8601(value, zoneless_utc=True),
}


def cast_reader(cast: str) -> Callable[[Any], float | int]:
    """The function reading a value under ``cast`` (:data:`kelp.config.json_mapping.Cast`).

    It returns the number (epoch seconds for the time casts) or raises
    ``ValueError`` with a one-line reason naming the cast; the caller adds the
    field and the reject reason.
    """
    return _CASTS[cast]


def _reader(cast: str | None, what: str) -> Callable[[Any], float | int]:
    """How one mapped field's value becomes a number: strictly, or by its declared cast (``bad_type``)."""
    if cast is None:
        return lambda value: _number(value, what)
    read = _CASTS[cast]

    def convert(value: Any) -> float | int:
        try:
            return read(value)
        except ValueError as exc:
            raise RejectError("bad_type", f"{what}: {exc}") from None

    return convert


def _ids(value: Any, name: str) -> list[int]:
    items = value if type(value) is list else (value,)
    out = []
    for x in items:
        try:
            out.append(id_of(x))
        except ValueError as exc:
            reason = "bad_id" if type(x) in (int, float, bool) else "bad_type"
            raise RejectError(reason, f"{name}: {exc}") from None
    return out


class _Group:
    """Mapped fields under one parent object (``ctx.page`` for ``ctx.page.id``): the parent is found once."""

    def __init__(self, parent: FieldPath) -> None:
        self.parent = parent
        self.keys: list[str] = []
        self.names: list[str] = []
        self.columns: list[int] = []


def _groups(fields: dict[str, str], index: dict[str, int]) -> list[_Group]:
    by_parent: dict[FieldPath, _Group] = {}
    for name, path in fields.items():
        *parent, key = _split(path)
        group = by_parent.setdefault(tuple(parent), _Group(tuple(parent)))
        group.keys.append(key)
        group.names.append(name)
        group.columns.append(index[name])
    return list(by_parent.values())


def _gather(obj: dict[str, Any], groups: list[_Group]) -> list[Any]:
    """The values of every field of ``groups``, in group order (None where absent)."""
    out: list[Any] = []
    for g in groups:
        parent = _get(obj, g.parent) if g.parent else obj
        if parent is None:
            out.extend([None] * len(g.keys))
        elif type(parent) is not dict:
            where = ".".join(g.parent)
            raise RejectError(
                "bad_type", f"{where}.{g.keys[0]}: {where} is {type(parent).__name__}, not an object"
            )
        else:
            out.extend(map(parent.get, g.keys))
    return out


_NUMBER = frozenset((int, float))
_INT = frozenset((int,))


class MappedDecoder(Decoder):
    """Decodes records by ``parse`` (bytes -> dict) and ``mapping`` into the chunks of :class:`Decoder`.

    ``parse`` is :func:`parse_json` for ``format: json`` or a plug-in decoder's
    ``decode`` (:func:`~kelp.consumers.plugin_decoder.parse_with`); it raises
    :class:`RejectError` for a record it cannot read. Fields under one parent
    object are read together, and a record whose values are all plain numbers
    and in-range integer ids (the common case) is checked with a few type-set
    comparisons instead of field by field.
    """

    def __init__(
        self,
        spec: FeatureSpec,
        mapping: JsonMapping,
        parse: Callable[[bytes], dict[str, Any]] = parse_json,
        max_message_bytes: int | None = None,
    ) -> None:
        super().__init__(spec, max_message_bytes)
        _check_mapping(spec, mapping)
        self._parse_record = parse
        casts = mapping.casts
        self._label = _split(mapping.label_field)
        self._label_name = mapping.label_field
        self._read_label = _reader(casts.get(mapping.label_field), f"label {mapping.label_field!r}")
        self._extra = [
            (_split(p), p, _reader(casts.get(p), f"label {p!r}"))
            for p in (mapping.labels[t] for t in self.layout.extra_tasks)
        ]
        self._weight = _split(mapping.weight_field) if mapping.weight_field else None
        self._weight_name = mapping.weight_field
        self._read_weight = _reader(casts.get(mapping.weight_field or ""), f"weight {mapping.weight_field!r}")
        self.label_fields = (
            f"label {mapping.label_field!r}",
            *(f"label {mapping.labels[t]!r}" for t in self.layout.extra_tasks),
        )
        self.weight_field = f"weight {mapping.weight_field!r}"
        self._ts = _split(mapping.event_time_field) if mapping.event_time_field else None
        ts_name = mapping.event_time_field
        self._read_ts = _reader(casts.get(ts_name or ""), f"event time {ts_name!r}")
        self._dense = _groups(mapping.dense_fields, self.layout.dense_index)
        self._sparse = _groups(mapping.sparse_fields, self.layout.sparse_index)
        dense_cols = [c for g in self._dense for c in g.columns]
        self._dense_names = [n for g in self._dense for n in g.names]
        self._dense_read = [
            _reader(casts.get(mapping.dense_fields[n]), f"dense {n!r}") for n in self._dense_names
        ]
        self._dense_defaults = [self.layout.default_row[c] for c in dense_cols]
        self._sparse_names = [n for g in self._sparse for n in g.names]
        self._layout_cols = (
            np.array(dense_cols, dtype=np.int64),
            np.array([c for g in self._sparse for c in g.columns], dtype=np.int64),
        )

    def decode(self, records: Sequence[RawRecord]) -> Chunk:
        """Decode a non-empty run of records from one topic partition (or file), in offset order."""
        rejections: list[Rejection] = []
        rows = _Rows(self.layout.defaults, *self._layout_cols, len(self._extra), self._weight is not None)
        limit = self.max_message_bytes
        nbytes = 0
        for i, rec in enumerate(records):
            raw = rec.value if rec.value is not None else b""
            nbytes += len(raw)
            try:
                if limit is not None and len(raw) > limit:
                    raise RejectError("oversize", f"{len(raw)} bytes > max_message_bytes {limit}")
                self._row(rows, i, self._parse_record(raw))
            except RejectError as rej:
                rejections.append(
                    Rejection(rej.reason, rej.detail, rec.topic, rec.partition, rec.offset, raw)
                )
        chunk = self._finish(rows.parts(), records, rejections)
        chunk.nbytes = nbytes
        return chunk

    def _row(self, rows: _Rows, record: int, obj: dict[str, Any]) -> None:
        """Add one sample to ``rows``; nothing is added if it raises."""
        label = _get(obj, self._label)
        if label is None:
            raise RejectError("missing_label", f"no {self._label_name!r} field")
        label = self._read_label(label)
        extras = []
        for path, name, read in self._extra:
            got = _get(obj, path)
            if got is None:
                raise RejectError("missing_label", f"no {name!r} field")
            extras.append(read(got))
        weight = 1.0
        if self._weight is not None:
            got = _get(obj, self._weight)
            if got is not None:
                weight = self._read_weight(got)
        t = math.nan
        if self._ts is not None:
            got = _get(obj, self._ts)
            if got is not None:
                t = self._read_ts(got)
        dense = _gather(obj, self._dense)
        if not set(map(type, dense)) <= _NUMBER:
            dense = [
                d if x is None else read(x)
                for x, d, read in zip(dense, self._dense_defaults, self._dense_read, strict=True)
            ]
        ids = _gather(obj, self._sparse)
        # Integers in [0, 2**64) are their own ids (the one id rule): a whole row of them is kept as is.
        if ids and set(map(type, ids)) == _INT and min(ids) >= 0 and max(ids) <= MAX_ID:
            rows.add_one_hot(record, label, t, dense, ids, extras=extras, weight=weight)
        else:
            rows.add(
                record,
                label,
                t,
                dense,
                [[] if x is None else _ids(x, n) for x, n in zip(ids, self._sparse_names, strict=True)],
                extras=extras,
                weight=weight,
            )


class _Rows:
    """Accepted samples of a run as Python lists, turned into columns once (one numpy call per column).

    Rows whose every sparse feature holds one integer id keep their ids as one
    list per row (converted by one ``np.array``); the others keep them per
    feature. :meth:`parts` gives one :class:`Cols` for each kind; the decoder
    puts the rows back in record order.
    """

    def __init__(
        self,
        defaults: np.ndarray,
        dense_cols: np.ndarray,
        sparse_cols: np.ndarray,
        n_extra: int = 0,
        weighted: bool = False,
    ) -> None:
        self.defaults, self.dense_cols, self.sparse_cols = defaults, dense_cols, sparse_cols
        self.n_extra, self.weighted = n_extra, weighted
        n_sparse = len(sparse_cols)
        # record, label, ts, dense, ids (fast) or lengths (slow), extra labels, weight
        self.fast: tuple[list[Any], ...] = ([], [], [], [], [], [], [])
        self.slow: tuple[list[Any], ...] = ([], [], [], [], [], [], [])
        self.values: list[list[int]] = [[] for _ in range(n_sparse)]

    def add_one_hot(
        self,
        record: int,
        label: float,
        t: float,
        dense: list[Any],
        ids: list[int],
        *,
        extras: list[float],
        weight: float,
    ) -> None:
        for column, value in zip(self.fast, (record, label, t, dense, ids, extras, weight), strict=True):
            column.append(value)

    def add(
        self,
        record: int,
        label: float,
        t: float,
        dense: list[Any],
        ids: list[list[int]],
        *,
        extras: list[float],
        weight: float,
    ) -> None:
        for values, got in zip(self.values, ids, strict=True):
            values.extend(got)
        lengths = [len(got) for got in ids]
        for column, value in zip(self.slow, (record, label, t, dense, lengths, extras, weight), strict=True):
            column.append(value)

    def parts(self) -> list[Cols]:
        out = []
        if self.fast[0]:
            b = len(self.fast[0])
            ids = np.array(self.fast[4], dtype=np.uint64).reshape(b, len(self.sparse_cols))
            ones = one_id_each(b)
            out.append(
                self._cols(self.fast, list(np.ascontiguousarray(ids.T)), [ones] * len(self.sparse_cols))
            )
        if self.slow[0]:
            b = len(self.slow[0])
            lengths = np.array(self.slow[4], dtype=np.int32).reshape(b, len(self.sparse_cols)).T
            values = [np.array(v, dtype=np.uint64) for v in self.values]
            out.append(self._cols(self.slow, values, [np.ascontiguousarray(ln) for ln in lengths]))
        return out

    def _cols(self, rows: tuple[list[Any], ...], values: list[np.ndarray], lengths: list[np.ndarray]) -> Cols:
        record, labels, ts, dense_rows = rows[:4]
        b = len(record)
        dense = np.empty((b, len(self.defaults)), dtype=np.float32)
        dense[:] = self.defaults
        if len(self.dense_cols):
            with np.errstate(over="ignore"):  # beyond float32 is inf: the decoder rejects it as bad_dense
                dense[:, self.dense_cols] = np.array(dense_rows, dtype=np.float32).reshape(
                    b, len(self.dense_cols)
                )
        order = np.empty(len(self.sparse_cols), dtype=np.int64)
        order[self.sparse_cols] = np.arange(len(self.sparse_cols))  # mapping order -> config order
        return Cols(
            labels=np.array(labels, dtype=np.float64),
            dense=dense,
            ts=np.array(ts, dtype=np.float64),
            values=[values[i] for i in order],
            lengths=[lengths[i] for i in order],
            bad_id_rows=[],
            row_record=np.array(record, dtype=np.int64),
            extra_labels=np.array(rows[5], dtype=np.float64).reshape(b, self.n_extra)
            if self.n_extra
            else None,
            weight=np.array(rows[6], dtype=np.float64) if self.weighted else None,
        )


def _check_mapping(spec: FeatureSpec, mapping: JsonMapping) -> None:
    """Every mapped name is a declared feature, and every sparse feature is mapped (else it has no ids)."""
    dense = {f.name for f in spec.dense}
    sparse = [f.name for f in spec.sparse]
    for kind, mapped, declared in (
        ("dense", mapping.dense_fields, dense),
        ("sparse", mapping.sparse_fields, sparse),
    ):
        for name in mapped:
            if name not in declared:
                raise SourceUserError(
                    f"source.json.{kind}_fields.{name}: {name!r} is not a declared {kind} feature"
                )
    tasks = spec.task_names()
    for task in mapping.labels:
        if task not in tasks[1:]:
            raise SourceUserError(
                f"source.json.labels.{task}: {task!r} is not a label after the first of features.labels "
                f"(the first, {tasks[0]!r}, is label_field)"
            )
    missing = [t for t in tasks[1:] if t not in mapping.labels]
    if missing:
        raise SourceUserError(f"source.json.labels: label(s) {', '.join(missing)} have no field")
    unmapped = [n for n in sparse if n not in mapping.sparse_fields]
    if unmapped:
        raise SourceUserError(
            f"source.json.sparse_fields: declared sparse feature(s) {', '.join(unmapped)} have no field "
            "(they would train with no ids)"
        )
