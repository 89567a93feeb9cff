"""A trainer on a replicated Kafka while a broker dies and another is cut off: nothing lost, nothing twice.

The cluster is three Apache Kafka nodes (KRaft, each broker and controller) on
three hosts of a :class:`~kelp.harness.hosts.HostRig` (network namespaces);
the topic has replication factor 3 and ``min.insync.replicas`` 2, the
producer is ``kelp produce``'s (``acks=all``). While records arrive and an
in-process ``kelp train`` consumes them, the leader of one partition is
killed (SIGKILL: leaders move), brought back, and the leader of the other is
cut off for a few seconds (link down). What must hold:

* every record the producer saw acknowledged is in the log (its count is the
  topic's end offsets), and ``kelp produce`` reports a record it could not get
  acknowledged instead of counting it;
* every offset of every partition was trained, and the group committed them all;
* no offset was trained twice: the trainer never restarted, so at-least-once
  allows no repeat here.

Skips with one line where network namespaces cannot be made (not root) or
Apache Kafka cannot run (no Java).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from kelp.config import KafkaSourceConfig, KelpConfig, StoreConfig
from kelp.consumers.errors import ConsumerError
from kelp.consumers.produce import ProduceSummary, file_messages, produce
from kelp.daemon.train import TrainDaemon
from kelp.harness import ApacheKafka, KafkaBroker
from kelp.harness.kafka_dist import java_available

from .conftest import CRITEO, CRITEO_ROWS, PARTITIONS, Running, base_config, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Three Kafka nodes on three rig hosts, once for the module."""
    from kelp.harness.hosts import HostRig, available
    from kelp.harness.kafka_cluster import KafkaCluster

    ok, why = available()
    if not ok:
        pytest.skip(f"host rig unavailable: {why}")
    if not java_available():
        pytest.skip("Apache Kafka unavailable: java or mvn not found")
    with HostRig() as rig:
        hosts = [rig.add_host(f"kafka{i}") for i in range(3)]
        with KafkaCluster(rig, hosts) as kafka:
            yield kafka


def _config(tmp_path: Path, cluster: Any, topic: str, redis_url: str) -> KelpConfig:
    cfg = base_config(tmp_path, checkpoint_every_steps=20)
    cfg.batching.batch_size = 64
    cfg.source = KafkaSourceConfig(
        bootstrap_servers=cluster.bootstrap_servers,
        topics=[topic],
        group_id=f"trainer-{topic}",
        dead_letter_topic=None,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1000,
        max_poll_interval_ms=60_000,
    )
    cfg.store = StoreConfig(backend="redis", urls=[redis_url])
    return cfg


def _end_offsets(cluster: Any, topic: str) -> list[int]:
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers)
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = consumer.end_offsets(parts)
        return [ends[tp] for tp in parts]
    finally:
        consumer.close()


def _committed(cluster: Any, group: str, topic: str) -> list[int]:
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    try:
        return [consumer.committed(TopicPartition(topic, p)) or 0 for p in range(PARTITIONS)]
    finally:
        consumer.close()


