"""One connection's replies read in order, each run by the parser that fits it.

The fast parsers (:func:`~kelp.store.redis._wire.row_replies.read_rows`,
:func:`~kelp.store.redis._wire.int_replies.read_ints`) receive straight off the
socket in large chunks, so a chunk often ends inside the replies of the commands
after theirs. Fed to hiredis, those bytes would stop the next fast parser: it
can start only where hiredis holds nothing, as hiredis's buffer comes first on
the wire and cannot be taken back, so a pipeline of several ``HSET`` runs would
read every run after the first through hiredis. A :class:`ReplyStream` keeps
such bytes instead and hands them to the next fast parser, or to hiredis just
before a read that goes through it, so every byte is still read once and in
order::

    wire order:   hiredis's buffer | the stream's unread bytes | the socket

The unread bytes are only kept while hiredis holds nothing, and a stream must be
closed (``with``) before its connection is used for anything else: closing hands
what is left to hiredis, where redis-py's own reads find it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from kelp.store.redis._wire.packing import read_replies
from kelp.store.redis.client_internals import connection_socket, hiredis_reader

__all__ = ["ReplyStream"]


class ReplyStream:
    """The replies of one pipeline on one redis-py connection, ``conn``: a context manager.

    >>> import hiredis
    >>> class Conn:  # a connection whose hiredis parser holds nothing yet
    ...     _sock = object()
    ...     class _parser:
    ...         _reader = hiredis.Reader()
    >>> with ReplyStream(Conn) as stream:
    ...     stream.start()  # what a fast parser starts from: nothing received yet
    ...     stream.keep(b":1\\r\\n:0")  # received past its replies: the next run's, one cut short
    ...     stream.start()
    b''
    b':1\\r\\n:0'
    >>> stream.keep(b":7\\r\\n")
    >>> stream.close()  # what is left goes to hiredis, for redis-py's next read
    >>> Conn._parser._reader.gets()
    7
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._unread = b""

    def start(self) -> bytes | None:
        """The bytes a fast parser starts from (received already, now the caller's), or None when it
        cannot start: hiredis holds bytes (they come first), the parser is not hiredis, or no socket."""
        reader = hiredis_reader(self.conn)
        if reader is None or connection_socket(self.conn) is None or reader.has_data():
            return None
        head, self._unread = self._unread, b""
        return head

    def keep(self, rest: bytes) -> None:
        """Bytes a fast parser received past its own replies: the start of the next read.

        Only after :meth:`start` returned bytes, so nothing else is held."""
        if self._unread:
            raise RuntimeError("a ReplyStream keeps the bytes of one fast read at a time")
        self._unread = rest

    def hand_to_hiredis(self, rest: bytes = b"") -> None:
        """Put the bytes kept, then ``rest`` (received since), in hiredis's buffer, after what it holds."""
        data, self._unread = self._unread + rest, b""
        if data:
            reader = hiredis_reader(self.conn)
            if reader is None:  # the connection was dropped meanwhile: its bytes went with it
                return
            reader.feed(data)

    def replies(self, n: int) -> list[Any]:
        """The next ``n`` replies through hiredis, as :func:`~kelp.store.redis._wire.packing.read_replies`."""
        self.hand_to_hiredis()
        return read_replies(self.conn, n)

    def close(self) -> None:
        """Hand what is left to hiredis: the connection's next read, by anyone, starts there."""
        self.hand_to_hiredis()

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
