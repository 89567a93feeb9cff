"""Everything the chaos bench runs, started in order and stopped in reverse.

* the broker, one topic: Apache Kafka (:class:`~kelp.harness.ApacheKafka`) by
  default, killed and restarted on its own log directories; or, with
  ``--broker tansu``, Tansu on ``s3://`` (:class:`~kelp.harness.TansuBroker`)
  with an S3 server (moto) holding its storage, the only durable engine this
  Tansu build has. Either way a killed broker comes back with its topics,
  records and committed offsets;
* ``redis-server`` with ``appendonly yes`` + ``appendfsync always`` on a data
  directory that outlives a SIGKILL;
* ``kelp train`` and ``kelp serve`` as child processes on one config (the
  trainer publishes dense snapshots to Redis every 2 s; the replica loads
  them), a steady criteo-synth producer, a scoring client, and the watcher of
  the group's committed offsets.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from types import TracebackType

import yaml

from kelp.bench.chaos_checks import OffsetWatcher
from kelp.bench.chaos_load import ScoreClient, SteadyProducer
from kelp.bench.chaos_procs import KelpProcess
from kelp.bench.runner import progress
from kelp.bench.train import stream_config
from kelp.config import KelpConfig
from kelp.harness import ApacheKafka, KafkaBroker, RedisServer, S3Server, TansuBroker, broker_kind, free_port

__all__ = ["PARTITIONS", "Rig"]

PARTITIONS = 2
STORE_SOCKET_TIMEOUT_S = 1.0
"""The store's socket timeout in both processes: a Redis stall must outlast it."""
CLIENT_TIMEOUT_S = 10.0
"""A scoring request unanswered this long is a hang (the replica answers 503 within ~2 s)."""


def chaos_config(
    bootstrap: str, topic: str, redis_url: str, workdir: Path, *, fetch_sessions: bool = True
) -> KelpConfig:
    """criteo-synth, dlrm-small, batch 1024, default store layout and hot tier, short timeouts."""
    cfg = stream_config(bootstrap, topic, redis_url, workdir, hot_cache="auto", fetch_sessions=fetch_sessions)
    cfg.deployment = f"chaos-{uuid.uuid4().hex[:6]}"
    cfg.source = cfg.source.model_copy(
        update={
            "group_id": f"chaos-{uuid.uuid4().hex[:8]}",
            # A restarted trainer's JoinGroup waits until the killed member's session expires, so a
            # short session keeps each rejoin, and the run, short (docs/performance.md).
            "session_timeout_ms": 3000,
            "heartbeat_interval_ms": 500,
            "max_poll_interval_ms": 20000,
        }
    )
    cfg.batching.batch_size = 1024
    cfg.batching.max_batch_delay_ms = 200
    cfg.store.socket_timeout_s = STORE_SOCKET_TIMEOUT_S
    cfg.store.connect_timeout_s = STORE_SOCKET_TIMEOUT_S
    cfg.store.retry.attempts = 3
    cfg.trainer.device = "cpu"
    cfg.trainer.torch_threads = 1
    cfg.trainer.checkpoint_every_steps = 20
    cfg.trainer.checkpoint_every_s = 5.0
    cfg.trainer.max_store_outage_s = 60.0
    cfg.trainer.drain_timeout_s = 30.0
    cfg.publisher.enabled = True
    cfg.publisher.channel = "redis"
    cfg.publisher.interval_s = 2.0
    cfg.metrics.enabled = True
    cfg.metrics.host = "127.0.0.1"
    cfg.metrics.port = free_port()
    cfg.serving.host = "127.0.0.1"
    cfg.serving.port = free_port()
    cfg.serving.poll_interval_s = 1.0
    cfg.serving.startup_timeout_s = 30.0
    cfg.logging.format = "json"
    return cfg


