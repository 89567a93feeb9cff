"""Integer replies (``HSET``'s count of new fields) parsed natively straight off the socket.

A step's write-through push sends ~30,000 ``HSET`` commands (the buckets layout),
and each answers ``:0\\r\\n`` or ``:1\\r\\n``. Through hiredis each reply becomes
a Python ``int`` in a list that nobody reads, which costs the push thread far
more CPU than one pass over the raw bytes (``kelp_native.take_ints_into``, without the GIL).

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
from kelp_native import take_ints_into

from kelp.store.redis._wire.row_replies import receive
from kelp.store.redis._wire.stream import ReplyStream
from kelp.store.redis.client_internals import connection_socket

__all__ = ["read_ints"]


def read_ints(source: Any, n: int) -> np.ndarray | list[Any]:
    """Read ``n`` replies, each expected to be a non-negative integer, from a redis-py connection or a
    :class:`~kelp.store.redis._wire.stream.ReplyStream` over one (which then keeps the bytes received
    past them for the next read; given a connection, they go to its hiredis reader).

    Returns int64[n], or the list :func:`~kelp.store.redis._wire.packing.read_replies` gives when a reply is
    something else (an error, say) or hiredis already holds bytes. Socket errors become
    redis-py's ``ConnectionError`` / ``TimeoutError``, as redis-py's own read does.

    >>> _parse(b":1\\r\\n:0\\r\\n:64\\r\\n", 13, 3)[1].tolist()
    [1, 0, 64]
    >>> _parse(b":1\\r\\n-ERR no\\r\\n:3\\r\\n", 17, 3)[1].tolist()
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
    good, values, end = _parse(buf, got, n)
    if good < n:
        stream.hand_to_hiredis(bytes(buf[end:got]))  # hiredis reads on from the first foreign reply
        return values.tolist() + stream.replies(n - good)
    stream.keep(bytes(buf[end:got]))  # the next command's replies, for the next read
    return values


def _parse(buf: bytes | bytearray, got: int, n: int) -> tuple[int, np.ndarray, int]:
    """How many of the first ``n`` lines of ``buf[:got]`` are integer replies in a row, their values,
    and the offset just past the last of them (:func:`kelp_native.take_ints_into`, off the GIL)."""
    values = np.empty(n, dtype=np.int64)
    end, good, _ = take_ints_into(buf, 0, got, n, values)
    return good, values[:good], end
