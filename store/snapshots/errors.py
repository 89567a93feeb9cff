"""The one error a snapshot file, manifest or storage raises on purpose."""

from __future__ import annotations

from kelp.errors import UserError

__all__ = ["MissingObjectError", "SnapshotError"]


class SnapshotError(UserError):
    """A snapshot cannot be written, read or trusted; the message is one line naming the object or url.

    A user error: what is wrong (a tampered shard, a missing bucket, a broken
    chain of incrementals) is for the operator to fix, and trying again with
    the same files cannot help.
    """


class MissingObjectError(SnapshotError):
    """The named object is not in the storage (a snapshot that never finished, or was deleted)."""
