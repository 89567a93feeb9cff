"""The store's error classes (the redis-py translation itself lives in :mod:`kelp.store.redis.connection`).

Every Redis call of the Redis backends runs inside
:func:`kelp.store.redis.connection.translate_redis_errors` with the store's error
room, so callers only ever see these classes and can rely on ``retriable``:

* :class:`ShardUnavailableError` (a :class:`~kelp.errors.StoreUnavailableError`,
  retriable): a shard could not be reached or timed out; the operation did
  *not* take effect as a whole (a push that raised it is never acknowledged,
  though some of its rows may already have been written).
* :class:`~kelp.errors.RedisAuthError` (a :class:`~kelp.errors.UserError`, not
  retriable): wrong password or ACL. ``StoreAuthError`` is the same class under
  its older store name; the publish channel raises it too.
* :class:`StoreCommandError`: Redis refused a command (OOM, wrong type...);
  :class:`WrongTypeError` when a key of this deployment holds another Redis type
  (the message names the key and the table).
* :class:`LayoutMarkerError`: the layout marker holds something Kelp did not write.

A stored *row* that is not a valid row of its table raises nothing: the store
quarantines it (:mod:`kelp.store.quarantine`).
"""

from __future__ import annotations

from kelp.errors import RedisAuthError, StoreError, StoreUnavailableError

__all__ = [
    "LayoutMarkerError",
    "ShardUnavailableError",
    "StoreAuthError",
    "StoreCommandError",
    "WrongTypeError",
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


class WrongTypeError(StoreCommandError):
    """Redis answered ``WRONGTYPE``: a key Kelp reads or writes holds another type (a string where a
    bucket hash belongs, say). Not retriable: the key keeps its type until someone removes it, and
    Kelp never deletes it on its own (it may be someone's data)."""


class LayoutMarkerError(StoreError):
    """The deployment's layout marker (``kelp:<deployment>:layout``) is not the JSON Kelp records
    there. Not retriable; the message names the key and what was expected."""
