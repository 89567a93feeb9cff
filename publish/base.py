"""The snapshot channel interface: where published snapshots live and how replicas hear of new ones.

A channel stores whole versions (manifest + weights), keeps a ``latest``
pointer that only moves forward, and lets readers wait for a change. Two
implementations: :class:`~kelp.publish.redis_channel.RedisChannel` (the
default; versioned keys, a pointer and a pub/sub notification) and
:class:`~kelp.publish.fs_channel.FilesystemChannel` (a directory, atomic
renames). Publishers and replicas only talk to this interface.

Rules every channel keeps:

* a version becomes visible (``latest_version``) only after both of its parts
  are completely written, so a reader never sees half a snapshot;
* ``read`` of one version returns both parts as they were written, or raises
  :class:`~kelp.publish.errors.SnapshotMissingError` if it was pruned;
  corruption is caught by the checksum (:func:`~kelp.publish.snapshot.verify_snapshot`);
* versions are allocated by the channel (``next_version``), so they stay
  monotonic across publisher restarts.
"""

from __future__ import annotations

import abc

from kelp.closing import Closeable
from kelp.publish.errors import SnapshotRejectedError
from kelp.publish.snapshot import Snapshot, verify_snapshot

__all__ = ["SnapshotChannel", "Subscription"]


class Subscription(abc.ABC):
    """A reader's handle for change notifications (one per replica; not thread-safe)."""

    @abc.abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for a notification; True if one came (possibly spurious)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection or handle."""


class SnapshotChannel(Closeable, abc.ABC):
    """Where snapshots are written and read (see the module docstring for the rules)."""

    name: str = "abstract"

    @abc.abstractmethod
    def next_version(self) -> int:
        """A new version number, larger than any this channel has handed out or stored."""

    @abc.abstractmethod
    def write(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` under its manifest's version, then move ``latest`` to it and notify."""

    @abc.abstractmethod
    def versions(self) -> list[int]:
        """Stored versions, ascending."""

    @abc.abstractmethod
    def latest_version(self) -> int | None:
        """The version ``latest`` points at; None if nothing was ever published."""

    @abc.abstractmethod
    def read_raw(self, version: int) -> tuple[bytes, bytes]:
        """``(manifest JSON, weights)`` of one version, unverified."""

    @abc.abstractmethod
    def delete(self, versions: list[int]) -> None:
        """Remove these versions (never called with the latest one)."""

    @abc.abstractmethod
    def subscribe(self) -> Subscription:
        """A handle to wait for new versions on."""

    def read(self, version: int) -> Snapshot:
        """One version, verified (raises :class:`~kelp.publish.errors.SnapshotRejectedError`)."""
        manifest, weights = self.read_raw(version)
        snapshot = verify_snapshot(manifest, weights)
        if snapshot.manifest.version != version:
            raise SnapshotRejectedError(
                "format", f"stored as v{version} but the manifest says v{snapshot.manifest.version}"
            )
        return snapshot

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` versions (the latest is always kept); returns those deleted."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        stored = self.versions()
        latest = self.latest_version()
        old = [v for v in stored[:-keep] if v != latest]
        if old:
            self.delete(old)
        return old

    def close(self) -> None:
        """Release connections."""
