"""Integer replies (``HSET``'s count of new fields) parsed by numpy straight off the socket.

A step's write-through push sends ~30,000 ``HSET`` commands (the buckets layout),
and each answers ``:0\\r\\n`` or ``:1\\r\\n``. Through hiredis each reply becomes
a Python ``int`` in a list that nobody reads, which costs the push thread far
more CPU than a few numpy passes over the raw bytes (docs/performance.md).

Every RESP reply ends with at least one CRLF, and an integer reply holds exactly
one, so :func:`read_ints` receives until the buffer holds ``n`` line ends, then
checks that each line is ``:<digits>\\r\\n``. Anything else (an error such as
``LOADING`` or ``WRONGTYPE``, another type) hands the unread bytes from that
reply on to hiredis and the rest are read the usual way, so errors surface
exactly as through :func:`~kelp.store.redis._wire.packing.read_replies`. A reply with more
line ends than one only makes the count stop early, never wait for bytes that
will not come.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kelp.store.redis._wire.packing import read_replies
from kelp.store.redis._wire.row_replies import receive
from kelp.store.redis.client_internals import connection_socket, hiredis_reader

__all__ = ["read_ints"]

_COLON, _CR, _LF, _ZERO, _NINE = ord(":"), ord("\r"), ord("\n"), ord("0"), ord("9")
_MAX_DIGITS = 18  # longer integers (never an HSET count) go to hiredis


def read_ints(conn: Any, n: int) -> np.ndarray | list[Any]:
    """Read ``n`` replies, each expected to be a non-negative integer, from a redis-py connection.

    Returns int64[n], or the list :func:`~kelp.store.redis._wire.packing.read_replies` gives when a reply is
    something else (an error, say) or hiredis already holds bytes. Socket errors become
    redis-py's ``ConnectionError`` / ``TimeoutError``, as redis-py's own read does.

    >>> _parse(np.frombuffer(b":1\\r\\n:0\\r\\n:64\\r\\n", np.uint8), 3)[1].tolist()
    [1, 0, 64]
    >>> _parse(np.frombuffer(b":1\\r\\n-ERR no\\r\\n:3\\r\\n", np.uint8), 3)[1].tolist()
    [1]
    """
    reader = hiredis_reader(conn)
    sock = connection_socket(conn)
    if reader is None or sock is None or reader.has_data() or n == 0:
        return read_replies(conn, n)
    buf = bytearray(n * 4 + 64)  # ":0\r\n" each; grows when replies are longer
    got = lines = 0
    while lines < n:
        if got == len(buf):
            buf.extend(bytes(len(buf)))
        with memoryview(buf) as whole, whole[got:] as free:
            before = got
            got += receive(sock, free)
        lines += buf.count(b"\n", before, got)
    data = np.frombuffer(buf, dtype=np.uint8, count=got)
    good, values, end = _parse(data, n)
    if got > end:
        reader.feed(bytes(buf[end:got]))  # a foreign reply onwards, or the next command's replies
    if good < n:
        return values.tolist() + read_replies(conn, n - good)
    return values


def _parse(data: np.ndarray, n: int) -> tuple[int, np.ndarray, int]:
    """How many of the first ``n`` lines of ``data`` are integer replies in a row, their values, and
    the offset just past the last of them."""
    ends = np.flatnonzero(data == _LF)[:n]
    if not len(ends):
        return 0, np.zeros(0, dtype=np.int64), 0
    starts = np.r_[0, ends[:-1] + 1]
    digits = ends - starts - 2  # between ":" and "\r"
    nondigit = np.r_[0, np.cumsum((data < _ZERO) | (data > _NINE))]
    valid = (
        (data[starts] == _COLON)
        & (data[ends - 1] == _CR)
        & (digits >= 1)
        & (digits <= _MAX_DIGITS)
        & (nondigit[ends + 1] - nondigit[starts] == 3)  # ":", "\r", "\n" and nothing else
    )
    good = len(valid) if valid.all() else int(np.argmin(valid))
    if not good:
        return 0, np.zeros(0, dtype=np.int64), 0
    starts, digits = starts[:good], digits[:good]
    values = np.zeros(good, dtype=np.int64)
    for place in range(int(digits.max())):
        more = digits > place
        values[more] = values[more] * 10 + (data[starts[more] + 1 + place].astype(np.int64) - _ZERO)
    return good, values, int(ends[good - 1]) + 1
