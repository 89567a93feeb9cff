"""The host-mode chaos rig: every service and process on its own network-namespace host.

On one :class:`~kelp.harness.hosts.HostRig` (needs root):

* a Redis Cluster of 3 primaries + 3 replicas, one node per host
  (:class:`~kelp.harness.redis_hosts.RedisHostCluster`); the store is
  ``backend: redis-cluster`` with ``store.durability.replicas_ack: 1``, so a
  push is acknowledged (and its offsets committed) only once a replica holds it;
* Apache Kafka, three KRaft nodes on three hosts
  (:class:`~kelp.harness.kafka_cluster.KafkaCluster`): the topic has
  replication factor 3 and ``min.insync.replicas`` 2, the steady producer
  sends with ``acks=all``;
* ``kelp train`` on its own host and ``kelp serve`` on another (their HTTP
  servers bound to their hosts' addresses), the steady criteo-synth producer,
  the scoring client and the committed-offset watcher in the bench's process
  (the rig's root namespace, which reaches every host through the bridge).

The pieces are the single-host chaos rig's (:mod:`kelp.bench.chaos_rig`,
:mod:`kelp.bench.chaos_load`, :mod:`kelp.bench.chaos_procs`), pointed at hosts.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml

from kelp.bench.chaos_checks import OffsetWatcher
from kelp.bench.chaos_load import ScoreClient, SteadyProducer
from kelp.bench.chaos_procs import KelpProcess
from kelp.bench.chaos_rig import CLIENT_TIMEOUT_S, PARTITIONS, RigLife, chaos_config, wait_first_snapshot
from kelp.bench.runner import progress
from kelp.config import KelpConfig
from kelp.config.store import StoreConfig
from kelp.harness.hosts import Host, HostRig
from kelp.harness.kafka_cluster import KafkaCluster
from kelp.harness.redis_hosts import RedisHostCluster

__all__ = ["REPLICAS_ACK", "HostChaosRig", "host_chaos_config"]

REPLICAS_ACK = 1
"""``store.durability.replicas_ack``: each push waits for one replica (every primary has one)."""
READY_TIMEOUT_S = 180.0
"""A trainer's or replica's first readiness, on a loaded 2-core machine with three JVMs beside it."""


def host_chaos_config(
    cluster: KafkaCluster, topic: str, redis: RedisHostCluster, workdir: Path, *, trainer: Host, serve: Host
) -> KelpConfig:
    """The single-host chaos config on the cluster: every broker, every Redis node, ``replicas_ack``,
    and the trainer's metrics and the replica's API on their hosts' addresses."""
    cfg = chaos_config(cluster.bootstrap, topic, redis.urls[0], workdir)
    cfg.source = cfg.source.model_copy(update={"bootstrap_servers": cluster.bootstrap_servers})
    cfg.store = StoreConfig.model_validate(
        {
            **cfg.store.model_dump(),
            "backend": "redis-cluster",
            "urls": redis.urls,
            "durability": {"replicas_ack": REPLICAS_ACK},
        }
    )
    cfg.metrics.host = trainer.address
    cfg.serving.host = serve.address
    return cfg


class HostChaosRig(RigLife):
    """The services and processes of one host-mode chaos run (a context manager); see the module doc.

    A :class:`~kelp.bench.chaos_rig.RigParts` like the single-host rig (``trainer``,
    ``serve``, ``producer``, ``watcher``, ``client``, ``broker``, ``topic``, ``cfg``, ``join``,
    ``clock``), plus ``net`` (the host rig), ``redis`` (the cluster) and the two process hosts.
    """

    def __init__(self, workdir: Path, produce_rate: float, score_rate: float) -> None:
        self.workdir = workdir
        self.produce_rate = produce_rate
        self.score_rate = score_rate
        self.topic = f"chaos-{uuid.uuid4().hex[:6]}"
        self.join = None
        super().__init__()

    def _start(self) -> None:
        self.net = self._stack.enter_context(HostRig())
        progress("starting a Redis Cluster of 3 primaries + 3 replicas on six hosts")
        self.redis = self._stack.enter_context(RedisHostCluster(self.net, primaries=3, replicas=1))
        progress("starting Apache Kafka: three KRaft nodes on three hosts (RF 3, min.insync.replicas 2)")
        kafka_hosts = [self.net.add_host(f"kafka-{i}") for i in range(3)]
        self.broker = self._stack.enter_context(KafkaCluster(self.net, kafka_hosts))
        self.broker.create_topic(self.topic, PARTITIONS)
        self.trainer_host = self.net.add_host("trainer")
        self.serve_host = self.net.add_host("serve")
        self.cfg = host_chaos_config(
            self.broker,
            self.topic,
            self.redis,
            self.workdir,
            trainer=self.trainer_host,
            serve=self.serve_host,
        )
        path = self.workdir / "kelp.yaml"
        path.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json", exclude_none=True)))
        self.trainer = self._process("train", path, self.trainer_host, self.cfg.metrics.port)
        self.serve = self._process("serve", path, self.serve_host, self.cfg.serving.port)
        self._stack.callback(self.serve.stop, 10.0)
        self._stack.callback(self.trainer.stop, 40.0)
        self.producer = SteadyProducer(
            self.broker.bootstrap, self.topic, PARTITIONS, self.produce_rate, acks="all"
        )
        self._stack.callback(self.producer.finish, 30.0)
        self.watcher = OffsetWatcher(self.broker.bootstrap, self.cfg.source.group_id, self.topic, PARTITIONS)
        self._stack.callback(self.watcher.finish)
        self.client = ScoreClient(
            self.cfg.serving.port, self.score_rate, CLIENT_TIMEOUT_S, host=self.serve_host.address
        )
        self._stack.callback(self.client.finish)
        progress(f"producing {self.produce_rate:,.0f} samples/s, acks=all; kelp train on {self.trainer_host}")
        self.producer.start()
        self.trainer.start()
        if self.trainer.wait_ready(READY_TIMEOUT_S) is None:
            raise RuntimeError(f"kelp train never became ready:\n{self.trainer.log_tail()}")
        self.watcher.start()
        wait_first_snapshot(self.trainer)
        progress(f"kelp serve on {self.serve_host}")
        self.serve.start()
        if self.serve.wait_ready(READY_TIMEOUT_S) is None:
            raise RuntimeError(f"kelp serve never became ready:\n{self.serve.log_tail()}")
        self.client.start()

    def _process(self, command: str, config: Path, host: Host, port: int) -> KelpProcess:
        return KelpProcess(
            command,
            [command, "--config", str(config)],
            port,
            self.workdir,
            http_host=host.address,
            wrap=host.wrap,
        )
