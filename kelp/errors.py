"""One error tree for all of Kelp.

Every exception Kelp raises on purpose derives from :class:`KelpError`. The
class attribute ``retriable`` tells callers (and the shared retry policy)
whether trying again can help, so no caller has to know which backend raised.
Errors from Redis and Kafka are translated into this tree at the boundary, in
one place each: ``kelp.store.redis.connection.translate_redis_errors`` for every
Redis client Kelp opens (store, snapshot channel, serving), and
``kelp.consumers.errors.translate_kafka_error`` for Kafka; never further up.

``UserError`` marks mistakes a person can fix (a bad config, bad input). The
CLI prints those as one line without a traceback.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "KelpError",
    "MissingBinaryError",
    "RedisAuthError",
    "StoreError",
    "StoreUnavailableError",
    "UserError",
]


class KelpError(Exception):
    """Root of every deliberate Kelp error."""

    retriable: bool = False


class UserError(KelpError):
    """A mistake the operator can fix; reported as one line, no traceback."""


class ConfigError(UserError):
    """The configuration is invalid; the message names the field and what was expected."""


class MissingBinaryError(UserError):
    """A required external program (redis-server, tansu) is not installed."""


class RedisAuthError(UserError):
    """Redis refused the credentials: wrong or missing password, unknown ACL user, missing ACL permission.

    One class whichever room hit it (the store, the publish Redis channel, a
    serving replica's store), translated only by
    :func:`kelp.store.redis.connection.translate_redis_errors`. Never retriable:
    trying again with the same settings cannot help. The message is one line
    naming the node (``host:port``, never the password) and the setting to check.
    """


class StoreError(KelpError):
    """An embedding-store operation failed and did not take effect."""


class StoreUnavailableError(StoreError):
    """The store could not be reached within the retry budget.

    Retriable: the caller may try the whole operation again later. A push that
    raised this was *not* acknowledged, so its offsets must not be committed.
    """

    retriable = True
