"""Replies that are each a row value of one width or nil, parsed by numpy straight off the socket.

A training pull reads ~30,000 rows with one ``HGET`` each (the buckets layout).
Through hiredis every reply becomes a Python ``bytes`` or ``None``, then the
codec joins them again: a large share of a pull's client CPU
(docs/performance.md). But such a reply stream holds only two record kinds::

    $-1\\r\\n  or  _\\r\\n               nil (RESP2) or null (RESP3)
    $<width>\\r\\n<width bytes>\\r\\n    a row value

so :func:`read_rows` receives the raw bytes into one buffer, finds the records
with a few vectorised passes, and hands back ``present`` and the values as one
array, with no Python object per row.

It never guesses. A record must start exactly where the previous one ended; a
``$`` inside a value is skipped for that reason. Anything else at a record's
start (an error reply such as ``LOADING``, another type, another width) hands
the unread bytes to hiredis and the rest of the replies are read the usual way
(:func:`~kelp.store.redis._wire.packing.read_replies`), so errors surface exactly as before.
Bytes read past this run's last reply (the next command's) go to hiredis too.
"""

from __future__ import annotations

import select
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from kelp.store.redis._wire.packing import read_replies
from kelp.store.redis.client_internals import connection_socket, hiredis_reader

__all__ = ["RowReplies", "read_rows", "receive"]

_DOLLAR, _UNDERSCORE = ord("$"), ord("_")  # a bulk string or RESP2's nil; RESP3's null
_CRLF = int.from_bytes(b"\r\n", "little")
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


def _word(pattern: bytes) -> tuple[int, int]:
    """``(mask, value)`` that match ``pattern`` (at most 8 bytes) at the start of a little-endian u64."""
    return (1 << (8 * len(pattern))) - 1, int.from_bytes(pattern, "little")


_HEAD = 8  # bytes read at each possible record start: the longest head, ``$<width>\r\n``, fits


class _Walk:
    """The records found so far in a reply buffer: where the next starts, each one's kind and value.

    The buffer carries ``_HEAD`` spare bytes past what was received, so the head of
    every possible record start reads as one u64 (one gather, three masked compares).
    """

    def __init__(self, width: int) -> None:
        header = b"$%d\r\n" % width
        if len(header) > _HEAD:
            raise ValueError(f"row width {width} is too wide for read_rows")
        self.width = width
        self.header_len = len(header)
        self.value_record = len(header) + width + 2
        self._value = _word(header)
        self._nil2, self._nil3 = _word(b"$-1\r\n"), _word(b"_\r\n")
        self.cursor = 0
        self.count = 0
        self.nil: list[np.ndarray] = []
        self.value_at: list[np.ndarray] = []

    def advance(self, buf: np.ndarray, got: int, limit: int) -> bool:
        """Take whole records received (``buf[:got]``) from ``cursor`` on, up to ``limit`` in all;
        False if the bytes at ``cursor`` are no record of this kind (a foreign reply)."""
        while self.count < limit:
            taken = self._take(buf[self.cursor :], got - self.cursor, limit - self.count)
            if taken is None:
                return False
            if not taken:
                break
        return True

    def _take(self, seg: np.ndarray, size: int, limit: int) -> int | None:
        """Records chaining from the start of ``seg[:size]``: how many (None: a foreign reply)."""
        if size <= 0:
            return 0
        if seg[0] != _DOLLAR and seg[0] != _UNDERSCORE:
            return None
        received = seg[:size]
        starts = np.flatnonzero((received == _DOLLAR) | (received == _UNDERSCORE))
        heads = np.lib.stride_tricks.sliding_window_view(seg, _HEAD)[starts].view("<u8").reshape(-1)
        room = size - starts
        nil3 = ((heads & self._nil3[0]) == self._nil3[1]) & (room >= 3)
        nil2 = ((heads & self._nil2[0]) == self._nil2[1]) & (room >= 5)
        value = ((heads & self._value[0]) == self._value[1]) & (room >= self.header_len)
        record = nil3 | nil2 | value
        if not record[0]:  # foreign, unless its head is not all here yet
            head = 3 if seg[0] == _UNDERSCORE else max(5, self.header_len)
            return 0 if room[0] < head else None
        starts, nil = starts[record], (nil3 | nil2)[record]
        ends = starts + np.where(nil, np.where(nil2[record], 5, 3), self.value_record)
        # A value's own bytes can look like a record (1 in 256 values ends in "_", and its CRLF follows):
        # drop heads inside an earlier record. What is left must then chain exactly, or we stop there.
        inside = starts[1:] < np.maximum.accumulate(ends)[:-1]
        if inside.any():
            keep = np.r_[True, ~inside]
            starts, nil, ends = starts[keep], nil[keep], ends[keep]
        chained = np.flatnonzero(starts[1:] != ends[:-1])
        m = min(int(chained[0]) + 1 if len(chained) else len(starts), limit)
        m = int(np.searchsorted(ends[:m], size, side="right"))  # whole records only
        if not m:
            return 0
        starts, nil, ends = starts[:m], nil[:m], ends[:m]
        tails = np.lib.stride_tricks.sliding_window_view(seg, 2)[ends[~nil] - 2].view("<u2")
        if len(tails) and not (tails == _CRLF).all():
            return None
        self.nil.append(nil)
        self.value_at.append(self.cursor + starts[~nil] + self.header_len)
        self.cursor += int(ends[-1])
        self.count += m
        return m


def read_rows(conn: Any, n: int, width: int) -> RowReplies | list[Any]:
    """Read ``n`` replies, each a ``width``-byte value or nil, from a redis-py connection.

    Returns :class:`RowReplies`, or the list :func:`~kelp.store.redis._wire.packing.read_replies` gives
    when a reply is something else (an error, say) or hiredis already holds bytes.
    Socket errors become redis-py's ``ConnectionError`` / ``TimeoutError``, as redis-py's own read does.
    """
    reader = hiredis_reader(conn)
    sock = connection_socket(conn)
    if reader is None or sock is None or reader.has_data() or n == 0:
        return read_replies(conn, n)
    walk = _Walk(width)
    buf = bytearray(n * walk.value_record + _HEAD)  # the most this run's replies can take, and spare
    data = np.frombuffer(buf, dtype=np.uint8)
    view = memoryview(buf)[: n * walk.value_record]
    got = 0
    while walk.count < n:
        got += receive(sock, view[got:])
        if got < len(view) and not _parse_now(sock, got - walk.cursor, n - walk.count):
            continue
        if not walk.advance(data, got, n) or (got == len(view) and walk.count < n):
            reader.feed(bytes(buf[walk.cursor : got]))  # hiredis takes over from the first foreign reply
            return _rows(walk, data).tolist() + read_replies(conn, n - walk.count)
    if got > walk.cursor:
        reader.feed(bytes(buf[walk.cursor : got]))  # the next command's replies
    return _rows(walk, data)


def _parse_now(sock: socket.socket, unparsed: int, replies_left: int) -> bool:
    """Whether to look for records now, or first read more: each look costs ~20 numpy calls, and a
    client faster than Redis would otherwise look after every chunk Redis writes (16 KB).

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


def _rows(walk: _Walk, data: np.ndarray) -> RowReplies:
    nil = np.concatenate(walk.nil) if walk.nil else np.zeros(0, bool)
    at = np.concatenate(walk.value_at) if walk.value_at else np.zeros(0, np.int64)
    values = np.lib.stride_tricks.sliding_window_view(data, walk.width)[at]
    values = values.view(f"V{walk.width}").reshape(-1)
    return RowReplies(~nil, values)


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
