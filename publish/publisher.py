"""The trainer-side publisher: a dense snapshot every ``publisher.interval_s``, and on shutdown.

The ``kelp train`` daemon calls :meth:`Publisher.maybe_publish` after every
step; it returns at once (one clock read) unless a publish is due. Then it
serializes the model (state_dict to safetensors), asks the channel for a new
version, writes the snapshot, prunes to ``keep_versions`` and updates the
``kelp_publisher_*`` metrics. Call it with ``force=True`` during the drain so
the last trained weights are published before exit.

Failures raise a :class:`~kelp.errors.KelpError` (``retriable`` for an
unreachable channel) and are counted as ``result="failed"`` and in
``kelp_publisher_failures_total`` by reason; the next attempt
waits another ``interval_s`` (no hot loop against a Redis that is down). A
prune failure after a successful write is logged, not raised: the snapshot is
already live.

A publish is ``ok`` only when the channel reads the snapshot back whole right
after writing it: a snapshot the channel's Redis evicted at once raises
:class:`~kelp.publish.errors.SnapshotNotStoredError` (``reason="evicted"``),
since replicas cannot load it. :func:`build_publisher` asks the channel once
whether its storage may evict snapshots, and the channel logs a warning when
it may.

Weights holding a NaN or an infinity are never published: the attempt is
counted as ``result="refused_nonfinite"``, logged as an error naming the first
bad tensor, and returns None; the channel's ``latest`` stays where it was, so
serving keeps the last good model, and the trainer goes on.

Weights identical to the last published version (the same
:func:`~kelp.trainer.checkpoint.dense_digest` and the same step, e.g. the
periodic publish and the drain's at one step, or a restart that trained
nothing) are not published again: a second version of one model would make
``kelp model rollback`` a no-op and every replica swap for nothing. The
attempt counts as ``result="unchanged"``, is logged at debug and returns the
version that holds those weights. When the publisher starts
(:meth:`Publisher.adopt_channel_state`, called by :func:`build_publisher`) it
reads the channel's ``latest``: the ``kelp_publisher_version`` and
``kelp_publisher_last_publish_timestamp_seconds`` gauges show it from the first
scrape, and a restart does not republish the weights ``latest`` already holds.

Each manifest records the trainer's progressive AUC and log loss at publish
(``quality``, :func:`~kelp.publish.snapshot.snapshot_quality`) when the
publisher was given the trainer's validator, for ``kelp model list``.

A channel whose bookkeeping was lost or contradicts itself (an evicted
``seq``, a wiped directory) raises
:class:`~kelp.publish.errors.ChannelStateError` (``result="failed"``) rather
than reuse a version number. The publisher passes the highest version it
wrote (published, or written and then found evicted: a replica may have loaded
it in between) as the channel's ``floor``, so even a channel that lost every
key is caught while this process runs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from torch import nn

from kelp.config import FeatureSpec, KelpConfig, PublisherConfig, StoreConfig, TrainerConfig
from kelp.errors import KelpError, RedisAuthError
from kelp.publish.base import SnapshotChannel
from kelp.publish.errors import ChannelStateError, SnapshotNotStoredError
from kelp.publish.metrics import PublisherMetrics
from kelp.publish.snapshot import build_snapshot, snapshot_quality
from kelp.trainer.checkpoint import dense_digest
from kelp.trainer.evaluation import ProgressiveValidator
from kelp.trainer.finite import NonFiniteError, first_nonfinite

__all__ = ["Publisher", "build_channel", "build_publisher", "failure_reason"]

log = logging.getLogger("kelp.publish")


def failure_reason(exc: KelpError) -> str:
    """The ``reason`` of ``kelp_publisher_failures_total`` for a failed publish (see FAILURE_REASONS)."""
    if isinstance(exc, SnapshotNotStoredError):
        return exc.reason
    if isinstance(exc, ChannelStateError):
        return "state"
    if isinstance(exc, RedisAuthError):
        return "auth"
    if exc.retriable:
        return "unavailable"
    return "error"


@dataclass(frozen=True)
class _Published:
    """The last version on the channel as far as this publisher knows: its weights' digest and step."""

    version: int
    dense_sha256: str | None
    step: int | None

    def holds(self, dense_sha256: str, step: int) -> bool:
        return self.dense_sha256 == dense_sha256 and self.step == int(step)


