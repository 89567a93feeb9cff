"""Consumer metrics against the real Tansu broker: counters match what was produced, lag drains to 0,
committed-offset gauges reach the end of each partition."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig, SparseFeature
from kelp.consumers import encode_columns, encode_sample
from kelp.consumers.kafka_source import KafkaSource

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(sparse=[SparseFeature(name="a")])
BATCHING = BatchingConfig(batch_size=64, max_batch_delay_ms=50, queue_depth=2)


def partition_stream(lo: int, singles: int, columns: int, per: int) -> list[bytes]:
    """``singles`` single-sample messages then ``columns`` columnar ones; id ``a`` numbers the samples."""
    out = [encode_sample(i % 2, sparse={"a": i}) for i in range(lo, lo + singles)]
    start = lo + singles
    for c in range(columns):
        ids = np.arange(start + c * per, start + (c + 1) * per, dtype=np.uint64)
        out.append(encode_columns(ids % 2, sparse={"a": ids}))
    return out


def test_counters_lag_and_committed_offsets_match_the_topic(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    metrics_registry: CollectorRegistry,
) -> None:
    kafka_broker.create_topic(unique_topic, 2)
    p0 = partition_stream(0, 50, 10, 50)  # samples 0..549
    p1 = partition_stream(550, 50, 10, 50)  # samples 550..1099
    bad = msgpack.packb({"v": 2, "label": 1})  # rejected as bad_version, in the middle of partition 0
    p0.insert(30, bad)
    streams = {0: p0, 1: p1}
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for p, values in streams.items():
        for v in values:
            producer.send(unique_topic, v, partition=p)
    producer.flush()
    producer.close()
    total_samples = 1100

    cfg = kafka_config(dead_letter_topic=None)
    reg = metrics_registry

    def metric(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    src = KafkaSource(cfg, SPEC, BATCHING, reg)
    got: list[int] = []
    batches = 0
    try:
        deadline = time.monotonic() + 60  # keeps a broken run from hanging; not asserted on
        while len(got) < total_samples and time.monotonic() < deadline:
            batch = src.poll(1.0)
            if batch is None:
                continue
            batches += 1
            got += batch.sparse["a"].values.tolist()
            src.commit(batch, wait=True)
        assert sorted(got) == list(range(total_samples))

        topic = {"topic": unique_topic}
        assert metric("kelp_consumer_records_total", **topic) == len(p0) + len(p1)
        assert metric("kelp_consumer_samples_total", **topic) == total_samples
        assert metric("kelp_consumer_bytes_total", **topic) == sum(len(v) for v in p0 + p1)
        assert metric("kelp_consumer_batches_total") == batches
        assert metric("kelp_records_rejected_total", reason="bad_version") == 1
        assert (metric("kelp_consumer_decode_seconds_count") or 0) > 0
        assert (metric("kelp_consumer_commits_total", result="ok") or 0) >= 1
        assert (metric("kelp_consumer_commits_total", result="failed") or 0) == 0
        assert metric("kelp_consumer_queue_batches") == 0
        assert metric("kelp_consumer_paused") == 0
        for p, values in streams.items():
            labels = {"topic": unique_topic, "partition": str(p)}
            assert metric("kelp_consumer_lag_records", **labels) == 0
            # Every record was committed, the rejected one included.
            assert metric("kelp_consumer_committed_offset", **labels) == len(values)
    finally:
        src.close()

    # The gauges agree with the broker: committed offsets and the fetch high watermarks
    # (Tansu's ListOffsets(latest) answers a batch base offset, so end_offsets is not used).
    tps = [TopicPartition(unique_topic, p) for p in streams]
    check = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=cfg.group_id, enable_auto_commit=False
    )
    try:
        committed = [check.committed(tp) for tp in tps]
        check.assign(tps)
        check.seek_to_beginning()
        deadline = time.monotonic() + 30
        while any(check.highwater(tp) is None for tp in tps) and time.monotonic() < deadline:
            check.poll(timeout_ms=200)
        highwater = [check.highwater(tp) for tp in tps]
    finally:
        check.close()
    assert committed == [len(p0), len(p1)]
    assert highwater == committed
