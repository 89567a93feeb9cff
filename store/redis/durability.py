"""What a Redis crash can lose: read each primary's persistence settings on connect, say it, export it.

Kelp commits a batch's Kafka offsets once Redis has acknowledged its push.
Redis acknowledges a write when it is in memory, not when it is on disk, so
what "acknowledged" is worth after a crash (SIGKILL, OOM kill, power loss)
depends on the server's settings, which Kelp does not own:

=====================  ==========================  ==========================================
appendonly             appendfsync                 an acknowledged row update after a crash
=====================  ==========================  ==========================================
yes                    always                      survives: fsync before the reply
yes                    everysec                    lost if it was in the last ~1 s
yes                    no                          lost if the OS had not flushed it (~30 s)
no                     (any)                       lost unless an RDB snapshot came after it
=====================  ==========================  ==========================================

A failover is the other way to lose an acknowledged write: a replica promoted
before it received the write never has it, whatever the primary's fsync
setting. With ``store.durability.replicas_ack`` n > 0 (:class:`ReplicaWait`),
every shard's push pipeline ends with ``WAIT n timeout`` on the same connection
as its writes, so the reply counts the replicas holding all of them; fewer than
n fails that shard's push with :class:`NotDurableError` (retriable: retried as
an unreachable shard is, never acknowledged, its offsets never committed) and
counts ``kelp_store_replica_ack_failures_total{shard}``. With n = 0 a push is
acknowledged by the primary alone.

:func:`report_durability` runs once, at the store's first contact with Redis.
Per primary it logs one line and sets
``kelp_store_durability_info{shard,appendonly,appendfsync} 1`` and
``kelp_store_acked_loss_bound_seconds{shard}`` (0 for ``always``, 1 for
``everysec``, 30 for ``no``, +Inf without the append-only file, NaN when
``CONFIG GET`` is not permitted, e.g. under a restrictive ACL).
"""

from __future__ import annotations

import logging
import math
import weakref
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from kelp.config.store import StoreConfig
from kelp.metrics import MetricFactory
from kelp.store.errors import ShardUnavailableError

__all__ = [
    "WAITED_OPS",
    "Durability",
    "NotDurableError",
    "ReplicaWait",
    "durability_of",
    "read_durability",
    "replica_wait",
    "report_durability",
]

log = logging.getLogger("kelp.store.durability")  # the name users filter on, kept across moves

UNKNOWN = "unknown"

_BOUND_S = {"always": 0.0, "everysec": 1.0, "no": 30.0}
"""Seconds of acknowledged writes a crash can lose with ``appendonly yes``, per ``appendfsync``.
``no`` leaves flushing to the kernel: Linux writes dirty pages back after 30 s by default."""


@dataclass(frozen=True)
class Durability:
    """One primary's persistence settings, as read from it (``unknown`` where it would not say)."""

    shard: str
    appendonly: str
    appendfsync: str

    @property
    def loss_bound_s(self) -> float:
        """Seconds of acknowledged writes a crash may lose; inf: everything since the last snapshot."""
        if self.appendonly == "yes":
            return _BOUND_S.get(self.appendfsync, math.nan)
        return math.inf if self.appendonly == "no" else math.nan

    @property
    def guarantee(self) -> str:
        """One sentence for the operator's log."""
        bound = self.loss_bound_s
        if math.isnan(bound):
            return (
                "could not read appendonly/appendfsync (CONFIG GET refused): "
                "the durability of acknowledged writes is unknown"
            )
        if math.isinf(bound):
            return (
                "appendonly no: a crash loses every acknowledged write since the last RDB snapshot; "
                "set appendonly yes + appendfsync always to lose none (docs/store.md, Durability)"
            )
        if bound == 0:
            return "appendonly yes + appendfsync always: an acknowledged write survives a crash"
        return (
            f"appendonly yes + appendfsync {self.appendfsync}: a crash may lose the last ~{bound:g} s "
            "of acknowledged writes; appendfsync always loses none"
        )


def read_durability(client: Any, shard: str) -> Durability:
    """``CONFIG GET appendonly`` and ``appendfsync`` of one node; ``unknown`` when refused or down."""
    try:
        got = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
    except Exception as exc:  # NOPERM under an ACL, a renamed CONFIG, a node gone: report, never fail
        log.debug("could not read persistence settings of %s: %s", shard, exc)
        return Durability(shard, UNKNOWN, UNKNOWN)
    return Durability(
        shard, str(got.get("appendonly", UNKNOWN)).lower(), str(got.get("appendfsync", UNKNOWN)).lower()
    )


_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, tuple[Gauge, Gauge]] = weakref.WeakKeyDictionary()
"""One pair of gauges per registry: several stores (trainer, publisher, serving) may share one."""


