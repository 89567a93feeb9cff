"""The host-mode chaos faults: machines fail, not processes in place.

Each injector does one thing to the :class:`~kelp.bench.chaos_host_rig.HostChaosRig`
and returns what it saw, with the evidence that the fault happened:

* ``redis_primary_kill``: SIGKILL of a Redis Cluster primary while a writer
  pushes rows through Kelp's store (``backend: redis-cluster``,
  ``replicas_ack`` as the trainer's); its replica is promoted, the killed node
  restarts and rejoins as the new primary's replica, and every row is read
  back: ``acked_updates_lost`` counts acknowledged row versions the promoted
  replica lacks (:func:`probe_failover`, as :mod:`kelp.bench.chaos_durability`
  does for a restart on ``appendfsync always``);
* ``broker_kill``: SIGKILL of the Kafka node leading partition 0; the
  partition leaders move, the node restarts on its log directories and
  rejoins the in-sync sets;
* ``trainer_partition``: the trainer's host cut off (link down) for a bounded
  time, then healed;
* ``packet_loss``: 5 % of the packets in and out of a Redis primary's host
  dropped for 10 s (netem, or an nftables rule where the kernel has no
  netem); the kernel's TCP retransmissions across the rig show it bit.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from kelp.bench.chaos_durability import TABLE, VersionedRows
from kelp.bench.chaos_faults import Health, with_evidence
from kelp.bench.chaos_host_rig import HostChaosRig
from kelp.bench.chaos_rig import PARTITIONS, STORE_SOCKET_TIMEOUT_S
from kelp.config.store import StoreConfig
from kelp.harness.redis_hosts import RedisHostCluster
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.base import EmbeddingStore

__all__ = ["HOST_FAULTS", "FailoverProbe", "inject_host", "probe_failover"]

FAILOVER_TIMEOUT_S = 90.0
"""Poll deadline for a promotion, a broker's return, a push acknowledged again (a loaded machine)."""
LOSS_PCT = 5.0
LOSS_S = 10.0
PROBE_KEY = b"{chaos-failover}"
"""Names the primary the faults pick: whichever serves this key's slot."""


@dataclass
class FailoverProbe:
    """What one primary's death cost: ``lost`` of ``acked_rows`` acknowledged row versions (0 is the
    promise with ``replicas_ack``), and how long the failover took."""

    pushes_acked: int
    acked_rows: int
    lost: int
    killed: str
    promoted: str
    promotion_s: float
    first_push_after_kill_s: float


class _Writer:
    """Pushes :class:`~kelp.bench.chaos_durability.VersionedRows` until stopped (a failed push was
    never acknowledged and is simply tried again), timing the first acknowledgement of a push begun
    after :attr:`since`."""

    def __init__(self, store: EmbeddingStore, rows: int, per_push: int, seed: int) -> None:
        self.store = store
        self.versions = VersionedRows(rows, per_push, seed)
        self.since: float | None = None
        self.first_ack_since_s: float | None = None
        """Seconds from :attr:`since` until a push begun after it was acknowledged (a push begun
        before a kill may still be acknowledged after it: it says nothing about the failover)."""
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            begun = time.monotonic()
            if not self.versions.push(self.store):
                time.sleep(0.05)
                continue
            since = self.since
            if since is not None and begun > since and self.first_ack_since_s is None:
                self.first_ack_since_s = round(time.monotonic() - since, 2)

    def acked_since(self) -> bool:
        return self.first_ack_since_s is not None


def _probe_store(cluster: RedisHostCluster, replicas_ack: int) -> EmbeddingStore:
    cfg = StoreConfig(
        backend="redis-cluster",
        urls=cluster.urls,
        socket_timeout_s=STORE_SOCKET_TIMEOUT_S,
        connect_timeout_s=STORE_SOCKET_TIMEOUT_S,
        durability={"replicas_ack": replicas_ack},
    )
    deployment = f"failover-{uuid.uuid4().hex[:8]}"
    return build_store(cfg, [TABLE], deployment, CollectorRegistry(), retry=RetryPolicy(1, 0.0, 0.0))


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{what} not within {timeout_s:.0f}s")
        time.sleep(0.1)
    return round(time.monotonic() - started, 2)


def probe_failover(
    cluster: RedisHostCluster,
    replicas_ack: int,
    *,
    rows: int = 512,
    per_push: int = 64,
    min_pushes: int = 50,
    seed: int = 0,
) -> FailoverProbe:
    """Push until ``min_pushes`` were acknowledged, SIGKILL the primary of :data:`PROBE_KEY` mid-stream,
    wait for its replica's promotion, restart the killed node (it rejoins as a replica), push until
    acknowledged again, and count the acknowledged versions the cluster no longer has."""
    with _probe_store(cluster, replicas_ack) as store:
        writer = _Writer(store, rows, per_push, seed)
        thread = threading.Thread(target=writer.run, name="failover-writer", daemon=True)
        thread.start()
        try:
            _wait(
                lambda: writer.versions.pushes_acked >= min_pushes, FAILOVER_TIMEOUT_S, f"{min_pushes} pushes"
            )
            victim = cluster.primary_of(PROBE_KEY)
            killed_at = time.monotonic()
            writer.since = killed_at
            cluster.kill(victim)  # SIGKILL while the writer is mid-stream
            promoted = cluster.wait_promoted(victim, PROBE_KEY, FAILOVER_TIMEOUT_S)
            promotion_s = round(time.monotonic() - killed_at, 2)
            cluster.start_node(victim)  # after the promotion: it comes back as the new primary's replica
            _wait(writer.acked_since, FAILOVER_TIMEOUT_S, "a push begun after the kill acknowledged")
        finally:
            writer.stop.set()
            thread.join(30)
        cluster.wait_healthy(FAILOVER_TIMEOUT_S)
        lost = writer.versions.lost(store, retry_s=FAILOVER_TIMEOUT_S, pause_s=0.2)
    return FailoverProbe(
        writer.versions.pushes_acked,
        writer.versions.acked_rows,
        lost,
        victim.name,
        promoted.name,
        promotion_s,
        writer.first_ack_since_s or 0.0,
    )


