"""The reference broker: a single-node Apache Kafka 4 in KRaft mode on free loopback ports.

Started the way an operator starts one: ``kafka-storage format`` (here
``kafka.tools.StorageTool``, with the SCRAM users added at format time, as
KRaft wants) then ``kafka.Kafka server.properties``, from the jars
:mod:`kelp.harness.kafka_dist` fetched. One process is broker and controller.

Listeners, each on its own port:

* ``PLAINTEXT``: :attr:`ApacheKafka.bootstrap`, what most tests use;
* ``SASL_SSL`` with SCRAM-SHA-512: :attr:`ApacheKafka.sasl_ssl_bootstrap`,
  user :attr:`ApacheKafka.scram_username` / :attr:`ApacheKafka.scram_password`;
* ``SSL`` with client certificates required (mTLS):
  :attr:`ApacheKafka.ssl_bootstrap`.

Both TLS listeners present a server certificate for ``127.0.0.1`` from a
throwaway CA made at start (:func:`kelp.harness.redis_tls.make_test_pki`,
kept in :attr:`ApacheKafka.pki`, with a client certificate of that CA and a
*stranger* of another CA). The log directories live in the broker's own work
folder, so :meth:`ApacheKafka.restart` comes back with every topic, record
and committed offset, and :meth:`ApacheKafka.kill` is a real crash.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from kelp.harness.kafka_dist import KAFKA_VERSION, ensure_kafka_jars
from kelp.harness.ports import free_port, wait_for_port
from kelp.harness.process import ManagedProcess
from kelp.harness.redis_tls import TestPki, make_test_pki

__all__ = ["LOG4J2_CONFIG", "ApacheKafka"]

# Short enough for tests, long enough for a JVM on two busy cores. Tests that
# need a specific value pass it through ``properties``.
_DEFAULTS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",  # 50 by default: several seconds of start-up for nothing
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "delete.topic.enable": "true",
    # Hostile-record tests produce records of many MB; the broker default (1 MB) refuses them.
    "message.max.bytes": str(32 * 1024 * 1024),
    "socket.request.max.bytes": str(64 * 1024 * 1024),
    "log.retention.check.interval.ms": "3600000",
}

LOG4J2_CONFIG = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


class ApacheKafka:
    """Apache Kafka ``version`` (KRaft, one node); see the module docstring for its listeners.

    ``properties`` override or add broker settings (``server.properties`` keys).
    ``jvm_opts`` replace the default heap and GC flags. ``workdir`` (default: a
    new temporary folder, deleted by :meth:`cleanup`) holds the log
    directories, the certificates and the broker's own log; one passed in is
    left in place for a post-mortem.
    """

    name = "Apache Kafka"
    fetch_sessions_work = True  # incremental fetch sessions (KIP-227), the clients' default

    def __init__(
        self,
        start_timeout_s: float = 60.0,
        *,
        version: str = KAFKA_VERSION,
        properties: dict[str, str] | None = None,
        jvm_opts: list[str] | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.version = version
        self.start_timeout_s = start_timeout_s
        self.properties = {**_DEFAULTS, **(properties or {})}
        self.jvm_opts = jvm_opts or ["-Xms256m", "-Xmx1g", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kelp-kafka-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.sasl_ssl_port = free_port()
        self.ssl_port = free_port()
        self.controller_port = free_port()
        self.scram_username = "kelp"
        self.scram_password = secrets.token_urlsafe(18)
        self.cluster_id: str | None = None
        self.pki: TestPki | None = None
        self._libs = ensure_kafka_jars(version)
        self._java = shutil.which("java") or "java"
        self._proc: ManagedProcess | None = None

    @property
    def label(self) -> str:
        """What ran, for logs and benchmark reports: ``Apache Kafka 4.1.1``."""
        return f"{self.name} {self.version}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_ssl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def storage(self) -> str:
        """Where the records live, for reports (the same words as Tansu's storage URL)."""
        return f"log.dirs={self.log_dir}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ApacheKafka:
        if self.pki is None:
            self.pki = make_test_pki(self.workdir / "pki")
            # Kafka's PEM key store wants the PKCS#8 key and the certificate chain in one file.
            pem = self.workdir / "pki" / "server-keystore.pem"
            pem.write_text(self.pki.server_key.read_text() + self.pki.server_cert.read_text())
        config = self._write_config()
        if not (self.log_dir / "meta.properties").is_file():
            self._format(config)
        proc = ManagedProcess(
            [
                self._java,
                *self.jvm_opts,
                *self._log_opts(),
                "-cp",
                f"{self._libs}/*",
                "kafka.Kafka",
                str(config),
            ],
            f"kafka-{self.port}",
            workdir=self.workdir,
        )
        proc.start()
        self._proc = proc
        if not wait_for_port(self.port, self.start_timeout_s):
            tail = proc.log_tail(40)
            self.stop()
            raise RuntimeError(
                f"Apache Kafka did not listen on {self.port} within {self.start_timeout_s}s:\n{tail}"
            )
        self._wait_metadata()
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop(timeout_s=30.0)  # a clean shutdown writes its checkpoints
            self._proc = None

    def kill(self) -> None:
        """SIGKILL, no clean shutdown: a crashed broker. Its log directories stay for :meth:`restart`."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.stop()
            self._proc = None

    def restart(self) -> ApacheKafka:
        """Start again on the same ports and log directories: topics, records and offsets survive."""
        self.stop()
        return self.start()

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def cleanup(self) -> None:
        """Stop; delete the work folder (log directories, certificates) if this broker made it."""
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return self._proc.log_tail(lines) if self._proc is not None else ""

    def _log_opts(self) -> list[str]:
        path = self.workdir / "log4j2.properties"
        path.write_text(LOG4J2_CONFIG)
        return [f"-Dlog4j2.configurationFile={path}", f"-Dkafka.logs.dir={self.workdir / 'logs'}"]

    def _write_config(self) -> Path:
        assert self.pki is not None
        host = "127.0.0.1"
        listeners = {
            "PLAINTEXT": self.port,
            "SASL_SSL": self.sasl_ssl_port,
            "SSL": self.ssl_port,
        }
        advertised = ",".join(f"{name}://{host}:{port}" for name, port in listeners.items())
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{host}:{self.controller_port}",
            "listeners": f"{advertised},CONTROLLER://{host}:{self.controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(
                f"{name}:{name}" for name in (*listeners, "CONTROLLER")
            ).replace("CONTROLLER:CONTROLLER", "CONTROLLER:PLAINTEXT"),
            "log.dirs": str(self.log_dir),
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.workdir / "pki" / "server-keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.pki.ca),
            "listener.name.ssl.ssl.client.auth": "required",
            **self.properties,
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in props.items()))
        return path

    def _format(self, config: Path) -> None:
        classpath = f"{self._libs}/*"
        tool = [self._java, "-Xmx256m", *self._log_opts(), "-cp", classpath, "kafka.tools.StorageTool"]
        if self.cluster_id is None:
            self.cluster_id = _run([*tool, "random-uuid"]).strip().splitlines()[-1]
        scram = f"SCRAM-SHA-512=[name={self.scram_username},password={self.scram_password}]"
        _run([*tool, "format", "-t", self.cluster_id, "-c", str(config), "--add-scram", scram])

    def _wait_metadata(self) -> None:
        from kafka.errors import KafkaError

        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and not self._proc.alive():
                break
            try:
                with self.admin(request_timeout_ms=3000) as admin:
                    admin.list_topics()
                    if admin.describe_cluster().get("brokers"):
                        return
            except (KafkaError, OSError) as exc:
                last = exc
            time.sleep(0.2)
        tail = self.log_tail()
        raise RuntimeError(
            f"Apache Kafka on {self.bootstrap} did not answer metadata requests: {last}\n{tail}"
        )

    # ------------------------------------------------------------------ topics

    @contextlib.contextmanager
    def admin(self, **settings: Any) -> Any:
        """A kafka-python admin client on the PLAINTEXT listener, closed on exit."""
        from kafka import KafkaAdminClient

        client = KafkaAdminClient(
            bootstrap_servers=self.bootstrap, **{"request_timeout_ms": 10_000, **settings}
        )
        try:
            yield client
        finally:
            client.close()

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        from kafka.admin import NewTopic

        with self.admin() as admin:
            admin.create_topics(
                [
                    NewTopic(
                        name=name, num_partitions=partitions, replication_factor=1, topic_configs=config or {}
                    )
                ]
            )
        self._wait_topic(name, partitions)

    def delete_topic(self, name: str) -> None:
        with self.admin() as admin:
            admin.delete_topics([name])

    def create_partitions(self, name: str, total: int) -> None:
        """Grow ``name`` to ``total`` partitions (Kafka's CreatePartitions)."""
        from kafka.admin import NewPartitions

        with self.admin() as admin:
            admin.create_partitions({name: NewPartitions(total_count=total)})
        self._wait_topic(name, total)

    def _wait_topic(self, name: str, partitions: int, timeout_s: float = 30.0) -> None:
        """Until every partition of ``name`` has a leader (create is asynchronous in Kafka)."""
        from kafka import KafkaConsumer

        deadline = time.monotonic() + timeout_s
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap)
        try:
            while time.monotonic() < deadline:
                found = consumer.partitions_for_topic(name)
                if found is not None and len(found) >= partitions:
                    return
                consumer._client.cluster.request_update()
                time.sleep(0.1)
        finally:
            consumer.close()
        raise RuntimeError(f"topic {name} did not get {partitions} partitions within {timeout_s}s")

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


def _run(argv: list[str]) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ)
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[-6:])} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout
