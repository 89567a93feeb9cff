"""A pipeline for one standalone Redis whose commands hiredis packs in C, sent in one write.

redis-py's own pipeline checks and converts every argument in Python before
hiredis packs it: for a training pull of ~45,000 row keys that is a large share
of the pull's time on the client (docs/performance.md). Kelp's commands hold only
``str``/``bytes``/``int`` arguments, so they can go to ``hiredis.pack_command``
as they are. Replies are read in order on the same connection; an error reply
does not desynchronise the connection (every reply is read before the first
error is raised), and a broken connection is disconnected before it goes back
to the pool, so the next use reconnects. Retries stay where they were, in
:class:`~kelp.store.redis.plan.PlanRunner`.

:meth:`PackedPipeline.add_packed` also takes commands already packed by numpy
(:mod:`kelp.store.redis._wire.packing`: one per row, one per bucket, or lazily packed parts);
their replies come back as one list, read straight from hiredis
(:func:`~kelp.store.redis._wire.packing.read_replies`), or, for row values of one width, as
one :class:`~kelp.store.redis._wire.row_replies.RowReplies` walked off the socket by
``kelp_native`` (the GIL released), or, for integer replies (``HSET``), as one int64 array
(:func:`~kelp.store.redis._wire.int_replies.read_ints`). One
:class:`~kelp.store.redis._wire.stream.ReplyStream` carries the bytes a run's parser received
past its replies on to the next run's, so consecutive runs all stay off hiredis.
The pipeline's bytes go out in parts as they are produced, never joined whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import hiredis
import numpy as np
import redis

from kelp.store.redis._wire.int_replies import read_ints
from kelp.store.redis._wire.packing import first_error
from kelp.store.redis._wire.row_replies import RowReplies, read_rows
from kelp.store.redis._wire.stream import ReplyStream

__all__ = ["PackedPipeline"]


_SEND_AT = 1 << 16
"""Small commands are joined until this many bytes, so a plan of many costs a few writes, not one each."""


def _wire(commands: list[Any], kinds: list[bool]) -> Iterator[bytes]:
    """The pipeline's bytes in order: small pieces joined, big or lazily packed parts passed as they come."""
    pending: list[bytes] = []
    size = 0
    for c, packed in zip(commands, kinds, strict=True):
        if not packed:
            parts: Iterable[bytes] = (hiredis.pack_command(c),)
        else:
            parts = (c[0],) if isinstance(c[0], bytes) else c[0]
        for part in parts:
            pending.append(part)
            size += len(part)
            if size >= _SEND_AT:
                yield b"".join(pending) if len(pending) > 1 else pending[0]
                pending, size = [], 0
    if pending:
        yield b"".join(pending)


class PackedPipeline:
    """The part of ``redis.client.Pipeline`` the plan runner uses: ``execute_command``, ``execute``."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._commands: list[tuple[Any, ...] | tuple[bytes | Iterable[bytes], int, int | None, bool]] = []
        self._packed: list[bool] = []  # per entry: a numpy-packed run of commands (its reply count)

    def execute_command(self, *args: Any) -> None:
        self._commands.append(args)
        self._packed.append(False)

    def add_packed(
        self,
        payload: bytes | Iterable[bytes],
        replies: int,
        width: int | None = None,
        *,
        integers: bool = False,
    ) -> None:
        """Commands already on the wire form, ``replies`` of them; their replies come back as one list.

        ``payload`` may be an iterable of parts (:class:`~kelp.store.redis._wire.packing.GroupedCommands`):
        each part is sent as soon as it is produced. With ``width`` every reply is a value of that many
        bytes or nil, walked off the socket by ``kelp_native``
        (:func:`~kelp.store.redis._wire.row_replies.read_rows`); with ``integers`` every reply is an
        integer, parsed off the socket by numpy
        (:func:`~kelp.store.redis._wire.int_replies.read_ints`).
        Either falls back to the list at the first reply of another kind (an error, say)."""
        self._commands.append((payload, replies, width, integers))
        self._packed.append(True)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """One reply per :meth:`execute_command`, one list of replies per :meth:`add_packed`."""
        if not self._commands:
            return []
        commands, kinds = self._commands, self._packed
        self._commands, self._packed = [], []
        conn = self._pool.get_connection()
        try:
            conn.send_packed_command(_wire(commands, kinds))  # type: ignore[arg-type]
            replies: list[Any] = []
            with ReplyStream(conn) as stream:
                for c, packed in zip(commands, kinds, strict=True):
                    if not packed:
                        replies.append(stream.replies(1)[0])
                    elif c[2] is not None:
                        replies.append(read_rows(stream, c[1], c[2]))  # type: ignore[arg-type]
                    elif c[3]:
                        replies.append(read_ints(stream, c[1]))  # type: ignore[arg-type]
                    else:
                        replies.append(stream.replies(c[1]))  # type: ignore[arg-type]
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._pool.release(conn)
        if raise_on_error:
            for reply, packed in zip(replies, kinds, strict=True):
                if isinstance(reply, (RowReplies, np.ndarray)):  # parsed by numpy: no reply was an error
                    continue
                # RedisError, not ResponseError: a restarted Redis answers LOADING (BusyLoadingError, a
                # redis-py ConnectionError) inline, and decoding it as a row crashed the trainer.
                error = first_error(reply if packed else [reply], redis.RedisError)
                if error is not None:
                    raise error
        return replies
