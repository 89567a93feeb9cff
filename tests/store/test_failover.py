"""A Redis Cluster primary dies mid-stream: with ``durability.replicas_ack`` no acknowledged update is lost.

Real ``redis-server`` processes, 3 primaries + 3 replicas, each on its own host
(network namespace) of a :class:`~kelp.harness.hosts.HostRig`. Pushes go
through the production write path (``build_store``, ``backend: redis-cluster``);
push ``v`` writes every element of its rows as ``v`` and, once acknowledged, is
recorded as those rows' acknowledged version. One primary's replica is paused
(SIGSTOP: it stops receiving the replication stream, as a lagging or cut-off
replica does), a few pushes are attempted, the primary is SIGKILLed, the replica
resumes and is promoted, the store follows the new slot map, and every row is
read back: an acknowledged update is lost when its row reads older than it
(``acked_updates_lost``, as in ``kelp bench chaos``). The standalone test needs
no rig: ``WAIT`` against a primary with and without a replica.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.bench.chaos_durability import TABLE, VersionedRows
from kelp.config.store import StoreConfig
from kelp.harness import RedisServer
from kelp.harness.hosts import HostRig, available
from kelp.harness.redis_hosts import RedisHostCluster
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.base import EmbeddingStore
from kelp.store.redis.durability import NotDurableError

pytestmark = pytest.mark.integration

ROWS = 512
PER_PUSH = 64
FAILOVER_BOUND_S = 60.0
"""Generous poll deadline for a loaded 2-core machine; the measured times are reported, not asserted."""


def _store(
    urls: list[str],
    backend: str,
    replicas_ack: int,
    registry: CollectorRegistry,
    deployment: str | None = None,
) -> EmbeddingStore:
    cfg = StoreConfig(
        backend=backend,  # type: ignore[arg-type]
        urls=urls,
        socket_timeout_s=2.0,
        connect_timeout_s=1.0,
        durability={"replicas_ack": replicas_ack, "replicas_ack_timeout_ms": 300},  # type: ignore[arg-type]
    )
    # One attempt per call: the loop below retries, as the trainer's outage guard does.
    deployment = deployment or f"fo-{uuid.uuid4().hex[:8]}"
    return build_store(cfg, [TABLE], deployment, registry, retry=RetryPolicy(1, 0.0, 0.0))


def _wait_failures(registry: CollectorRegistry) -> float:
    total = 0.0
    for metric in registry.collect():
        if metric.name == "kelp_store_replica_ack_failures":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


@dataclass
class Writer:
    """Pushes versioned rows; remembers each row's last acknowledged version."""

    store: EmbeddingStore
    seed: int = 0

    def __post_init__(self) -> None:
        self.versions = VersionedRows(ROWS, PER_PUSH, self.seed)
        self.ids = self.versions.ids

    @property
    def pushes_acked(self) -> int:
        return self.versions.pushes_acked

    def push(self) -> bool:
        """One push of fresh versions; True when it was acknowledged."""
        return self.versions.push(self.store)

    def push_until_acked(self, deadline_s: float) -> float:
        """Retry pushes until one is acknowledged; seconds it took."""
        started = time.monotonic()
        while not self.push():
            if time.monotonic() - started > deadline_s:
                raise AssertionError(f"no push acknowledged within {deadline_s}s")
            time.sleep(0.05)
        return time.monotonic() - started

    def lost(self, reader: EmbeddingStore | None = None) -> int:
        """Acknowledged row versions the store no longer has (read back with retries, through
        ``reader`` when given: another client, as a serving replica reads)."""
        return self.versions.lost(reader or self.store, retry_s=FAILOVER_BOUND_S)


@dataclass
class Failover:
    acked_before: int
    acked_while_replica_paused: int
    lost: int
    promoted_after_s: float
    first_push_after_kill_s: float


@pytest.fixture(scope="module")
def host_cluster() -> Iterator[RedisHostCluster]:
    ok, why = available()
    if not ok:
        pytest.skip(f"host rig unavailable here: {why}")
    with HostRig() as rig, RedisHostCluster(rig, node_timeout_ms=2000) as cluster:
        yield cluster


def _failover(cluster: RedisHostCluster, writer: Writer) -> Failover:
    """Pause a primary's replica, push a little, kill the primary, resume and promote the replica,
    push until acknowledged again, bring the old primary back as a replica, count what was lost."""
    for _ in range(20):
        writer.push_until_acked(FAILOVER_BOUND_S)
    before = writer.pushes_acked
    key = b"{" + TABLE.name.encode()  # any key: we only need one primary and its replica
    victim = cluster.primary_of(key)
    replica = cluster.replicas_of(victim)[0]
    cluster.pause(replica)
    try:
        paused_until = time.monotonic() + 1.0  # below cluster-node-timeout: the replica stays eligible
        while time.monotonic() < paused_until:
            writer.push()
        paused_acks = writer.pushes_acked - before
        killed = time.monotonic()
        cluster.kill(victim)
    finally:
        cluster.resume(replica)
    promoted = cluster.wait_promoted(victim, key, FAILOVER_BOUND_S)
    promoted_s = time.monotonic() - killed
    assert promoted.name == replica.name
    cluster.start_node(victim)  # after the promotion: it rejoins as the new primary's replica
    writer.push_until_acked(FAILOVER_BOUND_S)
    first_push_s = time.monotonic() - killed
    for _ in range(10):
        writer.push_until_acked(FAILOVER_BOUND_S)
    cluster.wait_healthy(FAILOVER_BOUND_S)
    return Failover(before, paused_acks, writer.lost(), promoted_s, first_push_s)


