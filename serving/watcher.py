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
and swaps to the next good version.

What it follows is the channel's target (:meth:`SnapshotChannel.target`): an
operator's pin when there is one (``kelp model pin``, ``rollback``), else
``latest``. A replica configured with ``serving.model_version: N`` follows N
only, whatever the channel says.

A replica never goes back to a lower version on its own. A ``latest`` *below*
the served version (the channel's keys were evicted, flushed or reset, and the
numbering started again) is not loaded: it is counted once per version as
``reason="older"``, one warning is logged, and the replica keeps its model
until the channel's numbering passes it. A pin is deliberate, so a pinned
version below the served one is loaded: that is how a rollback reaches every
replica.

Every new model is warmed up before it is swapped in (``warm_up``: one
synthetic request through the whole scoring path), so the first real request
on a version is not the slow one, and a replica is ready only once its first
model is loaded and warmed.

A broken ``latest`` (not a version number, or naming a version the channel
does not hold) is counted as ``reason="pointer"`` and logged once per value,
not once per poll; the replica keeps serving, and ``last_error`` (shown by
``/readyz`` before the first load) says what is wrong. So does
``last_rejection`` for a refused snapshot: a replica with no model says which
version it refused and why, not only that it has none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kelp.config import FeatureSpec
from kelp.errors import KelpError
from kelp.publish.base import ServingTarget, SnapshotChannel, Subscription
from kelp.publish.errors import ChannelStateError, SnapshotMissingError, SnapshotRejectedError
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
        *,
        allowed_model: str | None = None,
        pinned_version: int | None = None,
        warm_up: Callable[[ServedModel], None] | None = None,
    ) -> None:
        self.allowed_model = allowed_model  # a snapshot may name a built-in or this model only
        self.pinned_version = pinned_version  # serving.model_version: N, which overrides the channel
        self.warm_up = warm_up
        self.channel = channel
        self.spec = spec
        self.slot = slot
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self.rejected: set[int] = set()  # bad snapshots: not read again
        self.older: set[int] = set()  # a `latest` below the served version: not read again unless pinned
        self.last_error: str | None = None
        self.last_rejection: str | None = None
        """The newest snapshot refused, its reason and why (``/readyz`` says it while no model is loaded)."""
        self._pointer_problem: str | None = None  # the broken `latest` last reported, to say it once
        self._behind_reported = False  # a `latest` below the served version was reported
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._check_lock = threading.Lock()

    def check_once(self) -> bool:
        """Load ``latest`` if it is new and good; True if a model was swapped in. Raises channel errors."""
        with self._check_lock:
            try:
                target = self._target()
            except ChannelStateError as exc:
                self._report_pointer(str(exc))
                return False
            latest = target.version
            current = self.slot.current
            if (
                latest is None
                or latest in self.rejected
                or (latest in self.older and not target.pinned)
                or (current is not None and latest == current.version)
            ):
                self._pointer_problem = None
                return False
            if current is not None and latest < current.version and not target.pinned:
                self._refuse_older(latest, current.version)
                return False
            try:
                snapshot = self.channel.read(latest)
                module = load_model(snapshot, self.spec, allowed_model=self.allowed_model)
            except SnapshotMissingError:
                if self._target() == target:  # not a prune race: the pointer names nothing
                    self._report_pointer(
                        f"snapshot channel {self.channel.where}: {self._pointer_name(target)} names "
                        f"v{latest}, which the channel does not hold (evicted, deleted or pruned?)"
                    )
                return False  # otherwise pruned between the pointer read and the read: the next check
            except SnapshotRejectedError as exc:
                self.rejected.add(latest)
                self.last_rejection = f"v{latest} rejected ({exc.reason}): {exc}"
                self.metrics.snapshots_rejected.labels(reason=exc.reason).inc()
                log.warning(
                    "rejected snapshot v%d (%s): %s; still serving %s",
                    latest,
                    exc.reason,
                    exc,
                    f"v{current.version}" if current else "nothing",
                )
                return False
            self._pointer_problem = None
            self._behind_reported = False
            served = ServedModel(module, snapshot.manifest)
            self._warm(served)
            previous = self.slot.set(served)
            self.metrics.model_loaded(served.version, served.created_at)
            if previous is not None:
                self.metrics.swaps.inc()
            log.info("serving model v%d (step %d)", served.version, snapshot.manifest.step)
            return True

    def _target(self) -> ServingTarget:
        if self.pinned_version is not None:
            return ServingTarget(self.pinned_version, True)
        return self.channel.target()

    def _pointer_name(self, target: ServingTarget) -> str:
        if self.pinned_version is not None:
            return "serving.model_version"
        return "the pin" if target.pinned else "latest"

    def _warm(self, served: ServedModel) -> None:
        """One synthetic request on ``served`` before it serves; a failure here only costs the warm-up."""
        if self.warm_up is None:
            return
        try:
            self.warm_up(served)
        except KelpError as exc:  # the store unreachable: /readyz says so; the model itself passed its check
            log.info("warm-up of v%d did not complete (%s); serving it anyway", served.version, exc)

    def _report_pointer(self, problem: str) -> None:
        """Count and log a broken ``latest`` once per distinct problem; the replica keeps its model."""
        if problem == self._pointer_problem:
            return
        self._pointer_problem = problem
        self.metrics.snapshots_rejected.labels(reason="pointer").inc()
        current = self.slot.current
        log.warning("%s; still serving %s", problem, f"v{current.version}" if current else "nothing")

    def _refuse_older(self, latest: int, served: int) -> None:
        """A ``latest`` below the served version: not loaded unless pinned; counted once per version, logged
        once."""
        self.older.add(latest)
        self.metrics.snapshots_rejected.labels(reason="older").inc()
        if not self._behind_reported:
            self._behind_reported = True
            log.warning(
                "snapshot channel %s: latest is v%d, below the served v%d; not loaded, a replica never goes "
                "back (were the channel's keys evicted or flushed? docs/deploy.md); serving v%d until the "
                "channel's versions pass it",
                self.channel.where,
                latest,
                served,
                served,
            )

    def start(self) -> None:
        """Try one load now (so a replica with a published model is ready at once), then watch."""
        try:
            self.check_once()
            self.last_error = self._pointer_problem
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
                self.last_error = self._pointer_problem
            except KelpError as exc:
                if self.last_error != str(exc):
                    log.warning("snapshot channel: %s (retrying every %.1f s)", exc, self.poll_interval_s)
                self.last_error = str(exc)
                if sub is not None:
                    sub.close()
                    sub = None
                self._stop.wait(min(1.0, self.poll_interval_s))
            except Exception as exc:  # a bug must not kill the thread silently: log it and keep watching
                text = f"{type(exc).__name__}: {exc}"
                if self.last_error != text:  # a traceback once, not every retry
                    log.exception("snapshot watcher failed; retrying every %.1f s", self.poll_interval_s)
                self.last_error = text
                self._stop.wait(min(1.0, self.poll_interval_s))
        if sub is not None:
            sub.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
