"""Per-row Redis commands packed by numpy: one fixed-width RESP record per row, no Python object per row.

The bucketed row layout (:mod:`kelp.store.redis_buckets`) touches a row with one
``HGET``/``HSET``/``HDEL`` on its bucket: ~45,000 commands per training step.
Packed one by one (``hiredis.pack_command``) that is ~45,000 argument tuples
and a Python ``bytes`` per key, field and value. But every argument of such a
command has a fixed width per table (bucket key, 8-byte id, row value), so
the wire form of one command is a fixed-width record, and a whole batch is
one numpy structured array written with ``tobytes()``::

    *3\\r\\n$4\\r\\nHGET\\r\\n$17\\r\\n<bucket key>\\r\\n$8\\r\\n<id>\\r\\n      (one record per row)

:func:`pack_commands` builds it from constant command words and per-row
columns; replies are read with :func:`read_replies`.

>>> keys = np.array([b"k1", b"k2"], dtype="V2")
>>> pack_commands(("HGET",), keys, np.array([b"a", b"b"], dtype="V1"))[:29]
b'*3\\r\\n$4\\r\\nHGET\\r\\n$2\\r\\nk1\\r\\n$1\\r\\na\\r\\n'
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["first_error", "pack_commands", "read_replies"]


def pack_commands(words: tuple[str, ...], *columns: np.ndarray) -> bytes:
    """One command per row: the constant ``words`` (e.g. ``("HSET",)``), then one argument per column.

    Each column is a 1-d array of a fixed-width void (``V<w>``) or bytes
    dtype: row ``i``'s argument is its ``w`` raw bytes (no trailing-NUL
    stripping: a numpy ``S`` column is read as ``V``).
    """
    n = len(columns[0]) if columns else 0
    if any(len(c) != n for c in columns):
        raise ValueError("every column needs one value per command")
    head = f"*{len(words) + len(columns)}\r\n".encode()
    for w in words:
        head += f"${len(w)}\r\n{w}\r\n".encode()
    fields: list[tuple[str, Any]] = []
    values: list[tuple[str, Any]] = []
    prefix = head
    for i, col in enumerate(columns):
        width = col.dtype.itemsize
        prefix += f"${width}\r\n".encode()
        fields.append((f"s{i}", f"V{len(prefix)}"))
        values.append((f"s{i}", prefix))
        fields.append((f"c{i}", f"V{width}"))
        values.append((f"c{i}", col.view(f"V{width}") if width else col))
        prefix = b"\r\n"
    fields.append(("end", "V2"))
    values.append(("end", prefix))
    rec = np.empty(n, dtype=np.dtype(fields))
    for name, value in values:
        rec[name] = np.void(value) if isinstance(value, bytes) else value
    return rec.tobytes()


def read_replies(conn: Any, n: int) -> list[Any]:
    """Read ``n`` replies from a redis-py connection, straight from its hiredis reader when it has one.

    redis-py's ``Connection.read_response`` costs several microseconds of
    Python per reply (health checks, push handling); with ~45,000 per-row
    replies per step that was a third of a pull. Error replies come back as
    exception instances (as in a pipeline), never raised here.
    """
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if reader is None or not hasattr(parser, "read_from_socket"):  # the pure-Python parser
        return [_read_one(conn) for _ in range(n)]
    from redis._parsers.hiredis import NOT_ENOUGH_DATA

    out: list[Any] = []
    gets = reader.gets
    step = 64  # replies asked for per round: a few wasted calls after the buffer runs dry, not n
    while len(out) < n:
        want = min(step, n - len(out))
        got = [gets() for _ in range(want)]
        if got[-1] is NOT_ENOUGH_DATA:
            got = got[: got.index(NOT_ENOUGH_DATA)]
            parser.read_from_socket()
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
