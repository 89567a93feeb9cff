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
  monotonic across publisher restarts;
* a version number is never reused: a version is written once (a second write
  of the same number is refused), only above every version the channel holds
  or points at, and ``next_version`` refuses with
  :class:`~kelp.publish.errors.ChannelStateError` when the channel's record of
  what it handed out is garbled or behind, or gone along with what it stored (a
  wiped directory), instead of starting the numbering again; a record that is
  only missing beside stored versions may be rebuilt from them, above every
  number they and ``floor`` name. ``floor`` is the caller's own memory of the
  highest version it wrote, which catches a channel that lost *everything*; a
  publisher started after that cannot tell it from a new deployment, and
  replicas then refuse to go below the version they serve
  (:mod:`kelp.serving.watcher`);
* pruning keeps ``latest`` and everything above it, so the version just
  written is never deleted, and keeps the pinned version.

**Pins.** An operator may pin a deployment to a stored version (``kelp model
pin N``, ``kelp model rollback``): replicas then serve the pin, whatever
``latest`` says, and new publishes move ``latest`` without moving them until
the pin is lifted (``kelp model unpin``). :meth:`SnapshotChannel.target` is
what replicas follow: the pin when there is one, else ``latest``. Setting or
lifting a pin notifies subscribers as a publish does.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from kelp.closing import Closeable
from kelp.publish.errors import SnapshotRejectedError
from kelp.publish.snapshot import Snapshot, verify_snapshot

__all__ = ["ServingTarget", "SnapshotChannel", "Subscription"]


class Subscription(abc.ABC):
    """A reader's handle for change notifications (one per replica; not thread-safe)."""

    @abc.abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for a notification; True if one came (possibly spurious)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection or handle."""


@dataclass(frozen=True)
class ServingTarget:
    """The version replicas should serve (None: nothing published), and whether a pin chose it."""

    version: int | None
    pinned: bool


class SnapshotChannel(Closeable, abc.ABC):
    """Where snapshots are written and read (see the module docstring for the rules)."""

    name: str = "abstract"
    where: str = "abstract"  # where it lives, for messages (never a password)

    @abc.abstractmethod
    def next_version(self, floor: int = 0) -> int:
        """A new version number, larger than any this channel has handed out or stored and than ``floor``.

        Raises :class:`~kelp.publish.errors.ChannelStateError` (nothing changed)
        when the channel's own record is garbled, below what it holds or below
        ``floor``, or missing with nothing stored to rebuild it from: handing out
        a number then could reuse a version.
        """

    @abc.abstractmethod
    def write(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` under its manifest's version, then move ``latest`` to it and notify.

        Write-once: raises :class:`~kelp.publish.errors.ChannelStateError` (nothing
        written) if that version already exists, or is not above ``latest`` and
        every stored version. A channel whose storage may drop what it just
        wrote reads it back and raises
        :class:`~kelp.publish.errors.SnapshotNotStoredError` when it is gone.
        """

    @abc.abstractmethod
    def versions(self) -> list[int]:
        """Stored versions, ascending."""

    @abc.abstractmethod
    def latest_version(self) -> int | None:
        """The version ``latest`` points at; None if nothing was ever published.

        Raises :class:`~kelp.publish.errors.ChannelStateError` when ``latest``
        holds something that is not a version number.
        """

    @abc.abstractmethod
    def read_raw(self, version: int) -> tuple[bytes, bytes]:
        """``(manifest JSON, weights)`` of one version, unverified."""

    def read_manifest_raw(self, version: int) -> bytes:
        """The manifest JSON of one version, unverified (a channel may skip reading the weights)."""
        return self.read_raw(version)[0]

    @abc.abstractmethod
    def pinned_version(self) -> int | None:
        """The version an operator pinned, or None.

        Raises :class:`~kelp.publish.errors.ChannelStateError` when the pin
        holds something that is not a version number.
        """

    @abc.abstractmethod
    def set_pin(self, version: int | None) -> None:
        """Pin ``version`` (it must be stored: else :class:`SnapshotMissingError`), or lift the pin (None).

        Subscribers are notified either way.
        """

    def target(self) -> ServingTarget:
        """What replicas serve: the pin, else ``latest``."""
        pin = self.pinned_version()
        if pin is not None:
            return ServingTarget(pin, True)
        return ServingTarget(self.latest_version(), False)

    @abc.abstractmethod
    def delete(self, versions: list[int]) -> None:
        """Remove these versions (never called with ``latest`` or above, or the pin; a channel skips
        those too, in case a pin moved since the caller looked)."""

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
        """Delete all but the newest ``keep`` versions and the pinned one; returns those deleted.

        Only versions *below* ``latest`` go, so the live version and one just
        written are kept whatever the stored list looks like; with no readable
        ``latest`` nothing is deleted (what is live is unknown).
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        stored = self.versions()
        latest = self.latest_version()
        if latest is None:
            return []
        pin = self.pinned_version()
        old = [v for v in stored[:-keep] if v < latest and v != pin]
        if old:
            self.delete(old)
        return old

    def warn_about_eviction(self) -> None:
        """Log one warning when the channel's storage may drop stored snapshots by itself; never raises.

        Called once when a publisher starts. A directory does not evict
        anything, so the default says nothing.
        """

    def close(self) -> None:
        """Release connections."""
