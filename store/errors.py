"""Store errors, and the one place where redis-py exceptions become Kelp errors.

Every Redis call of :mod:`kelp.store.redis` runs inside :func:`translate_redis_errors`,
so callers only ever see the :class:`~kelp.errors.StoreError` tree below and can
rely on ``retriable``:

* :class:`ShardUnavailableError` (retriable): a shard could not be reached or timed
  out; the operation did *not* take effect as a whole (a push that raised it is
  never acknowledged, though some of its rows may already have been written).
* :class:`StoreAuthError` (a :class:`~kelp.errors.UserError`): wrong password or ACL.
* :class:`StoreCommandError`: Redis refused a command (OOM, wrong type...).
* :class:`RowFormatError`: a stored value is not a Kelp row of this table; never
  decoded into garbage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kelp.errors import StoreError, StoreUnavailableError, UserError

__all__ = [
    "RowFormatError",
    "ShardUnavailableError",
    "StoreAuthError",
    "StoreCommandError",
    "translate_redis_errors",
]


class ShardUnavailableError(StoreUnavailableError):
    """One shard (named in ``shard``, password-free address) could not be reached."""

    def __init__(self, shard: str, reason: str) -> None:
        super().__init__(f"store shard {shard} unavailable: {reason}")
        self.shard = shard
        self.reason = reason


class StoreAuthError(UserError, StoreError):
    """Redis rejected the credentials (requirepass / ACL user)."""


class StoreCommandError(StoreError):
    """Redis answered a command with an error (for example OOM under maxmemory with noeviction)."""


class RowFormatError(StoreError):
    """A stored value has the wrong length or an unknown format version."""


@contextmanager
def translate_redis_errors(shard: str) -> Iterator[None]:
    """Turn redis-py exceptions raised inside the block into the Kelp store error tree."""
    try:
        yield
    except (
        redis.exceptions.AuthenticationError,
        redis.exceptions.AuthenticationWrongNumberOfArgsError,
    ) as exc:
        raise StoreAuthError(
            f"store shard {shard}: authentication failed ({exc}); check store.username/password"
        ) from None
    except redis.exceptions.NoPermissionError as exc:
        raise StoreAuthError(f"store shard {shard}: ACL user lacks permission: {exc}") from None
    except redis.exceptions.ResponseError as exc:
        text = str(exc)
        if text.startswith(("NOAUTH", "WRONGPASS", "invalid password", "invalid username")):
            raise StoreAuthError(f"store shard {shard}: authentication failed ({text})") from None
        if text.startswith(("CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "LOADING", "MASTERDOWN")):
            raise ShardUnavailableError(shard, text) from exc
        raise StoreCommandError(f"store shard {shard}: {text}") from exc
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.ClusterDownError,
        redis.exceptions.ClusterError,
        redis.exceptions.BusyLoadingError,
        ConnectionError,
        OSError,
    ) as exc:
        raise ShardUnavailableError(shard, f"{type(exc).__name__}: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise StoreError(f"store shard {shard}: {type(exc).__name__}: {exc}") from exc
