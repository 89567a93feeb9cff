"""Per-row Redis commands packed by numpy: one fixed-width RESP record per row, no Python object per row.

The bucketed row layout (:mod:`kelp.store.redis.buckets`) touches a row with one
``HGET``/``HSET``/``HDEL`` on its bucket: ~45,000 commands per training step.
Packed one by one (``hiredis.pack_command``) that is ~45,000 argument tuples
and a Python ``bytes`` per key, field and value. But every argument of such a
command has a fixed width per table (bucket key, 8-byte id, row value), so
the wire form of one command is a fixed-width record, and a whole batch is
one fixed-width record per row, laid out in one pass by ``kelp_native.pack_rows``
(with the GIL released, so a write-back's packing runs beside the step)::

    *3\\r\\n$4\\r\\nHGET\\r\\n$17\\r\\n<bucket key>\\r\\n$8\\r\\n<id>\\r\\n      (one record per row)

:func:`pack_commands` builds it from constant command words and per-row
columns; replies are read with :func:`read_replies`.

>>> keys = np.array([b"k1", b"k2"], dtype="V2")
>>> pack_commands(("HGET",), keys, np.array([b"a", b"b"], dtype="V1"))[:29]
b'*3\\r\\n$4\\r\\nHGET\\r\\n$2\\r\\nk1\\r\\n$1\\r\\na\\r\\n'
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
from kelp_native import pack_rows

from kelp.store.redis.client_internals import hiredis_reader, not_enough_data, read_more, reads_from_socket

__all__ = [
    "GroupedCommands",
    "cut_runs",
    "first_error",
    "pack_commands",
    "pack_grouped",
    "pack_runs",
    "read_replies",
]

MAX_ROWS = 64
"""Rows per grouped command (:func:`pack_grouped`): a bigger group is split into several commands."""
PART_ROWS = 32_768
"""Rows per lazily packed part of a :class:`GroupedCommands` (~3 MB of dim-16 rows)."""


@functools.lru_cache(maxsize=4096)
def _head(words: tuple[str, ...], arguments: int) -> bytes:
    """A command's array header and its constant ``words``, before its ``arguments`` more arguments."""
    constant = b"".join(f"${len(w)}\r\n{w}\r\n".encode() for w in words)
    return f"*{len(words) + arguments}\r\n".encode() + constant


def pack_commands(words: tuple[str, ...], *columns: np.ndarray, rows: np.ndarray | None = None) -> bytes:
    """One command per row: the constant ``words`` (e.g. ``("HSET",)``), then one argument per column.

    Each column is a 1-d array of a fixed-width void (``V<w>``) or bytes
    dtype: row ``i``'s argument is its ``w`` raw bytes (no trailing-NUL
    stripping: a numpy ``S`` column is read as ``V``). ``rows``: the rows to
    take, in that order (int64 positions), instead of all: the commands are
    packed straight from the columns, with no gathered copy of each first.
    """
    return _records(_head(words, len(columns)), columns, rows)


def pack_runs(words: tuple[str, ...], lengths: np.ndarray, *columns: np.ndarray) -> bytes:
    """One command per run of rows: command ``j`` is ``words`` then the arguments of the next
    ``lengths[j]`` rows (one per column each), e.g. ``MGET k1 k2 k3`` or ``MSET k1 v1 k2 v2``.

    A Redis Cluster pull has one ``MGET`` per hash-tag bucket, ~1,600 of ~30 keys each:
    built one by one each costs its own round of Python planning. Here the rows are packed once
    (:func:`pack_commands`' records, without a head) and each command is its head plus
    a slice of them.

    >>> pack_runs(("MGET",), np.array([2, 1]), np.array([b"a", b"b", b"c"], "V1")).split(b"\\r\\n")[:9]
    [b'*3', b'$4', b'MGET', b'$1', b'a', b'$1', b'b', b'*2', b'$4']
    """
    n = len(columns[0]) if columns else 0
    if int(np.sum(lengths)) != n:
        raise ValueError(f"runs of {int(np.sum(lengths))} rows for {n} rows")
    blob = _records(b"", columns)
    size = len(blob) // n if n else 0
    parts: list[bytes] = []
    at = 0
    for k in lengths.tolist():
        parts.append(_head(words, k * len(columns)))
        parts.append(blob[at : at + k * size])
        at += k * size
    return b"".join(parts)


def _records(head: bytes, columns: tuple[np.ndarray, ...], rows: np.ndarray | None = None) -> bytes:
    """One fixed-width record per row (of ``rows``, or all): ``head``, then each column's value as a
    RESP bulk string."""
    n = len(columns[0]) if columns else 0
    if any(len(c) != n for c in columns):
        raise ValueError("every column needs one value per command")
    raw = [_raw(c) for c in columns]
    widths = [c.dtype.itemsize for c in columns]
    picked = None if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    return pack_rows(head, raw, widths, n, picked)


def _raw(column: np.ndarray) -> np.ndarray:
    """A column's bytes, row after row, as the flat uint8 array the native packer reads."""
    if column.dtype.itemsize == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.ascontiguousarray(column).view(np.uint8).reshape(-1)


