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
will not come. Bytes received past the ``n`` replies (the next command's) stay
with the :class:`~kelp.store.redis._wire.stream.ReplyStream`, so the next run of
integers or rows is parsed off the socket too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kelp.store.redis._wire.row_replies import receive
from kelp.store.redis._wire.stream import ReplyStream
from kelp.store.redis.client_internals import connection_socket

__all__ = ["read_ints"]

_COLON, _CR, _LF, _ZERO, _NINE = ord(":"), ord("\r"), ord("\n"), ord("0"), ord("9")
_MAX_DIGITS = 18  # longer integers (never an HSET count) go to hiredis


def read_ints(source: Any, n: int) -> np.ndarray | list[Any]:
    """Read ``n`` replies, each expected to be a non-negative integer, from a redis-py connection or a
    :class:`~kelp.store.redis._wire.stream.ReplyStream` over one (which then keeps the bytes received
    past them for the next read; given a connection, they go to its hiredis reader).

    Returns int64[n], or the list :func:`~kelp.store.redis._wire.packing.read_replies` gives when a reply is
    something else (an error, say) or hiredis already holds bytes. Socket errors become
    redis-py's ``ConnectionError`` / ``TimeoutError``, as redis-py's own read does.

    >>> _parse(np.frombuffer(b":1\\r\\n:0\\r\\n:64\\r\\n", np.uint8), 3)[1].tolist()
    [1, 0, 64]
    >>> _parse(np.frombuffer(b":1\\r\\n-ERR no\\r\\n:3\\r\\n", np.uint8), 3)[1].tolist()
    [1]
    """
    if not isinstance(source, ReplyStream):
        with ReplyStream(source) as stream:
            return read_ints(stream, n)
    stream = source
    if n == 0:
        return []
    head = stream.start()
    sock = connection_socket(stream.conn)
    if head is None or sock is None:
        return stream.replies(n)
    buf = bytearray(head)  # bytes the previous read received past its replies: this run's first
    buf.extend(bytes(n * 4 + 64))  # ":0\r\n" each; grows when replies are longer
    got = len(head)
    lines = buf.count(b"\n", 0, got)
    while lines < n:
        if got == len(buf):
            buf.extend(bytes(len(buf)))
        with memoryview(buf) as whole, whole[got:] as free:
            before = got
            got += receive(sock, free)
        lines += buf.count(b"\n", before, got)
    data = np.frombuffer(buf, dtype=np.uint8, count=got)
    good, values, end = _parse(data, n)
    if good < n:
        stream.hand_to_hiredis(bytes(buf[end:got]))  # hiredis reads on from the first foreign reply
        return values.tolist() + stream.replies(n - good)
    stream.keep(bytes(buf[end:got]))  # the next command's replies, for the next read
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
