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
  the group's committed offsets;
* with ``with_join``, ``kelp join`` as a child process (:class:`JoinSide`) on
  its own config: a dedicated impressions topic fed by the bench's
  :class:`~kelp.bench.chaos_load.ClickLoad` (request-log records, event time
  = wall time), one click topic, its own output and dead-letter topics, and
  this redis-server for the waiting impressions. A dedicated topic rather
  than the replica's request log: the request log drops records while the
  broker is away (by design, off the request path), which would orphan
  clicks for a reason that is not the joiner's, and the impressions can be
  paused at will.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import yaml

from kelp.bench.chaos_checks import OffsetWatcher, OutputReader, account_true_clicks
from kelp.bench.chaos_load import ClickLoad, ScoreClient, SteadyProducer
from kelp.bench.chaos_procs import JoinWatch, KelpProcess
from kelp.bench.runner import progress
from kelp.bench.train import stream_config
from kelp.config import KelpConfig, parse_config
from kelp.harness import ApacheKafka, KafkaBroker, RedisServer, S3Server, TansuBroker, broker_kind, free_port

__all__ = ["PARTITIONS", "JoinSide", "JoinTopics", "Rig", "join_config"]

PARTITIONS = 2
STORE_SOCKET_TIMEOUT_S = 1.0
"""The store's socket timeout in both processes: a Redis stall must outlast it."""
CLIENT_TIMEOUT_S = 10.0
"""A scoring request unanswered this long is a hang (the replica answers 503 within ~2 s)."""
IMPRESSION_RATE = 5.0
"""The joiner's impressions/s: light, so it keeps up on a small busy machine."""
WINDOW_S = 60.0
"""The click window: longer than a broker restart or a Redis outage, so a fault alone never closes one."""
IDLE_PARTITION_S = 2.0
"""Short, so a pause of the impressions makes their partition idle within a fault."""
JOIN_READY_TIMEOUT_S = 90.0
JOIN_RECOVERY_TIMEOUT_S = 30.0
"""How long :meth:`JoinSide.joined_again_s` waits for a fresh click to be joined."""
JOIN_SETTLE_TIMEOUT_S = 60.0


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


@dataclass(frozen=True)
class JoinTopics:
    """The joiner's topics and consumer group."""

    impressions: str
    clicks: str
    output: str
    dead_letter: str
    group: str

    @classmethod
    def fresh(cls) -> JoinTopics:
        tag = uuid.uuid4().hex[:6]
        return cls(
            f"chaos-imp-{tag}",
            f"chaos-clicks-{tag}",
            f"chaos-joined-{tag}",
            f"chaos-join-dlq-{tag}",
            f"chaos-join-{tag}",
        )


def join_config(
    bootstrap: str,
    redis_url: str,
    topics: JoinTopics,
    *,
    port: int,
    socket_timeout_s: float,
    fetch_sessions: bool = True,
) -> dict[str, Any]:
    """The joiner's config: one click task on ``item``, a short ``idle_partition_s``, a 60 s window."""
    doc: dict[str, Any] = {
        "deployment": f"chaos-join-{uuid.uuid4().hex[:6]}",
        "features": {
            "label": {"name": "click"},
            "dense": [{"name": "price"}],
            "sparse": [{"name": "user"}, {"name": "item"}],
        },
        "source": {
            "kind": "kafka",
            "bootstrap_servers": [bootstrap],
            "topics": [topics.output],
            "auto_offset_reset": "earliest",
            "incremental_fetch_sessions": fetch_sessions,
            # A restarted joiner's JoinGroup may wait out the exited member's session: keep it short.
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
        },
        "store": {
            "backend": "redis",
            "urls": [redis_url],
            "socket_timeout_s": socket_timeout_s,
            "connect_timeout_s": socket_timeout_s,
        },
        "publisher": {"enabled": False},
        "logging": {"format": "json"},
        "join": {
            "impressions_topic": topics.impressions,
            "actions": [
                {"topic": topics.clicks, "task": "click", "window_s": WINDOW_S, "item_field": "item"}
            ],
            "item_feature": "item",
            "output_topic": topics.output,
            "dead_letter_topic": topics.dead_letter,
            "group_id": topics.group,
            "allowed_lateness_s": 2.0,
            "idle_partition_s": IDLE_PARTITION_S,
            "late_horizon_s": 30.0,
            "host": "127.0.0.1",
            "port": port,
        },
    }
    parse_config(doc, origin="bench chaos join")  # a bad config fails here, not in the child's log
    return doc


