"""Replies that are each a row value of one width or nil, parsed natively straight off the socket.

A training pull reads ~30,000 rows with one ``HGET`` each (the buckets layout).
Through hiredis every reply becomes a Python ``bytes`` or ``None``, then the
codec joins them again: a large share of a pull's client CPU
(docs/performance.md). But such a reply stream holds only two record kinds::

    $-1\\r\\n  or  _\\r\\n               nil (RESP2) or null (RESP3)
    $<width>\\r\\n<width bytes>\\r\\n    a row value

so :func:`read_rows` receives the raw bytes into one buffer and walks the records
with one linear scan in Rust (``kelp_native.take_rows_into``, built from native/
by ``make``) that releases the GIL meanwhile and copies each value straight into
its row of one preallocated array as it finds it: ``present`` and the values
come back with no Python object per row and no gather afterwards.

It never guesses. A record must start exactly where the previous one ended: the
scan jumps from record to record, so a ``$`` inside a value is never looked at.
Anything else at a record's start (an error reply such as ``LOADING``, another
type, another width) hands the unread bytes to hiredis and the rest of the
replies are read the usual way (:func:`~kelp.store.redis._wire.packing.read_replies`),
so errors surface exactly as before.
Bytes read past this run's last reply (the next command's) stay with the
:class:`~kelp.store.redis._wire.stream.ReplyStream`, for the next read.
"""

from __future__ import annotations

import select
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from kelp.store.redis._wire.stream import ReplyStream
from kelp.store.redis.client_internals import connection_socket

try:
    from kelp_native import take_rows_into
except ModuleNotFoundError as exc:
    if exc.name != "kelp_native":
        raise
    # Not a PyPI dependency (pip would look for it there): make builds it from native/.
    raise ImportError("kelp_native is not built: run make setup") from None

__all__ = ["RowReplies", "read_rows", "receive"]

_PARSE_AT = 1 << 18  # bytes received but not yet looked at that make read_rows look now
_QUIET_S = 0.0002
"""How long the socket must stay quiet before a reply that may be complete is looked at: Redis
writes a long reply in chunks, and a look after each one costs more CPU than this wait (which
costs none) unless the reply held nils and was already whole."""


@dataclass(frozen=True)
class RowReplies:
    """``n`` replies: ``present`` bool[n] and the present values, ``values`` V<width>[k], in order."""

    present: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.present)

    def tolist(self) -> list[bytes | None]:
        """As hiredis would have returned them (for a caller that mixes in the slow path's lists)."""
        out: list[bytes | None] = [None] * len(self.present)
        for i, v in zip(np.flatnonzero(self.present).tolist(), self.values.tolist(), strict=True):
            out[i] = v
        return out

    def slice(self, start: int, stop: int) -> RowReplies:
        before = int(self.present[:start].sum())
        present = self.present[start:stop]
        return RowReplies(present, self.values[before : before + int(present.sum())])


class _Walk:
    """The records taken so far from a reply buffer, copied into preallocated arrays as they are found:
    where the next record starts, each record's flag and the values in order."""

    def __init__(self, n: int, width: int) -> None:
        self.width = width
        self.value_record = len(b"$%d\r\n" % width) + width + 2
        self.cursor = 0
        self.count = 0
        self.stored = 0
        self.present = np.empty(n, dtype=np.uint8)
        self.values = np.empty(n * width, dtype=np.uint8)

    def advance(self, buf: bytearray, got: int, limit: int) -> bool:
        """Take whole records received (``buf[:got]``) from ``cursor`` on, up to ``limit`` in all;
        False if the bytes at ``cursor`` are no record of this kind (a foreign reply)."""
        self.cursor, taken, stored, foreign = take_rows_into(
            buf,
            self.cursor,
            got,
            max(0, limit - self.count),
            self.width,
            self.present,
            self.values,
            self.count,
            self.stored,
        )
        self.count += taken
        self.stored += stored
        return not foreign

    def rows(self) -> RowReplies:
        present = self.present[: self.count].view(np.bool_)
        values = self.values[: self.stored * self.width].view(f"V{self.width}")
        return RowReplies(present, values)


def read_rows(source: Any, n: int, width: int) -> RowReplies | list[Any]:
    """Read ``n`` replies, each a ``width``-byte value or nil, from a redis-py connection or a
    :class:`~kelp.store.redis._wire.stream.ReplyStream` over one (which then keeps the bytes received
    past them for the next read; given a connection, they go to its hiredis reader).

    Returns :class:`RowReplies`, or the list :func:`~kelp.store.redis._wire.packing.read_replies` gives
    when a reply is something else (an error, say) or hiredis already holds bytes.
    Socket errors become redis-py's ``ConnectionError`` / ``TimeoutError``, as redis-py's own read does.
    """
    if not isinstance(source, ReplyStream):
        with ReplyStream(source) as stream:
            return read_rows(stream, n, width)
    stream = source
    if n == 0:
        return []
    head = stream.start()
    sock = connection_socket(stream.conn)
    if head is None or sock is None:
        return stream.replies(n)
    walk = _Walk(n, width)
    # This run's replies take at most n * value_record bytes, after the bytes the previous read
    # received past its own (they start this run): a full buffer short of n records holds a foreign one.
    buf = bytearray(len(head) + n * walk.value_record)
    buf[: len(head)] = head
    view = memoryview(buf)
    got = len(head)
    foreign = bool(got) and not walk.advance(buf, got, n)
    while not foreign and walk.count < n:
        got += receive(sock, view[got:])
        if got < len(view) and not _parse_now(sock, got - walk.cursor, n - walk.count):
            continue
        foreign = not walk.advance(buf, got, n) or (got == len(view) and walk.count < n)
    if foreign:
        stream.hand_to_hiredis(bytes(buf[walk.cursor : got]))  # from the first foreign reply on
        return walk.rows().tolist() + stream.replies(n - walk.count)
    stream.keep(bytes(buf[walk.cursor : got]))  # the next command's replies
    return walk.rows()


def _parse_now(sock: socket.socket, unparsed: int, replies_left: int) -> bool:
    """Whether to look for records now, or first read more: each look is a native call and two small
    arrays kept, and a client faster than Redis would otherwise look after every chunk Redis writes
    (16 KB).

    The caller looks without asking once every reply could be a whole row (the buffer is
    full). Before that, this looks once ``_PARSE_AT`` bytes wait, or once the replies left
    could all be here (every reply takes at least 3 bytes: some may be nil) and nothing more
    arrives within :data:`_QUIET_S`: so when the last reply has arrived it is always found, an
    error reply never waits for bytes that will not come, and a reply with nils waits that long
    at most once."""
    if unparsed >= _PARSE_AT:
        return True
    if unparsed < replies_left * 3:
        return False
    pending = getattr(sock, "pending", None)  # TLS: decrypted bytes select() cannot see
    if pending is not None and pending():
        return False
    return not select.select([sock], [], [], _QUIET_S)[0]


def receive(sock: socket.socket, into: memoryview) -> int:
    """``sock.recv_into(into)``: bytes received, with socket errors and a closed socket as redis-py's."""
    try:
        got = sock.recv_into(into)
    except TimeoutError as exc:
        raise redis.TimeoutError("Timeout reading from socket") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"Error while reading from socket: {exc.args}") from exc
    if got == 0:
        raise redis.ConnectionError("Connection closed by server.")
    return got