def redis_primary_kill(rig: HostChaosRig, health: Health, rng: random.Random) -> dict[str, Any]:
    probe = probe_failover(rig.redis, rig.cfg.store.durability.replicas_ack, seed=rng.randrange(1 << 30))
    return {
        "killed_primary": probe.killed,
        "promoted_replica": probe.promoted,
        "promotion_s": probe.promotion_s,
        "first_push_after_kill_s": probe.first_push_after_kill_s,
        "acked_pushes": probe.pushes_acked,
        "acked_rows": probe.acked_rows,
        "acked_updates_lost": probe.lost,
        "replicas_ack": rig.cfg.store.durability.replicas_ack,
    }


def broker_kill(rig: HostChaosRig, health: Health, rng: random.Random) -> dict[str, Any]:
    kafka = rig.broker
    victim_id = kafka.leaders(rig.topic)[0]
    victim = victim_id - 1
    committed = rig.watcher.latest()
    killed_at = time.monotonic()
    kafka.kill(victim)

    def moved() -> bool:
        try:
            leaders = kafka.leaders(rig.topic).values()
        except Exception:  # the metadata still names the dead node: not yet
            return False
        return all(leader not in (-1, victim_id) for leader in leaders)

    leaders_moved_s = _wait(moved, FAILOVER_TIMEOUT_S, "partition leaders away from the killed broker")
    down_s = round(rng.uniform(3.0, 6.0), 2)
    time.sleep(max(0.0, down_s - (time.monotonic() - killed_at)))
    kafka.restart(victim, wait=True)
    back_s = round(time.monotonic() - killed_at, 2)
    kafka.wait_in_sync(rig.topic, PARTITIONS, 3, FAILOVER_TIMEOUT_S)
    in_sync_s = round(time.monotonic() - killed_at, 2)
    advanced_s = None
    if _wait_or_none(lambda: _advanced(rig.watcher.latest(), committed), FAILOVER_TIMEOUT_S):
        advanced_s = round(time.monotonic() - killed_at, 2)
    return {
        "killed_broker": victim_id,
        "broker_down_s": down_s,
        "leaders_moved_after_s": leaders_moved_s,
        "broker_back_after_s": back_s,
        "in_sync_again_after_s": in_sync_s,
        "commits_advanced_after_s": advanced_s,
    }


def _advanced(now: list[int], before: list[int]) -> bool:
    return any(n > b for n, b in zip(now, before, strict=True))


def _wait_or_none(check: Callable[[], bool], timeout_s: float) -> bool:
    try:
        _wait(check, timeout_s, "")
    except RuntimeError:
        return False
    return True


def trainer_partition(rig: HostChaosRig, health: Health, rng: random.Random) -> dict[str, Any]:
    """The trainer's host cut off: no broker, no Redis; bounded well below ``max_store_outage_s``."""
    length = round(rng.uniform(5.0, 8.0), 2)
    started = time.monotonic()
    with rig.net.partitioned(rig.trainer_host, duration_s=length):
        time.sleep(length / 2)
        reachable = rig.trainer.ready()  # the bench's side of the cut: the trainer must not answer
        time.sleep(max(0.0, length - (time.monotonic() - started)))
    return {
        "partitioned_host": rig.trainer_host.name,
        "partition_s": round(time.monotonic() - started, 2),
        "trainer_reachable_while_cut": reachable,
        "trainer_alive_after_heal": rig.trainer.alive(),
    }


def packet_loss(rig: HostChaosRig, health: Health, rng: random.Random) -> dict[str, Any]:
    """5 % loss both ways on a Redis primary's host for 10 s; the rig's TCP retransmissions show it."""
    host = rig.redis.primary_of(PROBE_KEY).host
    hosts = list(rig.net.hosts.values())
    before = sum(rig.net.tcp_retransmits(h) for h in hosts)
    mechanism = "netem" if rig.net.netem_available()[0] else "nftables"
    started = time.monotonic()
    with rig.net.fault(host, loss_pct=LOSS_PCT, duration_s=LOSS_S):
        time.sleep(LOSS_S)
    lossy_s = round(time.monotonic() - started, 2)
    return {
        "lossy_host": host.name,
        "loss_pct": LOSS_PCT,
        "loss_s": lossy_s,
        "loss_by": mechanism,
        "tcp_retransmits_during": sum(rig.net.tcp_retransmits(h) for h in hosts) - before,
    }


HOST_FAULTS: dict[str, Callable[[HostChaosRig, Health, random.Random], dict[str, Any]]] = {
    "redis_primary_kill": redis_primary_kill,
    "broker_kill": broker_kill,
    "trainer_partition": trainer_partition,
    "packet_loss": packet_loss,
}


def inject_host(rig: HostChaosRig, health: Health, kind: str, rng: random.Random) -> dict[str, Any]:
    """Run host fault ``kind`` with the chaos suite's evidence (both processes' counters before and
    after, the scoring answers during it) and recovery (training and answering 200 again)."""
    return with_evidence(rig, health, kind, lambda: HOST_FAULTS[kind](rig, health, rng))