class JoinSide:
    """The rig's joiner: its topics, its process and watcher, its load and the reader of its output."""

    def __init__(self, broker: KafkaBroker, redis_url: str, workdir: Path, socket_timeout_s: float) -> None:
        self.broker = broker
        self.topics = JoinTopics.fresh()
        self.port = free_port()
        self.doc = join_config(
            broker.bootstrap,
            redis_url,
            self.topics,
            port=self.port,
            socket_timeout_s=socket_timeout_s,
            fetch_sessions=broker.fetch_sessions_work,
        )
        path = workdir / "join.yaml"
        path.write_text(yaml.safe_dump(self.doc))
        self.process = KelpProcess("join", ["join", "--config", str(path)], self.port, workdir)
        self.watch = JoinWatch(self.process)
        self.load = ClickLoad(broker.bootstrap, self.topics.impressions, self.topics.clicks, IMPRESSION_RATE)
        self.reader = OutputReader(broker.bootstrap, self.topics.output, self.topics.dead_letter)

    def start(self, stack: contextlib.ExitStack) -> None:
        """Topics, ``kelp join`` (ready), then the watcher, the reader and the load; stopped by ``stack``."""
        for topic in (
            self.topics.impressions,
            self.topics.clicks,
            self.topics.output,
            self.topics.dead_letter,
        ):
            self.broker.create_topic(topic, 1)
        stack.callback(self.process.stop, 30.0)
        stack.callback(self.watch.finish)  # before the stop above: that exit is the bench's
        stack.callback(self.reader.finish)
        stack.callback(self.load.finish, 30.0)
        progress(f"starting kelp join ({IMPRESSION_RATE:g} impressions/s to {self.topics.impressions})")
        self.process.start()
        if self.process.wait_ready(JOIN_READY_TIMEOUT_S) is None:
            raise RuntimeError(f"kelp join never became ready:\n{self.process.log_tail()}")
        self.watch.start()
        self.reader.start()
        self.load.start()

    def joined_again_s(self, since_wall: float) -> float | None:
        """Seconds from ``since_wall`` until a true click acknowledged after it was seen emitted positive.

        None when none was within ``JOIN_RECOVERY_TIMEOUT_S`` of the call: the joiner is not labelling.
        """
        deadline = time.monotonic() + JOIN_RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.reader.joined(self.load.clicks_since(since_wall)):
                return round(time.time() - since_wall, 2)
            time.sleep(0.2)
        return None

    def settle(self) -> dict[str, Any]:
        """Stop the load; wait until every true click was emitted positive (or the timeout); the figures."""
        progress("stopping the click load; waiting for kelp join to label every true click")
        self.load.finish()
        if self.load.error is not None:
            raise RuntimeError(f"the click load failed: {self.load.error}")
        clicks = self.load.snapshot()
        started = time.monotonic()
        while time.monotonic() - started < JOIN_SETTLE_TIMEOUT_S:
            if len(self.reader.joined(clicks)) == len(clicks):
                break
            time.sleep(0.5)
        settle_s = round(time.monotonic() - started, 2)
        self.watch.finish()
        self.reader.finish()
        positives, negatives, outputs, unreadable, dead = self.reader.figures()
        books = account_true_clicks(clicks, positives)
        return {
            "join_orphaned_true_clicks": books.orphaned,
            "join_crash_loops": self.watch.crash_loops,
            "join_dead_letters": dict(sorted(dead.items())),
            "join_true_clicks": books.true_clicks,
            "join_true_clicks_joined": books.joined,
            "join_true_clicks_only_late": books.joined_only_late,
            "join_orphaned_examples": books.orphaned_examples,
            "join_exits_during_store_outage": self.watch.store_outage_exits,
            "join_exits": [asdict(e) for e in self.watch.exits[:20]],
            "join_incarnations": self.process.incarnations,
            "join_impressions_acked": self.load.impressions_acked,
            "join_impressions_failed": self.load.impressions_failed,
            "join_clicks_failed": self.load.clicks_failed,
            "join_positives_emitted": len(positives),
            "join_negatives_emitted": negatives,
            "join_output_events": outputs,
            "join_output_unreadable": unreadable,
            "join_settle_s": settle_s,
        }


