"""Delimited text files as schema-v1 samples: the ``csv`` format's column mapping, joins and id rules.

A :class:`~kelp.config.CsvMapping` names, for each feature, the column that
feeds it. The file may have a header row or get its names from
``columns`` (MovieLens ``u.data`` has none); ``joins`` add the columns of
other files looked up by key (MovieLens ``u.item``: item -> genre flags), so a
whole public dataset maps without a preprocessing script::

    u.data  user item rating ts  ─┐
                                   ├─ join on item ─> label = rating >= 4, ts, user, item, genre
    u.item  item ... Action Comedy ─┘

Values become sample fields by fixed rules (written down in the README):

* an id follows the one id rule of every format (:mod:`kelp.consumers.ids`):
  ASCII digits with a value below 2**64 are that integer; anything else
  (``-3``, ``0x1f``, ``12.0``, ``alice``, 20 digits past 2**64) is a string id,
  hashed with xxh3_64 by the decoder exactly as a string id in an event is;
* an empty value is a missing feature (dense: the feature's default; sparse: no id);
* numbers parse as int, then float; anything else is left as text and the decoder
  rejects the row as ``bad_type`` (``label is str``, ``dense 'price' is str``); a
  number that is no valid label (not 0/1 for a binary label, NaN) is ``bad_label``,
  a NaN or infinite dense value ``bad_dense``;
* the labels of later tasks (``label_columns``) go into the sample's ``labels``
  map and are checked like the first (an empty cell is ``missing_label`` naming
  the task); ``label_threshold`` turns only the first label into 0/1;
* a weight cell (``weight_column``) becomes the sample's ``weight``: empty means 1,
  text is ``bad_type``, a negative, NaN or infinite number ``bad_weight``.

A one-label mapping without a weight writes neither key, so its rows cost
nothing extra to build or to decode.

:func:`iter_csv_numbered` also yields each row's 1-based line number in the file
(the header is line 1), so a rejected row is reported as ``FILE:LINE``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from kelp.config import CsvJoin, CsvMapping, FlagColumns
from kelp.consumers.errors import SourceUserError
from kelp.consumers.ids import digits_id
from kelp.consumers.textfiles import open_text

__all__ = ["csv_columns", "iter_csv", "iter_csv_numbered", "parse_id", "parse_number"]


def parse_number(value: str) -> float | int | str:
    """``"3"`` -> 3, ``"0.5"`` -> 0.5, anything else unchanged (the decoder rejects it with a reason)."""
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def parse_id(value: str) -> int | str:
    """A cell as the message's id: the integer when it is one (:mod:`kelp.consumers.ids`), else the text.

    The text stays text in the message (readable in a topic ``kelp produce``
    filled); the decoder hashes it, so the id is ``str_id(value)`` either way.

    >>> parse_id("42"), parse_id("007"), parse_id("-3"), parse_id("12.0"), parse_id("٣")
    (42, 7, '-3', '12.0', '٣')
    >>> parse_id(str(2**64))  # past uint64: a string id, not a rejected number
    '18446744073709551616'
    """
    number = digits_id(value)
    return value if number is None else number


def _header(path: Path, delimiter: str, columns: Sequence[str] | None, encoding: str) -> list[str]:
    if columns is not None:
        return list(columns)
    try:
        with open_text(path, encoding) as fh:
            return next(csv.reader(fh, delimiter=delimiter), [])
    except UnicodeDecodeError as exc:
        raise SourceUserError(f"{path}: not {encoding} text ({exc.reason}); set its encoding") from None


def _rows(
    path: Path, delimiter: str, columns: Sequence[str] | None, encoding: str
) -> Iterator[tuple[int, list[str]]]:
    """``(line, row)`` per data row (the header row skipped when the file has one), padded to the header's
    width; ``line`` is the 1-based line the row starts on (a quoted field may span several lines)."""
    width = len(_header(path, delimiter, columns, encoding))
    try:
        with open_text(path, encoding) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            if columns is None:
                next(reader, None)
            before = reader.line_num
            for row in reader:
                yield before + 1, row + [""] * (width - len(row)) if len(row) < width else row
                before = reader.line_num
    except UnicodeDecodeError as exc:
        raise SourceUserError(f"{path}: not {encoding} text ({exc.reason}); set its encoding") from None


def csv_columns(path: Path, mapping: CsvMapping) -> dict[str, list[str]]:
    """Every column a mapping can name: ``{"<file>": its columns}`` for the main file, then each join's.

    A joined file contributes all its columns but the key.
    """
    out = {str(path): _header(path, mapping.delimiter, mapping.columns, mapping.encoding)}
    for join in mapping.joins:
        header = _header(join.path, join.delimiter, join.columns, join.encoding)
        out[str(join.path)] = [c for c in header if c != join.key_column]
    return out


class _JoinedColumns:
    """One join, loaded: key -> the joined file's other columns (empty strings for an absent key)."""

    def __init__(self, join: CsvJoin) -> None:
        header = _header(join.path, join.delimiter, join.columns, join.encoding)
        if join.key_column not in header:
            raise SourceUserError(
                f"{join.path}: key column {join.key_column!r} is not among its columns ({', '.join(header)})"
            )
        key_at = header.index(join.key_column)
        keep = [i for i in range(len(header)) if i != key_at]
        self.columns = [header[i] for i in keep]
        self.missing = [""] * len(keep)
        self.rows: dict[str, list[str]] = {}
        for _line, row in _rows(join.path, join.delimiter, join.columns, join.encoding):
            self.rows.setdefault(row[key_at], [row[i] for i in keep])  # the first row of a key wins

    def lookup(self, key: str) -> list[str]:
        return self.rows.get(key, self.missing)