class Rig:
    """The services and processes of one chaos run (a context manager); see the module docstring."""

    def __init__(
        self, workdir: Path, produce_rate: float, score_rate: float, broker: str | None = None
    ) -> None:
        self.workdir = workdir
        self.broker_kind = broker_kind(broker)
        self.produce_rate = produce_rate
        self.score_rate = score_rate
        self.topic = f"chaos-{uuid.uuid4().hex[:6]}"
        self.kill_window_s = (0.5, 4.0)
        """How long a trainer kill waits first (uniform): a random point of the stream."""
        self.started = time.monotonic()
        self._stack = contextlib.ExitStack()

    def clock(self) -> float:
        """Seconds since the rig started."""
        return round(time.monotonic() - self.started, 2)

    def __enter__(self) -> Rig:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start(self) -> None:
        self.broker = self._stack.enter_context(self._durable_broker())
        (self.workdir / "redis").mkdir(parents=True)
        self.redis = RedisServer(persistence=True, appendfsync="always", data_dir=self.workdir / "redis")
        self._stack.callback(self.redis.cleanup)
        self.redis.start()
        self.broker.create_topic(self.topic, PARTITIONS)
        self.cfg = chaos_config(
            self.broker.bootstrap,
            self.topic,
            self.redis.url,
            self.workdir,
            fetch_sessions=self.broker.fetch_sessions_work,
        )
        path = self.workdir / "kelp.yaml"
        path.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json", exclude_none=True)))
        self.trainer = KelpProcess(
            "train", ["train", "--config", str(path)], self.cfg.metrics.port, self.workdir
        )
        self.serve = KelpProcess(
            "serve", ["serve", "--config", str(path)], self.cfg.serving.port, self.workdir
        )
        self._stack.callback(self.serve.stop, 10.0)
        self._stack.callback(self.trainer.stop, 40.0)
        self.producer = SteadyProducer(self.broker.bootstrap, self.topic, PARTITIONS, self.produce_rate)
        self._stack.callback(self.producer.finish, 30.0)
        self.watcher = OffsetWatcher(self.broker.bootstrap, self.cfg.source.group_id, self.topic, PARTITIONS)
        self._stack.callback(self.watcher.finish)
        self.client = ScoreClient(self.cfg.serving.port, self.score_rate, CLIENT_TIMEOUT_S)
        self._stack.callback(self.client.finish)
        progress(f"producing {self.produce_rate:,.0f} samples/s to {self.topic}; starting kelp train")
        self.producer.start()
        self.trainer.start()
        if self.trainer.wait_ready(120) is None:
            raise RuntimeError(f"kelp train never became ready:\n{self.trainer.log_tail()}")
        self.watcher.start()
        self._wait_snapshot()
        progress("starting kelp serve")
        self.serve.start()
        if self.serve.wait_ready(120) is None:
            raise RuntimeError(f"kelp serve never became ready:\n{self.serve.log_tail()}")
        self.client.start()

    def _durable_broker(self) -> KafkaBroker:
        """A broker that a SIGKILL does not make forget: Kafka's log dirs, or Tansu on moto's S3."""
        if self.broker_kind == "kafka":
            progress("starting Apache Kafka and redis-server (appendonly yes, appendfsync always)")
            return ApacheKafka(workdir=self.workdir / "kafka")
        progress("starting moto S3, tansu on s3://, redis-server (appendonly yes, appendfsync always)")
        self.s3 = self._stack.enter_context(S3Server())
        return TansuBroker(storage=self.s3.storage_url, env=self.s3.tansu_env())

    def _wait_snapshot(self, timeout_s: float = 60.0) -> None:
        """The replica refuses to be ready without a model: wait for the trainer's first snapshot."""
        from kelp.bench.chaos_procs import total

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if total(self.trainer.metrics(), "kelp_publisher_snapshots_total", result="ok") > 0:
                return
            time.sleep(0.3)
        progress("no snapshot counter seen from the trainer; starting serve anyway")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()