def cut_runs(sorted_groups: np.ndarray, max_rows: int) -> np.ndarray:
    """Where each run starts in ``sorted_groups`` (equal values adjacent): at every change of value,
    and every ``max_rows`` rows within one value, so no run holds more than ``max_rows`` rows.

    >>> cut_runs(np.array([3, 3, 3, 5, 8, 8]), 2).tolist()
    [0, 2, 3, 4]
    """
    n = len(sorted_groups)
    first = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])[:n]  # none when empty
    rank = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    return np.flatnonzero(rank % max_rows == 0)


class GroupedCommands:
    """Commands that each carry a run of rows sharing a group (:func:`pack_grouped`), packed lazily.

    Iterating yields the wire form in parts of at most ``part_rows`` rows, packed
    as they are asked for: the pipeline sends each part as soon as it is packed,
    so Redis works through the first parts while the client packs the next (packing
    a hot tier's whole flush first would keep Redis idle for about as long as it then writes).
    Iterating again packs again (the plan runner retries a failed pipeline whole).
    """

    def __init__(
        self,
        words: tuple[str, ...],
        group: np.ndarray,
        key: np.ndarray,
        row_columns: tuple[np.ndarray, ...],
        *,
        max_rows: int,
        part_rows: int,
    ) -> None:
        self._words, self._key, self._columns, self._part_rows = words, key, row_columns, part_rows
        self._order = np.argsort(group, kind="stable")
        self._starts = cut_runs(group[self._order], max_rows)
        self._lengths = np.diff(np.r_[self._starts, len(group)])
        self.count = len(self._starts)
        """Commands, so replies, in the payload."""

    def __iter__(self) -> Iterator[bytes]:
        for k in np.unique(self._lengths).tolist():
            firsts = self._starts[self._lengths == k]
            per_part = max(1, self._part_rows // k)
            for lo in range(0, len(firsts), per_part):
                first = firsts[lo : lo + per_part]
                columns = [self._key[self._order[first]]]
                for j in range(k):
                    rows = self._order[first + j]
                    columns.extend(c[rows] for c in self._columns)
                yield pack_commands(self._words, *columns)


def pack_grouped(
    words: tuple[str, ...],
    group: np.ndarray,
    key: np.ndarray,
    *row_columns: np.ndarray,
    max_rows: int = MAX_ROWS,
    part_rows: int = PART_ROWS,
) -> GroupedCommands:
    """One command per run of rows sharing ``group``: ``words``, the group's ``key``, then each row's
    ``row_columns`` in turn (``HSET bucket f1 v1 f2 v2 ...``).

    Why: Redis spends about as much per command (parsing, dispatch, the reply) as on
    the work itself. Rows that share a bucket (a hot tier's flush puts ~5 rows in
    each) are written with one command, which lowers Redis's CPU per row written
    (docs/performance.md). Groups of more than ``max_rows`` rows
    become several commands. Commands come out ordered by size, not by row, so a
    (key, field) must appear once per call, as the store's contract already says
    (ids are unique per table).

    >>> keys, fields = np.array([b"a", b"b", b"a"], "V1"), np.array([b"f", b"g", b"h"], "V1")
    >>> cmds = pack_grouped(("HSET",), np.array([7, 3, 7]), keys, fields, np.array([b"x", b"y", b"z"], "V1"))
    >>> cmds.count, [c.replace(b"\\r\\n", b" ") for c in b"".join(cmds).split(b"HSET")]
    (2, [b'*4 $4 ', b' $1 b $1 g $1 y *6 $4 ', b' $1 a $1 f $1 x $1 h $1 z '])
    """
    return GroupedCommands(words, group, key, row_columns, max_rows=max_rows, part_rows=part_rows)


def read_replies(conn: Any, n: int) -> list[Any]:
    """Read ``n`` replies from a redis-py connection, straight from its hiredis reader when it has one.

    redis-py's ``Connection.read_response`` spends Python per reply (health
    checks, push handling); with ~45,000 per-row replies per step that is a
    large share of a pull (docs/performance.md). Error replies come back as
    exception instances (as in a pipeline), never raised here.
    """
    if not reads_from_socket(conn):  # the pure-Python parser
        return [_read_one(conn) for _ in range(n)]
    pending = not_enough_data()
    out: list[Any] = []
    gets = hiredis_reader(conn).gets
    step = 64  # replies asked for per round: a few wasted calls after the buffer runs dry, not n
    while len(out) < n:
        want = min(step, n - len(out))
        got = [gets() for _ in range(want)]
        if got[-1] is pending:
            got = got[: got.index(pending)]
            read_more(conn)
            step = 64
        else:
            step = min(step * 2, 4096)
        out += got
    error = first_error(out, ConnectionError)
    if error is not None:
        raise error
    return out


_PLAIN = {bytes, int, type(None), list}
"""Reply types that are never errors (hiredis returns an error reply as an exception instance)."""


def first_error(replies: list[Any], kind: type[BaseException]) -> BaseException | None:
    """The first reply that is a ``kind`` exception instance, or None (one C-level pass when none is)."""
    if set(map(type, replies)) <= _PLAIN:
        return None
    return next((r for r in replies if isinstance(r, kind)), None)


def _read_one(conn: Any) -> Any:
    import redis

    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc
