"""A replicated Apache Kafka: three KRaft nodes, each broker and controller, on three rig hosts.

What an operator runs for no loss across a broker failure, on one machine:
each node lives in its own network namespace (a :class:`~kelp.harness.hosts.Host`
of a :class:`~kelp.harness.hosts.HostRig`), listens on its host's address,
and votes in one three-voter controller quorum. Topics made here have
replication factor 3 and ``min.insync.replicas`` 2, the internal topics
(consumer offsets, transactions) too, so any one node can die and every
record a producer with ``acks=all`` saw acknowledged survives on two others.

:meth:`KafkaCluster.kill` is a real crash (SIGKILL; the log directories stay),
:meth:`KafkaCluster.restart` brings a node back on the same address and data,
and :meth:`KafkaCluster.partition` / :meth:`KafkaCluster.heal` cut a node off
the others and the clients through the rig.

Failure detection is tuned down from Kafka's defaults so a test sees leaders
move within seconds: a controller fences a node that missed heartbeats for
``broker.session.timeout.ms`` (3 s here, 9 s by default), and a leader drops a
follower that stopped fetching from the in-sync set after
``replica.lag.time.max.ms`` (3 s here, 30 s by default: until then an
``acks=all`` produce waits for the cut-off follower).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from kelp.harness.hosts import Host, HostRig
from kelp.harness.kafka import LOG4J2_CONFIG
from kelp.harness.kafka_dist import KAFKA_VERSION, ensure_kafka_jars
from kelp.harness.ports import wait_for_port
from kelp.harness.process import ManagedProcess

__all__ = ["KafkaCluster"]

BROKER_PORT = 9092
CONTROLLER_PORT = 9093

# Replication for the internal topics as for the data topics: the group's committed offsets must
# survive a node as the records do.
_DEFAULTS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "4",  # 50 by default: seconds of start-up for nothing
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "unclean.leader.election.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "num.partitions": "1",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "3000",
    "log.retention.check.interval.ms": "3600000",
}


class KafkaCluster:
    """Apache Kafka (KRaft) on ``hosts``, node ids 1..n, one node per host; see the module docstring.

    ``rig``: the :class:`~kelp.harness.hosts.HostRig` the hosts belong to
    (partitions go through it). ``properties`` override or add broker settings.
    ``heap_mb``: each JVM's heap, small so three nodes fit beside the rest of a test.
    """

    name = "Apache Kafka"
    fetch_sessions_work = True

    def __init__(
        self,
        rig: HostRig,
        hosts: Sequence[Host],
        *,
        version: str = KAFKA_VERSION,
        properties: dict[str, str] | None = None,
        heap_mb: int = 256,
        start_timeout_s: float = 120.0,
    ) -> None:
        if len(hosts) < 1:
            raise ValueError("hosts: a cluster needs at least one host")
        self.rig = rig
        self.hosts = list(hosts)
        self.version = version
        self.properties = {**_DEFAULTS, **(properties or {})}
        if len(self.hosts) < 3:  # fewer nodes cannot hold 3 replicas; tests of the harness itself
            n = str(len(self.hosts))
            for key in (
                "default.replication.factor",
                "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor",
                "share.coordinator.state.topic.replication.factor",
            ):
                self.properties[key] = n
            for key in (
                "min.insync.replicas",
                "transaction.state.log.min.isr",
                "share.coordinator.state.topic.min.isr",
            ):
                self.properties[key] = "1"
        self.jvm_opts = [f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        self.jvm_opts.append("-Djava.awt.headless=true")
        self.start_timeout_s = start_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix="kelp-kafka-cluster-"))
        self.cluster_id: str | None = None
        self._libs = ensure_kafka_jars(version)
        self._java = shutil.which("java") or "java"
        self._procs: list[ManagedProcess | None] = [None] * len(self.hosts)
        self._cut: set[int] = set()

    # ------------------------------------------------------------------ addresses

    @property
    def label(self) -> str:
        return f"{self.name} {self.version} ({len(self.hosts)} nodes)"

    @property
    def bootstrap_servers(self) -> list[str]:
        """Every node's ``address:port``: a client finds the cluster through any node that is up."""
        return [f"{h.address}:{BROKER_PORT}" for h in self.hosts]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.bootstrap_servers)

    def node_id(self, i: int) -> int:
        """Kafka's node id of node ``i`` (0-based index into ``hosts``)."""
        return i + 1

    def _dir(self, i: int) -> Path:
        return self.workdir / f"node-{self.node_id(i)}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> KafkaCluster:
        """Format every node's log directory (first start only), start all, wait until all are registered."""
        configs = [self._write_config(i) for i in range(len(self.hosts))]
        if not (self._dir(0) / "data" / "meta.properties").is_file():
            self._format(configs)
        for i in range(len(self.hosts)):
            self._start_node(i)
        self.wait_registered(range(len(self.hosts)))
        return self

    def _start_node(self, i: int) -> None:
        log4j = self.workdir / "log4j2.properties"
        log4j.write_text(LOG4J2_CONFIG)
        argv = [
            self._java,
            *self.jvm_opts,
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={self._dir(i) / 'logs'}",
            "-cp",
            f"{self._libs}/*",
            "kafka.Kafka",
            str(self._dir(i) / "server.properties"),
        ]
        name = f"kafka-{self.node_id(i)}"
        self._procs[i] = self.hosts[i].process(argv, name=name, log_path=self._dir(i) / f"{name}.log")

    def wait_registered(self, nodes: Sequence[int] | range, timeout_s: float | None = None) -> None:
        """Until ``nodes`` listen and the cluster's metadata lists each as a broker."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        for i in nodes:
            if not wait_for_port(BROKER_PORT, max(0.1, deadline - time.monotonic()), self.hosts[i].address):
                raise RuntimeError(f"Kafka node {self.node_id(i)} did not listen:\n{self.log_tail(i)}")
        want = {self.node_id(i) for i in nodes}
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with self.admin(request_timeout_ms=3000) as admin:
                    brokers = admin.describe_cluster().get("brokers", [])
                got = {b["broker_id"] for b in brokers if not b.get("is_fenced")}
                if want <= got:
                    return
                last = RuntimeError(f"registered brokers {sorted(got)}, waiting for {sorted(want)}")
            except Exception as exc:  # kafka-python raises several types while a node is starting
                last = exc
            time.sleep(0.3)
        tails = "\n".join(self.log_tail(i, 15) for i in nodes)
        raise RuntimeError(f"Kafka nodes {sorted(want)} not registered: {last}\n{tails}")

    def alive(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.alive()

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``: a crashed machine's broker. Its log directories stay for :meth:`restart`."""
        proc = self._procs[i]
        if proc is not None:
            proc.kill()
            proc.stop()
            self._procs[i] = None

    def stop(self, i: int) -> None:
        """A clean shutdown of node ``i`` (it hands its leaderships over first)."""
        proc = self._procs[i]
        if proc is not None:
            proc.stop(timeout_s=30.0)
            self._procs[i] = None

    def restart(self, i: int, *, wait: bool = True) -> None:
        """Start node ``i`` again on the same address and data; with ``wait``, until it is registered."""
        if self.alive(i):
            self.kill(i)
        self._start_node(i)
        if wait:
            self.wait_registered([i])

    def partition(self, i: int) -> None:
        """Cut node ``i``'s host off every other host and the clients (the process keeps running)."""
        self._cut.add(i)
        self.rig.partition(self.hosts[i])

    def heal(self, i: int) -> None:
        self.rig.heal(self.hosts[i])
        self._cut.discard(i)

    @contextlib.contextmanager
    def partitioned(self, i: int, seconds: float) -> Iterator[None]:
        """Node ``i`` cut off for ``seconds`` (the body runs meanwhile), healed on exit whatever happens."""
        self.partition(i)
        try:
            started = time.monotonic()
            yield
            time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        finally:
            self.heal(i)

    def cleanup(self) -> None:
        """Stop every node; delete the work folder."""
        for i in range(len(self.hosts)):
            with contextlib.suppress(Exception):
                self.kill(i)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, i: int, lines: int = 40) -> str:
        path = self._dir(i) / f"kafka-{self.node_id(i)}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------------ configuration

    def _write_config(self, i: int) -> Path:
        folder = self._dir(i)
        folder.mkdir(parents=True, exist_ok=True)
        address = self.hosts[i].address
        voters = ",".join(
            f"{self.node_id(j)}@{h.address}:{CONTROLLER_PORT}" for j, h in enumerate(self.hosts)
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id(i)),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{address}:{BROKER_PORT},CONTROLLER://{address}:{CONTROLLER_PORT}",
            "advertised.listeners": f"PLAINTEXT://{address}:{BROKER_PORT}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(folder / "data"),
            **self.properties,
        }
        path = folder / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in props.items()))
        return path

    def _format(self, configs: list[Path]) -> None:
        """``kafka-storage format`` of every node with one cluster id, in parallel (each is a JVM start)."""
        tool = [self._java, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", f"{self._libs}/*"]
        tool.append("kafka.tools.StorageTool")
        if self.cluster_id is None:
            done = subprocess.run(
                [*tool, "random-uuid"], capture_output=True, text=True, timeout=120, check=True
            )
            self.cluster_id = done.stdout.strip().splitlines()[-1]
        procs = [
            subprocess.Popen(
                [*tool, "format", "-t", self.cluster_id, "-c", str(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for config in configs
        ]
        for config, proc in zip(configs, procs, strict=True):
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"kafka-storage format -c {config} failed ({proc.returncode}):\n{out}")

    # ------------------------------------------------------------------ topics

    @contextlib.contextmanager
    def admin(self, **settings: Any) -> Iterator[Any]:
        """A kafka-python admin client bootstrapped from the nodes up (not killed, not cut off).

        kafka-python's admin sends to a node its metadata names, and a dead node stays in the metadata
        until the controller fences it: one attempt after an error goes through another node.
        """
        from kafka import KafkaAdminClient

        up = [b for i, b in enumerate(self.bootstrap_servers) if self.alive(i) and i not in self._cut]
        client = KafkaAdminClient(
            bootstrap_servers=up or self.bootstrap_servers, **{"request_timeout_ms": 10_000, **settings}
        )
        try:
            yield client
        finally:
            client.close()

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        *,
        replication_factor: int | None = None,
    ) -> None:
        """``name`` with ``replication_factor`` (default: every node, at most 3) and the cluster's
        ``min.insync.replicas``; returns once every partition has a leader and a full in-sync set."""
        from kafka.admin import NewTopic

        rf = replication_factor or min(3, len(self.hosts))
        with self.admin() as admin:
            admin.create_topics(
                [
                    NewTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=rf,
                        topic_configs=config or {},
                    )
                ]
            )
        self.wait_in_sync(name, partitions, rf)

    def describe(self, topic: str) -> dict[int, tuple[int, list[int]]]:
        """Per partition: (leader node id, in-sync replica node ids); leader -1 while there is none."""
        try:
            with self.admin(request_timeout_ms=5000) as admin:
                [found] = admin.describe_topics([topic])
        except Exception:  # a node the metadata still lists went away: once more, from the nodes up
            time.sleep(0.5)
            with self.admin(request_timeout_ms=5000) as admin:
                [found] = admin.describe_topics([topic])
        parts = found.get("partitions", [])
        return {p["partition_index"]: (p["leader_id"], list(p["isr_nodes"])) for p in parts}

    def leaders(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``: its leader's node id."""
        return {p: leader for p, (leader, _) in self.describe(topic).items()}

    def wait_in_sync(self, topic: str, partitions: int, replicas: int, timeout_s: float = 60.0) -> None:
        """Until each of ``topic``'s ``partitions`` has a leader and ``replicas`` in-sync replicas."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = self.describe(topic)
                ok = [p for p, (leader, isr) in last.items() if leader >= 0 and len(isr) >= replicas]
                if len(ok) >= partitions:
                    return
            except Exception as exc:  # the topic's metadata is not there yet
                last = exc
            time.sleep(0.2)
        raise RuntimeError(f"topic {topic}: not {partitions} partitions with {replicas} in sync: {last}")

    def __enter__(self) -> KafkaCluster:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()