class Publisher:
    """Publishes dense snapshots of one model to one channel; used from the trainer's thread only."""

    def __init__(
        self,
        channel: SnapshotChannel,
        spec: FeatureSpec,
        trainer_cfg: TrainerConfig,
        *,
        interval_s: float,
        keep_versions: int,
        metrics: PublisherMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        validator: ProgressiveValidator | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.channel = channel
        self.spec = spec
        self.trainer_cfg = trainer_cfg
        self.interval_s = interval_s
        self.keep_versions = keep_versions
        self.metrics = metrics or PublisherMetrics(CollectorRegistry())
        self.validator = validator  # the trainer's progressive validation, read at each publish
        self._clock = clock
        self._last_attempt: float | None = None  # None: the first call publishes
        self.last_version: int | None = None
        # The highest version this process wrote, readable back or not: the channel's `floor`.
        self._written = 0
        self._last: _Published | None = None

    def adopt_channel_state(self) -> None:
        """Read the channel's ``latest`` into the gauges and the identical-publish check; never raises.

        A restarted trainer's ``kelp_publisher_version`` would read 0 until its
        first publish while the channel serves v9; and its first publish (the
        drain's, when nothing new was trained) would repeat v9's weights. A
        channel that cannot be read now is left to the first publish, which
        reports the failure properly.
        """
        try:
            latest = self.channel.latest_version()
            if latest is None:
                return
            manifest = json.loads(self.channel.read_manifest_raw(latest))
        except (KelpError, ValueError) as exc:
            where = self.channel.where
            log.warning("snapshot channel %s: cannot read its latest version at start: %s", where, exc)
            return
        if not isinstance(manifest, dict):
            manifest = {}
        self.metrics.version.set(latest)
        if isinstance(manifest.get("created_at"), int | float):
            self.metrics.last_publish.set(manifest["created_at"])
        step = manifest.get("step")
        self._last = _Published(latest, manifest.get("dense_sha256"), step if isinstance(step, int) else None)
        log.debug("snapshot channel %s holds v%d (step %s)", self.channel.where, latest, step)

    def due(self) -> bool:
        """True when ``interval_s`` has passed since the last attempt (or there was none)."""
        return self._last_attempt is None or self._clock() - self._last_attempt >= self.interval_s

    def maybe_publish(
        self,
        model: nn.Module,
        *,
        step: int,
        offsets: Mapping[tuple[str, int], int],
        force: bool = False,
    ) -> int | None:
        """Publish if due (or ``force``); returns the version holding the weights, else None.

        None: not due, or refused (weights not finite).

        ``offsets`` maps ``(topic, partition)`` to the next offset to consume
        (Kafka commit semantics) of the data the weights have seen.
        """
        if not force and not self.due():
            return None
        return self.publish(model, step=step, offsets=offsets)

    def publish(self, model: nn.Module, *, step: int, offsets: Mapping[tuple[str, int], int]) -> int | None:
        """Publish now; returns the version, or None when the weights are not finite (nothing written).

        Weights identical to the last version's, at the same step, are not
        written again: the attempt counts as ``result="unchanged"`` and returns
        that version.

        Raises a KelpError if the channel fails, including
        :class:`~kelp.publish.errors.SnapshotNotStoredError` when the written
        snapshot does not read back (evicted). The weights are checked before
        a version is allocated, so a refused snapshot leaves no gap in the versions.
        """
        self._last_attempt = self._clock()
        started = time.perf_counter()
        try:
            bad = first_nonfinite(model.state_dict())
            if bad is not None:
                raise NonFiniteError(f"snapshot of step {int(step)} refused", bad)
            digest = dense_digest(model)
            if self._last is not None and self._last.holds(digest, step):
                self.metrics.snapshots.labels(result="unchanged").inc()
                log.debug("snapshot of step %d skipped: v%d holds the same weights", step, self._last.version)
                return self._last.version
            # The channel refuses a number not above what this process wrote (its keys were lost).
            version = self.channel.next_version(floor=self._written)
            if version <= self._written:
                raise ChannelStateError(
                    f"snapshot channel {self.channel.where} handed out v{version}, not above "
                    f"v{self._written} that this publisher already wrote; not published"
                )
            snapshot = build_snapshot(
                model,
                self.spec,
                self.trainer_cfg,
                version=version,
                step=step,
                offsets=offsets,
                dense_sha256=digest,
                quality=snapshot_quality(self.validator),
            )
            self.channel.write(snapshot)
        except NonFiniteError as exc:
            self.metrics.snapshots.labels(result="refused_nonfinite").inc()
            log.error("%s; the channel's latest snapshot stays, serving keeps it", exc)
            return None
        except KelpError as exc:
            if isinstance(exc, SnapshotNotStoredError):
                # Written and announced, then lost: a replica may have loaded it, so never reuse it.
                self._written = max(self._written, exc.version)
            self.metrics.snapshots.labels(result="failed").inc()
            self.metrics.failures.labels(reason=failure_reason(exc)).inc()
            raise
        self.metrics.publish_seconds.observe(time.perf_counter() - started)
        self.metrics.snapshots.labels(result="ok").inc()
        self.metrics.version.set(version)
        self.metrics.last_publish.set(snapshot.manifest.created_at)
        self.metrics.snapshot_bytes.set(len(snapshot.weights) + len(snapshot.manifest.to_json()))
        self.last_version = version
        self._written = max(self._written, version)
        self._last = _Published(version, digest, int(step))
        try:
            self.channel.prune(self.keep_versions)
        except KelpError as exc:
            log.warning("published snapshot v%d but pruning old versions failed: %s", version, exc)
        log.debug("published snapshot v%d (step %d, %d bytes)", version, step, len(snapshot.weights))
        return version

    def close(self) -> None:
        """Release the channel (publish first with ``force=True`` if the last weights matter)."""
        self.channel.close()


def build_channel(publisher: PublisherConfig, store: StoreConfig, deployment: str) -> SnapshotChannel:
    """The configured snapshot channel (shared by publishers and replicas).

    ``store`` gives the Redis channel its default endpoint and credentials
    (``publisher.redis_url`` unset); ``deployment`` namespaces the keys.
    """
    if publisher.channel == "filesystem":
        from kelp.publish.fs_channel import FilesystemChannel

        assert publisher.path is not None  # the config validator requires it
        return FilesystemChannel(publisher.path)
    from kelp.publish.redis_channel import RedisChannel

    return RedisChannel.from_config(publisher, store, deployment)


def build_publisher(
    cfg: KelpConfig, registry: CollectorRegistry, validator: ProgressiveValidator | None = None
) -> Publisher:
    """A :class:`Publisher` for ``cfg`` with its metrics in ``registry``.

    It reads four slices: ``publisher`` and ``store`` (the channel), ``features``
    and ``trainer`` (what each snapshot's manifest records about the model).
    The channel logs one warning here when its storage may evict snapshots
    (a Redis whose ``maxmemory-policy`` is ``allkeys-*``), and the publisher
    reads the channel's latest version (:meth:`Publisher.adopt_channel_state`).
    ``validator``: the trainer's progressive validation, recorded in each manifest.

    Raises :class:`~kelp.errors.UserError` when the config cannot publish
    (``channel: redis`` with an in-memory store and no ``publisher.redis_url``).
    """
    channel = build_channel(cfg.publisher, cfg.store, cfg.deployment)
    channel.warn_about_eviction()
    publisher = Publisher(
        channel,
        cfg.features,
        cfg.trainer,
        interval_s=cfg.publisher.interval_s,
        keep_versions=cfg.publisher.keep_versions,
        metrics=PublisherMetrics(registry),
        validator=validator,
    )
    publisher.adopt_channel_state()
    return publisher