def test_replicas_ack_loses_no_acknowledged_update_across_a_failover(
    host_cluster: RedisHostCluster, record_property: pytest.RecordProperty
) -> None:
    registry = CollectorRegistry()
    deployment = f"fo-{uuid.uuid4().hex[:8]}"
    with (
        _store(host_cluster.urls, "redis-cluster", 1, registry, deployment) as store,
        _store(host_cluster.urls, "redis-cluster", 0, CollectorRegistry(), deployment) as replica_reader,
    ):
        writer = Writer(store)
        replica_reader.pull(TABLE.name, writer.ids, count=False)  # its slot map is the one before the kill
        result = _failover(host_cluster, writer)
        # A serving replica's client, built before the failover, follows the new topology too.
        seen_by_serving = writer.lost(reader=replica_reader)
    record_property("failover", str(result))
    print(f"replicas_ack 1: {result}")
    assert result.acked_while_replica_paused == 0  # WAIT held back every push its replica missed
    assert _wait_failures(registry) > 0
    assert result.lost == 0, f"acked_updates_lost_replicas_ack: {result.lost}"
    assert seen_by_serving == 0


def test_without_replicas_ack_the_loss_is_measured(
    host_cluster: RedisHostCluster, record_property: pytest.RecordProperty
) -> None:
    """The control: the same failover with ``replicas_ack: 0``; its loss is reported, not asserted."""
    with _store(host_cluster.urls, "redis-cluster", 0, CollectorRegistry()) as store:
        result = _failover(host_cluster, Writer(store, seed=1))
    record_property("failover", str(result))
    print(f"replicas_ack 0: {result}")
    assert result.acked_while_replica_paused > 0  # the primary alone acknowledged them
    assert result.promoted_after_s > 0


def test_store_follows_moved_after_a_manual_failover_and_still_waits_for_replicas(
    host_cluster: RedisHostCluster,
) -> None:
    """``CLUSTER FAILOVER``: the old primary answers ``MOVED``; the push is re-run on the new routes."""
    registry = CollectorRegistry()
    with _store(host_cluster.urls, "redis-cluster", 1, registry) as store:
        writer = Writer(store, seed=2)
        writer.push_until_acked(FAILOVER_BOUND_S)
        key = b"{" + TABLE.name.encode()
        old = host_cluster.primary_of(key)
        new = host_cluster.replicas_of(old)[0]
        new.client().execute_command("CLUSTER", "FAILOVER")
        assert host_cluster.wait_promoted(old, key, FAILOVER_BOUND_S).name == new.name
        host_cluster.wait_healthy(FAILOVER_BOUND_S)
        for _ in range(5):
            writer.push_until_acked(FAILOVER_BOUND_S)
        assert writer.lost() == 0
    reroutes = registry.get_sample_value("kelp_store_retries_total", {"op": "reroute"})
    assert reroutes is not None and reroutes >= 1


def test_durability_fields_are_checked_at_load() -> None:
    with pytest.raises(ValueError, match="replicas_ack needs backend redis"):
        StoreConfig(durability={"replicas_ack": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"replicas_ack_timeout_ms .* must be below socket_timeout_s"):
        StoreConfig(
            backend="redis",
            urls=["redis://127.0.0.1:1"],
            durability={"replicas_ack": 1, "replicas_ack_timeout_ms": 2000},  # type: ignore[arg-type]
        )


def test_standalone_push_waits_for_replicas_and_fails_without_them() -> None:
    """``WAIT`` on a standalone shard: refused (retriable, counted) with no replica, acknowledged with one."""
    primary = RedisServer().start()
    replica: RedisServer | None = None
    try:
        registry = CollectorRegistry()
        with _store([primary.url], "redis", 1, registry) as store:
            writer = Writer(store)
            with pytest.raises(NotDurableError, match="0 of 1 replicas") as failed:
                store.push(TABLE.name, writer.ids[:4], np.ones((4, TABLE.dim), np.float32), np.zeros(4))
            assert failed.value.retriable
            assert _wait_failures(registry) == 1
            replica = RedisServer(extra_args=["--replicaof", primary.host, str(primary.port)]).start()
            writer.push_until_acked(FAILOVER_BOUND_S)
            assert replica.client().dbsize() > 0  # WAIT returned once the replica held the rows
    finally:
        if replica is not None:
            replica.cleanup()
        primary.cleanup()
