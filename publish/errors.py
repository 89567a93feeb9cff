"""Snapshot errors, and the one place where redis-py exceptions from a snapshot channel become Kelp errors.

* :class:`ChannelUnavailableError` (retriable): the channel (Redis, or the
  snapshot directory) could not be reached; the publish did *not* happen and
  the next ``maybe_publish`` tries again.
* :class:`ChannelError`: the channel refused the operation (Redis OOM, wrong
  key type, a read-only directory); retrying the same way will not help.
* :class:`SnapshotRejectedError`: a snapshot that was read is not acceptable
  (``reason``: ``checksum``, ``format``, ``incompatible``); a replica keeps its
  current model and counts the reason in ``kelp_serving_snapshots_rejected_total``.
* :class:`SnapshotMissingError`: the version is gone (pruned between listing and
  reading); the reader just looks at ``latest`` again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kelp.errors import KelpError

__all__ = [
    "REJECT_REASONS",
    "ChannelError",
    "ChannelUnavailableError",
    "SnapshotError",
    "SnapshotMissingError",
    "SnapshotRejectedError",
    "translate_channel_errors",
]

# Every value of the `reason` label of kelp_serving_snapshots_rejected_total.
REJECT_REASONS: tuple[str, ...] = ("checksum", "format", "incompatible")


class SnapshotError(KelpError):
    """Root of the publish package's errors."""


class ChannelError(SnapshotError):
    """The snapshot channel refused an operation."""


class ChannelUnavailableError(ChannelError):
    """The snapshot channel could not be reached; trying again later can help."""

    retriable = True


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


@contextmanager
def translate_channel_errors(where: str) -> Iterator[None]:
    """Turn redis-py (and socket) exceptions raised inside the block into the tree above."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError) as exc:
        raise ChannelUnavailableError(f"snapshot channel {where} unavailable: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise ChannelError(f"snapshot channel {where}: {type(exc).__name__}: {exc}") from exc
    except PermissionError as exc:
        raise ChannelError(f"snapshot channel {where}: {exc}") from exc
    except OSError as exc:
        raise ChannelUnavailableError(f"snapshot channel {where}: {exc}") from exc