def _sort_key(value: str) -> tuple[int, float | str]:
    try:
        return (0, float(value))
    except ValueError:
        return (1, value)


def _flags(values: list[str], at: list[int], names: list[str], spec: FlagColumns) -> str | list[str] | None:
    """The names of the indicator columns set (a non-zero number); None when none is."""
    chosen: list[str] = []
    for i, name in zip(at, names, strict=True):
        number = parse_number(values[i].strip())
        if isinstance(number, int | float) and number != 0:
            if spec.take == "first":
                return name
            chosen.append(name)
    return chosen or None


def _add_extras(
    sample: dict[str, Any], values: list[str], extra: list[tuple[str, int]], weight_at: int | None
) -> None:
    """The later tasks' labels and the weight of one row, under the message keys the decoder reads.

    A task whose cell is empty is left out of ``labels``, so the decoder rejects
    the row as ``missing_label`` naming that task; an empty weight is left out
    (weight 1). Values stay as parsed: the decoder checks them as it checks any
    message's, so a CSV row and an event get the same reasons.
    """
    if extra:
        sample["labels"] = {task: parse_number(values[i]) for task, i in extra if values[i] != ""}
    if weight_at is not None and values[weight_at] != "":
        sample["weight"] = parse_number(values[weight_at])


def iter_csv(path: Path, mapping: CsvMapping, label: str = "label") -> Iterator[bytes]:
    """Schema-v1 messages, one per data row of ``path``, columns (joined ones too) mapped by ``mapping``."""
    return (message for _line, message in iter_csv_numbered(path, mapping, label))


def iter_csv_numbered(path: Path, mapping: CsvMapping, label: str = "label") -> Iterator[tuple[int, bytes]]:
    """``(line, message)``: :func:`iter_csv`'s messages with the 1-based line each row starts on."""
    header = _header(path, mapping.delimiter, mapping.columns, mapping.encoding)
    joins = [(header.index(j.column) if j.column in header else -1, _JoinedColumns(j)) for j in mapping.joins]
    names = header + [c for _at, j in joins for c in j.columns]
    where = {n: i for i, n in reversed(list(enumerate(names)))}  # the first column of a name wins

    def at(column: str) -> int:
        if column not in where:
            raise SourceUserError(f"{path}: column {column!r} not in its columns ({', '.join(names)})")
        return where[column]

    for (on, _join), spec in zip(joins, mapping.joins, strict=True):
        if on < 0:
            raise SourceUserError(
                f"{path}: join column {spec.column!r} is not among its columns ({', '.join(header)})"
            )
    label_at = at(mapping.label_column)
    extra = [(task, at(col)) for task, col in mapping.label_columns.items()]
    weight_at = at(mapping.weight_column) if mapping.weight_column else None
    rich = bool(extra) or weight_at is not None
    ts_at = at(mapping.event_time_column) if mapping.event_time_column else None
    dense = [(name, at(col)) for name, col in mapping.dense_columns.items()]
    sparse = [(name, at(col)) for name, col in mapping.sparse_columns.items()]
    flags = [(name, [at(c) for c in f.columns], f.columns, f) for name, f in mapping.flag_columns.items()]
    rows: Iterator[tuple[int, list[str]]] = _rows(path, mapping.delimiter, mapping.columns, mapping.encoding)
    if mapping.sort_by:
        key = at(mapping.sort_by)
        if key >= len(header):
            raise SourceUserError(f"{path}: sort_by must name a column of the file itself, not a joined one")
        rows = iter(sorted(rows, key=lambda r: _sort_key(r[1][key])))
    for line, row in rows:
        values = row + [v for on, join in joins for v in join.lookup(row[on])] if joins else row
        sample: dict[str, Any] = {"v": 1}
        raw_label = values[label_at]
        if raw_label != "":
            value = parse_number(raw_label)
            if mapping.label_threshold is not None and isinstance(value, int | float):
                value = int(value >= mapping.label_threshold)
            sample[label] = value
        if ts_at is not None and values[ts_at] != "":
            sample["ts"] = parse_number(values[ts_at])
        sample["dense"] = {name: parse_number(values[i]) for name, i in dense if values[i] != ""}
        ids: dict[str, Any] = {name: parse_id(values[i]) for name, i in sparse if values[i] != ""}
        for name, idx, cols, spec in flags:
            got = _flags(values, idx, cols, spec)
            if got is not None:
                ids[name] = got
        sample["sparse"] = ids
        if rich:
            _add_extras(sample, values, extra, weight_at)
        yield line, msgpack.packb(sample, use_bin_type=True)