def wait_first_snapshot(trainer: KelpProcess, timeout_s: float = 60.0) -> None:
    """The replica refuses to be ready without a model: wait for the trainer's first snapshot."""
    from kelp.bench.chaos_procs import total

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if total(trainer.metrics(), "kelp_publisher_snapshots_total", result="ok") > 0:
            return
        time.sleep(0.3)
    progress("no snapshot counter seen from the trainer; starting serve anyway")


class _Bootstrapped(Protocol):
    @property
    def bootstrap(self) -> str: ...


class RigParts(Protocol):
    """What the fault, recovery, settle and stop steps read of a rig, so the single-host
    :class:`Rig` and the host mode's rig share those steps instead of copies of them."""

    @property
    def topic(self) -> str: ...
    @property
    def cfg(self) -> KelpConfig: ...
    @property
    def broker(self) -> _Bootstrapped: ...
    @property
    def trainer(self) -> KelpProcess: ...
    @property
    def serve(self) -> KelpProcess: ...
    @property
    def producer(self) -> SteadyProducer: ...
    @property
    def watcher(self) -> OffsetWatcher: ...
    @property
    def client(self) -> ScoreClient: ...
    @property
    def join(self) -> JoinSide | None: ...
    def clock(self) -> float: ...


class RigLife:
    """A chaos rig's clock and the stack that stops what it started, in reverse order, also when
    starting fails half-way; subclasses start their parts in ``_start``."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._stack = contextlib.ExitStack()

    def clock(self) -> float:
        """Seconds since the rig started."""
        return round(time.monotonic() - self.started, 2)

    def _start(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()


class Rig(RigLife):
    """The services and processes of one chaos run (a context manager); see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        produce_rate: float,
        score_rate: float,
        broker: str | None = None,
        *,
        with_join: bool = False,
    ) -> None:
        self.workdir = workdir
        self.with_join = with_join
        self.join: JoinSide | None = None
        self.broker_kind = broker_kind(broker)
        self.produce_rate = produce_rate
        self.score_rate = score_rate
        self.topic = f"chaos-{uuid.uuid4().hex[:6]}"
        self.kill_window_s = (0.5, 4.0)
        """How long a trainer kill waits first (uniform): a random point of the stream."""
        super().__init__()

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
        wait_first_snapshot(self.trainer)
        progress("starting kelp serve")
        self.serve.start()
        if self.serve.wait_ready(120) is None:
            raise RuntimeError(f"kelp serve never became ready:\n{self.serve.log_tail()}")
        self.client.start()
        if self.with_join:
            self.join = JoinSide(self.broker, self.redis.url, self.workdir, STORE_SOCKET_TIMEOUT_S)
            self.join.start(self._stack)

    def _durable_broker(self) -> KafkaBroker:
        """A broker that a SIGKILL does not make forget: Kafka's log dirs, or Tansu on moto's S3."""
        if self.broker_kind == "kafka":
            progress("starting Apache Kafka and redis-server (appendonly yes, appendfsync always)")
            return ApacheKafka(workdir=self.workdir / "kafka")
        progress("starting moto S3, tansu on s3://, redis-server (appendonly yes, appendfsync always)")
        self.s3 = self._stack.enter_context(S3Server())
        return TansuBroker(storage=self.s3.storage_url, env=self.s3.tansu_env())