class _Trained:
    """Every (partition, offset) the trainer stepped on, counted (``on_step`` runs on the loop's thread)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()

    def __call__(self, _step: int, batch: Any, _result: Any) -> None:
        with self._lock:
            for r in batch.sources:
                self.counts.update((r.partition, o) for o in range(r.first_offset, r.last_offset + 1))

    def total(self) -> int:
        with self._lock:
            return len(self.counts)


def _produce_in_background(
    cluster: Any, topic: str, gates: dict[int, threading.Event]
) -> tuple[threading.Thread, dict[str, Any]]:
    """``kelp produce`` of the Criteo fixture, one sample per record; record ``i`` of ``gates`` waits
    for its event first, so each fault meets records still arriving."""
    result: dict[str, Any] = {}

    def messages() -> Iterator[tuple[bytes, int]]:
        for i, message in enumerate(file_messages(CRITEO, "criteo_tsv", 1)):
            if i in gates:
                gates[i].wait(120)
            yield message

    def run() -> None:
        try:
            result["summary"] = produce(
                {"bootstrap_servers": cluster.bootstrap_servers}, topic, messages(), rate=400.0, quiet=True
            )
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_a_killed_broker_and_a_cut_off_one_lose_no_acknowledged_record_and_train_none_twice(
    tmp_path: Path, cluster: Any, redis_url: str
) -> None:
    topic = f"failover-{time.monotonic_ns()}"
    cluster.create_topic(topic, PARTITIONS, {"min.insync.replicas": "2"})
    cfg = _config(tmp_path, cluster, topic, redis_url)
    trained = _Trained()
    running = Running(TrainDaemon(cfg, http=False, publish=False, on_step=trained))
    killed_now, cut_now = threading.Event(), threading.Event()
    third = CRITEO_ROWS // 3
    producer, produced = _produce_in_background(cluster, topic, {third: killed_now, 2 * third: cut_now})
    try:
        wait_for(lambda: trained.total() >= third // 2 or running.error, 120, "records trained")
        killed = cluster.leaders(topic)[0] - 1  # node index of partition 0's leader
        cluster.kill(killed)
        killed_now.set()
        wait_for(lambda: trained.total() >= third + 100 or running.error, 120, "training with a node dead")
        cluster.restart(killed)
        cut = next(n - 1 for n in cluster.leaders(topic).values() if n - 1 != killed)
        with cluster.partitioned(cut, seconds=5):  # leaders move off it (the controller fences it)
            cut_now.set()
        producer.join(180)
        assert not producer.is_alive(), "kelp produce did not finish"
        assert "error" not in produced, produced.get("error")
        summary: ProduceSummary = produced["summary"]
        ends = _end_offsets(cluster, topic)
        assert summary.messages == CRITEO_ROWS == sum(ends), (summary, ends)  # every acknowledged record
        wait_for(lambda: _committed(cluster, cfg.source.group_id, topic) == ends, 180, f"commits {ends}")
    finally:
        killed_now.set()
        cut_now.set()
        report = running.stop(120)
    assert running.error is None
    want = {(p, o) for p in range(PARTITIONS) for o in range(ends[p])}
    missing = sorted(want - set(trained.counts))
    assert not missing, f"{len(missing)} records never trained, first {missing[:5]}"
    twice = {k: n for k, n in trained.counts.items() if n > 1}
    assert not twice, f"{len(twice)} records trained more than once, e.g. {sorted(twice.items())[:5]}"
    assert report.samples == CRITEO_ROWS


def test_produce_reports_a_record_the_brokers_never_acknowledged(
    kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    """A broker's refusal fails only the record's future: ``kelp produce`` must not count it as produced."""
    if not isinstance(kafka_broker, ApacheKafka):
        pytest.skip("needs Apache Kafka's per-topic max.message.bytes")
    kafka_broker.create_topic(unique_topic, 1, {"max.message.bytes": "2000"})
    messages = iter([(b"y" * 10_000, 1)])  # under the producer's max_request_size, over the topic's limit
    with pytest.raises(ConsumerError, match=r"1 of 1 messages not acknowledged.*MessageSizeTooLarge"):
        produce({"bootstrap_servers": kafka_broker.bootstrap}, unique_topic, messages, quiet=True)


def test_the_request_log_waits_for_every_in_sync_replica() -> None:
    """With ``acks=1`` a record the leader alone acknowledged counts as sent and dies with the leader."""
    from prometheus_client import CollectorRegistry

    from kelp.config import RequestLogConfig
    from kelp.serving import ServingMetrics
    from kelp.serving.request_log import RequestLog

    asked: list[dict[str, Any]] = []

    class _Producer:
        def __init__(self, **settings: Any) -> None:
            asked.append(settings)

        def flush(self, timeout: float | None = None) -> None: ...

        def close(self, timeout: float | None = None) -> None: ...

    kafka = KafkaSourceConfig(bootstrap_servers=["127.0.0.1:9"], topics=["events"], group_id="g")
    metrics = ServingMetrics(CollectorRegistry())
    log = RequestLog(RequestLogConfig(), kafka, ("label",), metrics, make_producer=_Producer)
    wait_for(lambda: asked, 10, "the request log's producer")
    log.close()
    assert asked[0]["acks"] == "all"
