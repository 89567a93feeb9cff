"""``kelp bench ingest``: Kafka -> decoded, validated, deduplicated micro-batches vs a plain poll.

Starts its own Tansu broker, produces criteo-synth (synthetic) twice, as
columnar messages of 256 samples and as single-sample messages, then for
each topic measures, with a fresh consumer group each time and the same
consumer settings:

* Kelp's :class:`~kelp.consumers.kafka_source.KafkaSource` yielding
  micro-batches of 4096 whose per-table ``unique_ids`` are computed;
* the baseline: kafka-python ``KafkaConsumer.poll`` of the same messages,
  no decoding at all.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from prometheus_client import CollectorRegistry

from kelp.bench.runner import progress
from kelp.bench.synth import synth_messages
from kelp.config import BatchingConfig, KafkaSourceConfig
from kelp.consumers.criteo import criteo_feature_spec
from kelp.consumers.kafka_source import KafkaSource, consumer_settings
from kelp.consumers.produce import produce
from kelp.harness import TansuBroker

__all__ = ["bench_kafka", "run"]

PER_MESSAGE = 256


def bench_kafka(bootstrap: str, topic: str) -> KafkaSourceConfig:
    return KafkaSourceConfig(
        bootstrap_servers=[bootstrap],
        topics=[topic],
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        dead_letter_topic=None,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_interval_ms=5000,
        max_message_bytes=4_194_304,
        max_partition_fetch_bytes=8_388_608,
    )


def _kelp(bootstrap: str, topic: str, samples: int) -> tuple[float, dict[str, Any]]:
    src = KafkaSource(
        bench_kafka(bootstrap, topic),
        criteo_feature_spec(),
        BatchingConfig(batch_size=4096, max_batch_delay_ms=200, queue_depth=8),
        CollectorRegistry(),
    )
    got = batches = uniq = ids = 0
    start = None
    try:
        while got < samples:
            batch = src.poll(30)
            if batch is None:
                raise RuntimeError(f"kelp source stalled at {got}/{samples} samples")
            if start is None:  # time from the first batch: group join is not ingest
                start = time.perf_counter()
                first = batch.size
            uniq += sum(t.unique_ids.size for t in batch.tables.values())
            ids += batch.num_ids()
            got += batch.size
            batches += 1
            src.commit(batch)
    finally:
        src.close()
    elapsed = time.perf_counter() - start if start else float("nan")
    return (got - first) / elapsed, {"batches": batches, "unique_id_ratio": round(uniq / max(ids, 1), 4)}


def _raw(bootstrap: str, topic: str, messages: int, per_message: int) -> float:
    from kafka import KafkaConsumer

    settings = consumer_settings(bench_kafka(bootstrap, topic))
    consumer = KafkaConsumer(topic, **settings)
    got = 0
    start = None
    first = 0
    try:
        while got < messages:
            polled = consumer.poll(timeout_ms=1000)
            n = sum(len(v) for v in polled.values())
            if n and start is None:
                start = time.perf_counter()
                first = n
            got += n
    finally:
        consumer.close(autocommit=False)
    elapsed = time.perf_counter() - start if start else float("nan")
    return (got - first) * per_message / elapsed


def run(quick: bool) -> dict[str, Any]:
    batched_samples = 150_000 if quick else 1_000_000
    single_samples = 15_000 if quick else 100_000
    out: dict[str, Any] = {"workload": "criteo-synth (synthetic)", "samples_per_message": PER_MESSAGE}
    progress("starting tansu")
    with TansuBroker() as broker:
        for label, samples, per in (("", batched_samples, PER_MESSAGE), ("single_", single_samples, 1)):
            topic = f"ingest-{label or 'batched_'}{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, 2)
            progress(f"producing {samples:,} samples, {per} per message, to {topic}")
            summary = produce(
                {"bootstrap_servers": [broker.bootstrap]}, topic, synth_messages(samples, per), quiet=True
            )
            progress(
                f"produced {summary.messages:,} messages, {summary.bytes / 1e6:.1f} MB "
                f"in {summary.seconds:.1f}s"
            )
            raw = _raw(broker.bootstrap, topic, summary.messages, per)
            progress(f"raw poll: {raw:,.0f} samples/s")
            kelp, extra = _kelp(broker.bootstrap, topic, samples)
            progress(f"kelp micro-batches: {kelp:,.0f} samples/s")
            out[f"{label}batches_samples_per_s"] = round(kelp, 1)
            out[f"{label}raw_poll_samples_per_s"] = round(raw, 1)
            out[f"{label}ratio"] = round(kelp / raw, 3)
            out[f"{label}message_bytes"] = round(summary.bytes / summary.messages, 1)
            out[f"{label}unique_id_ratio"] = extra["unique_id_ratio"]
    return out