def _gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    if registry not in _GAUGES:
        m = MetricFactory("store", registry)
        _GAUGES[registry] = (
            m.gauge(
                "durability",
                "1 per primary, labelled with its appendonly/appendfsync settings as read on connect",
                ["shard", "appendonly", "appendfsync"],
                unit="info",
            ),
            m.gauge(
                "acked_loss_bound",
                "Seconds of acknowledged writes a crash of this primary may lose (0: appendfsync always; "
                "+Inf: no append-only file; NaN: settings unreadable)",
                ["shard"],
                unit="seconds",
            ),
        )
    return _GAUGES[registry]


def _primaries(store: Any) -> list[tuple[str, Any]]:
    """``(name, client)`` of every primary of a Redis store, standalone or cluster."""
    clients = getattr(store, "_clients", None)
    if clients is not None:
        return list(zip(store.shard_names, clients, strict=True))
    cluster = getattr(store, "_client", None)
    if cluster is None:
        return []
    return [(f"{n.host}:{n.port}", n.redis_connection) for n in cluster.get_primaries()]


def report_durability(store: Any, *, writer: bool = True) -> list[Durability]:
    """Read, log (one line per primary) and export the durability of ``store``'s primaries.

    Never raises: a store that may not run ``CONFIG`` still works, and says so.
    ``writer`` False (a serving replica, which never writes rows) logs at debug: what a
    crash loses is the trainer's concern, and an info line per replica start reads as a warning.
    """
    try:
        primaries = _primaries(store)
    except Exception as exc:  # cluster topology not known yet: the next contact will not retry; say so
        log.debug("could not list the primaries for the durability report: %s", exc)
        return []
    info, bound = _gauges(store.metrics.registry)
    found = []
    for name, client in primaries:
        d = read_durability(client, name)
        found.append(d)
        info.labels(shard=name, appendonly=d.appendonly, appendfsync=d.appendfsync).set(1)
        bound.labels(shard=name).set(d.loss_bound_s)
        log.log(logging.INFO if writer else logging.DEBUG, "store %s durability: %s", name, d.guarantee)
    _LAST[store] = found
    return found


_LAST: weakref.WeakKeyDictionary[Any, list[Durability]] = weakref.WeakKeyDictionary()


def durability_of(store: Any) -> list[Durability]:
    """What :func:`report_durability` found for ``store`` (empty before its first contact)."""
    return _LAST.get(store, [])


WAITED_OPS = frozenset({"push"})
"""Plan ops whose pipelines end with ``WAIT``: the row writes a ticket stands for (pushes, loads)."""


class NotDurableError(ShardUnavailableError):
    """Fewer replicas than ``store.durability.replicas_ack`` confirmed a shard's push in time.

    Retriable, as an unreachable shard is: the push is not acknowledged, so its
    offsets are not committed, and sending it again is safe (rows are whole-row
    writes). It persists while a shard has fewer live replicas than asked for."""


_WAIT_FAILURES: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _wait_failures(registry: CollectorRegistry) -> Counter:
    if registry not in _WAIT_FAILURES:
        _WAIT_FAILURES[registry] = MetricFactory("store", registry).counter(
            "replica_ack_failures",
            "Shard push pipelines that fewer than store.durability.replicas_ack replicas confirmed within "
            "replicas_ack_timeout_ms (WAIT): the push failed, was not acknowledged, and is retried",
            ["shard"],
        )
    return _WAIT_FAILURES[registry]


@dataclass(frozen=True)
class ReplicaWait:
    """``WAIT replicas timeout_ms`` at the end of a shard's push pipeline, and the check of its reply."""

    replicas: int
    timeout_ms: int
    registry: CollectorRegistry

    def command(self) -> tuple[Any, ...]:
        return ("WAIT", self.replicas, self.timeout_ms)

    def check(self, shard: str, acked: Any) -> None:
        """Raise :class:`NotDurableError` unless ``acked`` (WAIT's reply) reaches :attr:`replicas`."""
        got = int(acked)
        if got < self.replicas:
            _wait_failures(self.registry).labels(shard=shard).inc()
            raise NotDurableError(
                shard,
                f"{got} of {self.replicas} replicas confirmed the push within {self.timeout_ms} ms "
                "(store.durability.replicas_ack); not acknowledged, retried",
            )


def replica_wait(cfg: StoreConfig, registry: CollectorRegistry) -> ReplicaWait | None:
    """The store's :class:`ReplicaWait`, or None when ``store.durability.replicas_ack`` is 0."""
    d = cfg.durability
    if not d.replicas_ack:
        return None
    _wait_failures(registry)  # declared with the store: a scrape lists it before the first failure
    return ReplicaWait(d.replicas_ack, d.replicas_ack_timeout_ms, registry)
