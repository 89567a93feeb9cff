"""Snapshot errors: the publish package's error tree.

Translation happens at each channel's boundary, not here: redis-py errors by
the one Redis translator, :func:`kelp.store.redis.connection.translate_redis_errors`
(so Redis refusing the credentials is :class:`~kelp.errors.RedisAuthError`, the
same non-retriable class the store raises), and the filesystem channel's
``OSError`` s by its own small translator.

* :class:`ChannelUnavailableError` (retriable): the channel (Redis, or the
  snapshot directory) could not be reached; the publish did *not* happen and
  the next ``maybe_publish`` tries again.
* :class:`ChannelError`: the channel refused the operation (Redis OOM, wrong
  key type, a read-only directory); retrying the same way will not help.
* :class:`SnapshotRejectedError`: a snapshot that was read is not acceptable
  (``reason``: ``checksum``, ``format``, ``incompatible``, ``nonfinite``: a weight
  is NaN or infinite, ``model_import``: the replica cannot import the snapshot's
  model reference, ``model_digest``: the replica's model source differs from the
  trainer's); a replica keeps its
  current model and counts the reason in ``kelp_serving_snapshots_rejected_total``.
* :class:`SnapshotMissingError`: the version is gone (pruned between listing and
  reading); the reader just looks at ``latest`` again.
* :class:`SnapshotNotStoredError`: the channel accepted the write but the
  snapshot cannot be read back whole right after it (``reason``: ``evicted``,
  e.g. Redis under an ``allkeys-*`` ``maxmemory-policy`` dropped the version's
  hash or ``latest``; ``overwritten``: it reads back different): replicas
  cannot load it, so the publish is a failure, never ``ok``.
* :class:`ChannelStateError`: the channel's own bookkeeping (``seq``, ``latest``,
  a version that already exists) is missing or contradicts itself, e.g. after
  Redis evicted or someone deleted a key; publishing refuses rather than hand
  out or overwrite a version a replica may already hold, and the message says
  which key or file to repair.
"""

from __future__ import annotations

from kelp.errors import KelpError

__all__ = [
    "REJECT_REASONS",
    "ChannelError",
    "ChannelStateError",
    "ChannelUnavailableError",
    "SnapshotError",
    "SnapshotMissingError",
    "SnapshotNotStoredError",
    "SnapshotRejectedError",
]

# Every value of the `reason` label of kelp_serving_snapshots_rejected_total; the last two are
# counted by the watcher itself: `older` a `latest` below the served version (never loaded),
# `pointer` a `latest` that is not a version number or names a version the channel does not hold.
REJECT_REASONS: tuple[str, ...] = (
    "checksum",
    "format",
    "incompatible",
    "nonfinite",
    "model_import",
    "model_digest",
    "model_contract",
    "older",
    "pointer",
)


class SnapshotError(KelpError):
    """Root of the publish package's errors."""


class ChannelError(SnapshotError):
    """The snapshot channel refused an operation."""


class ChannelUnavailableError(ChannelError):
    """The snapshot channel could not be reached; trying again later can help."""

    retriable = True


class ChannelStateError(ChannelError):
    """The channel's bookkeeping is missing or inconsistent; an operator must repair it (not retriable).

    Raised instead of reusing or overwriting a version: a replica that already
    serves version N must never receive other weights under the same number.
    """


class SnapshotNotStoredError(ChannelError):
    """Written snapshot ``version`` is not readable back whole; ``reason``: ``evicted`` or ``overwritten``.

    Not retriable as such: the next interval's publish meets the same memory
    pressure unless an operator changes the channel's Redis (docs/deploy.md).
    """

    def __init__(self, reason: str, version: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.version = version


class SnapshotMissingError(SnapshotError):
    """The requested version is not (or no longer) in the channel."""

    retriable = True


class SnapshotRejectedError(SnapshotError):
    """A snapshot failed verification; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}")
        super().__init__(message)
        self.reason = reason
