"""A pipeline for one standalone Redis whose commands hiredis packs in C, sent in one write.

redis-py's own pipeline checks and converts every argument in Python before
hiredis packs it: for a training pull of ~45,000 row keys that was a third of
the pull's time on the client (docs/performance.md). Kelp's commands hold only
``str``/``bytes``/``int`` arguments, so they can go to ``hiredis.pack_command``
as they are. Replies are read in order on the same connection; an error reply
does not desynchronise the connection (every reply is read before the first
error is raised), and a broken connection is disconnected before it goes back
to the pool, so the next use reconnects. Retries stay where they were, in
:class:`~kelp.store.redis_plan.PlanRunner`.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis

__all__ = ["PackedPipeline"]


class PackedPipeline:
    """The part of ``redis.client.Pipeline`` the plan runner uses: ``execute_command``, ``execute``."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> None:
        self._commands.append(args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        if not self._commands:
            return []
        packed = b"".join(map(hiredis.pack_command, self._commands))
        conn = self._pool.get_connection()
        try:
            conn.send_packed_command([packed])
            replies: list[Any] = []
            for _ in self._commands:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._pool.release(conn)
            self._commands = []
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, redis.ResponseError):
                    raise reply
        return replies
