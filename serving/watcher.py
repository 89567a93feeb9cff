"""Keeps a replica on the newest good snapshot: notifications, a fallback poll, verification, swap.

The watcher thread waits on the channel's subscription (Redis pub/sub, or the
filesystem's ``latest`` check) and, on a notification or every
``poll_interval_s`` (the fallback for a missed message or a broken
subscription), compares the channel's ``latest`` with the served version. A
new version is read, its checksum verified, its feature spec compared with the
replica's, its weights loaded into a fresh module, and only then swapped in.

A bad snapshot (checksum mismatch, unreadable, incompatible) is counted in
``kelp_serving_snapshots_rejected_total{reason}``, logged once, and remembered,
so it is not re-read every poll; the replica keeps serving its current model
and swaps to the next good version. A ``latest`` *below* the served version
(the channel was reset) is loaded only if its snapshot is newer by
``created_at``.
"""

from __future__ import annotations

import logging
import threading
import time

from kelp.config import FeatureSpec
from kelp.errors import KelpError
from kelp.publish.base import SnapshotChannel, Subscription
from kelp.publish.errors import SnapshotMissingError, SnapshotRejectedError
from kelp.publish.snapshot import load_model
from kelp.serving.metrics import ServingMetrics
from kelp.serving.model import ModelSlot, ServedModel

__all__ = ["SnapshotWatcher"]

log = logging.getLogger("kelp.serving")


class SnapshotWatcher:
    """Loads new snapshot versions into a :class:`ModelSlot` (see the module docstring)."""

    def __init__(
        self,
        channel: SnapshotChannel,
        spec: FeatureSpec,
        slot: ModelSlot,
        metrics: ServingMetrics,
        poll_interval_s: float,
    ) -> None:
        self.channel = channel
        self.spec = spec
        self.slot = slot
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self.skipped: set[int] = set()  # rejected or older versions: not read again
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._check_lock = threading.Lock()

    def check_once(self) -> bool:
        """Load ``latest`` if it is new and good; True if a model was swapped in. Raises channel errors."""
        with self._check_lock:
            latest = self.channel.latest_version()
            current = self.slot.current
            if (
                latest is None
                or latest in self.skipped
                or (current is not None and latest == current.version)
            ):
                return False
            try:
                snapshot = self.channel.read(latest)
                older = current is not None and latest < current.version
                if older and snapshot.manifest.created_at <= current.created_at:  # type: ignore[union-attr]
                    self.skipped.add(latest)
                    return False
                module = load_model(snapshot, self.spec)
            except SnapshotMissingError:
                return False  # pruned between the pointer read and the read; the next check sees a newer one
            except SnapshotRejectedError as exc:
                self.skipped.add(latest)
                self.metrics.snapshots_rejected.labels(reason=exc.reason).inc()
                log.warning(
                    "rejected snapshot v%d (%s): %s; still serving %s",
                    latest,
                    exc.reason,
                    exc,
                    f"v{current.version}" if current else "nothing",
                )
                return False
            served = ServedModel(module, snapshot.manifest)
            previous = self.slot.set(served)
            self.metrics.model_loaded(served.version, served.created_at)
            if previous is not None:
                self.metrics.swaps.inc()
            log.info("serving model v%d (step %d)", served.version, snapshot.manifest.step)
            return True

    def start(self) -> None:
        """Try one load now (so a replica with a published model is ready at once), then watch."""
        try:
            self.check_once()
        except KelpError as exc:
            self.last_error = str(exc)
            log.warning("could not load a snapshot at start: %s", exc)
        self._thread = threading.Thread(target=self._run, name="kelp-snapshot-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sub: Subscription | None = None
        next_poll = time.monotonic() + self.poll_interval_s
        while not self._stop.is_set():
            try:
                if sub is None:
                    sub = self.channel.subscribe()
                # Short waits so stop() is prompt; a notification or the poll deadline triggers a check.
                notified = sub.wait(min(0.5, max(0.0, next_poll - time.monotonic())))
                if notified or time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_interval_s
                    self.check_once()
                self.last_error = None
            except KelpError as exc:
                if self.last_error != str(exc):
                    log.warning("snapshot channel: %s (retrying every %.1f s)", exc, self.poll_interval_s)
                self.last_error = str(exc)
                if sub is not None:
                    sub.close()
                    sub = None
                self._stop.wait(min(1.0, self.poll_interval_s))
            except Exception:  # a bug must not kill the thread silently: log it and keep watching
                log.exception("snapshot watcher failed; retrying")
                self._stop.wait(min(1.0, self.poll_interval_s))
        if sub is not None:
            sub.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
