"""The store's error classes (the redis-py translation itself lives in :mod:`kelp.store.connection`).

Every Redis call of the Redis backends runs inside
:func:`kelp.store.connection.translate_redis_errors` with the store's error
room, so callers only ever see these classes and can rely on ``retriable``:

* :class:`ShardUnavailableError` (a :class:`~kelp.errors.StoreUnavailableError`,
  retriable): a shard could not be reached or timed out; the operation did
  *not* take effect as a whole (a push that raised it is never acknowledged,
  though some of its rows may already have been written).
* :class:`~kelp.errors.RedisAuthError` (a :class:`~kelp.errors.UserError`, not
  retriable): wrong password or ACL. ``StoreAuthError`` is the same class under
  its older store name; the publish channel raises it too.
* :class:`StoreCommandError`: Redis refused a command (OOM, wrong type...).
* :class:`RowFormatError`: a stored value is not a Kelp row of this table; never
  decoded into garbage.
"""

from __future__ import annotations

from kelp.errors import RedisAuthError, StoreError, StoreUnavailableError

__all__ = [
    "RowFormatError",
    "ShardUnavailableError",
    "StoreAuthError",
    "StoreCommandError",
]


class ShardUnavailableError(StoreUnavailableError):
    """One shard (named in ``shard``, password-free address) could not be reached."""

    def __init__(self, shard: str, reason: str) -> None:
        super().__init__(f"store shard {shard} unavailable: {reason}")
        self.shard = shard
        self.reason = reason


StoreAuthError = RedisAuthError
"""The store's name for :class:`~kelp.errors.RedisAuthError` (one class in every room)."""


class StoreCommandError(StoreError):
    """Redis answered a command with an error (for example OOM under maxmemory with noeviction)."""


class RowFormatError(StoreError):
    """A stored value has the wrong length or an unknown format version."""
