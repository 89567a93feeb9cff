"""Labels, weights and dense values are checked in the dtype they train in (float32), per record.

A value finite in float64 but beyond float32's range (1e39) is infinite once
cast, which made a whole batch's loss NaN: the batch was skipped and committed
untrained. Such a record is now rejected alone, before batching, with a reason
naming the field and the value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, DenseFeature, FeatureSpec, KafkaSourceConfig, SparseFeature
from kelp.config.sources import JsonMapping
from kelp.consumers import MicroBatch
from kelp.consumers.codec import encode_sample
from kelp.consumers.decode import Chunk, Decoder, Rec
from kelp.consumers.json_events import MappedDecoder
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness.topic_reader import read_topic

FLOAT_LABEL = FeatureSpec(
    label={"name": "label", "kind": "float"},
    dense=[DenseFeature(name="d")],
    sparse=[SparseFeature(name="user")],
)
TWO_TASKS = FeatureSpec(
    labels=[{"name": "click"}, {"name": "dwell", "kind": "float"}], sparse=[SparseFeature(name="user")]
)


def decode(spec: FeatureSpec, values: list[bytes]) -> Chunk:
    return Decoder(spec).decode([Rec("t", 0, i, v) for i, v in enumerate(values)])


def by_offset(chunk: Chunk) -> dict[int, tuple[str, str]]:
    return {r.offset: (r.reason, r.detail) for r in chunk.rejections}


def test_single_msgpack_labels_and_weights_beyond_float32_are_rejected_naming_field_and_value() -> None:
    chunk = decode(
        FLOAT_LABEL,
        [
            encode_sample(0.5, sparse={"user": 1}),
            encode_sample(1e39, sparse={"user": 2}),
            encode_sample(-1e39, sparse={"user": 3}),
            encode_sample(0.5, sparse={"user": 4}, weight=1e39),
            encode_sample(0.5, dense=[1e39], sparse={"user": 5}),
            encode_sample(3e38, sparse={"user": 6}, weight=3e38),  # large, but float32 holds it
        ],
    )
    got = by_offset(chunk)
    assert {k: reason for k, (reason, _) in got.items()} == {
        1: "bad_label",
        2: "bad_label",
        3: "bad_weight",
        4: "bad_dense",
    }
    assert "label 'label' 1e+39 does not fit float32" in got[1][1]
    assert "label 'label' -1e+39 does not fit float32" in got[2][1]
    assert "weight 1e+39 does not fit float32" in got[3][1]
    assert "dense 'd' is inf as float32" in got[4][1]
    np.testing.assert_array_equal(chunk.labels, np.array([0.5, 3e38], dtype=np.float32))
    assert np.isfinite(chunk.weight).all()


def test_a_columnar_message_loses_only_the_row_whose_weight_or_label_does_not_fit() -> None:
    columnar = msgpack.packb(
        {
            "v": 1,
            "batch": 4,
            "labels": {"click": [1, 0, 1, 0], "dwell": [0.5, 1.0, 1e39, 2.0]},
            "weight": [1.0, 1e39, 1.0, 2.0],
            "sparse": {"user": [1, 2, 3, 4]},
        }
    )
    chunk = decode(TWO_TASKS, [columnar])
    assert sorted((r.reason, r.rows) for r in chunk.rejections) == [("bad_label", 1), ("bad_weight", 1)]
    details = {r.reason: r.detail for r in chunk.rejections}
    assert "label 'dwell' 1e+39" in details["bad_label"] and "weight 1e+39" in details["bad_weight"]
    np.testing.assert_array_equal(chunk.labels, [1, 0])  # rows 0 and 3 stay
    np.testing.assert_array_equal(chunk.extra_labels["dwell"], [0.5, 2.0])
    np.testing.assert_array_equal(chunk.weight, [1.0, 2.0])


JSON_SPEC = FeatureSpec(label={"name": "clicked"}, sparse=[SparseFeature(name="user")])
MAPPING = JsonMapping(label_field="clicked", weight_field="w", sparse_fields={"user": "user"})


def json_event(i: int, w: float) -> bytes:
    return orjson.dumps({"clicked": i % 2, "user": i, "w": w})


def test_json_weight_beyond_float32_is_bad_weight_naming_the_mapped_field() -> None:
    decoder = MappedDecoder(JSON_SPEC, MAPPING)
    values = [json_event(0, 2.0), json_event(1, 1e39), json_event(2, 0.5)]
    chunk = decoder.decode([Rec("t", 0, i, v) for i, v in enumerate(values)])
    assert [(r.offset, r.reason) for r in chunk.rejections] == [(1, "bad_weight")]
    assert "weight 'w' 1e+39 does not fit float32" in chunk.rejections[0].detail
    np.testing.assert_array_equal(chunk.weight, [2.0, 0.5])


@pytest.mark.integration
def test_json_events_with_a_1e39_weight_are_dead_lettered_and_every_other_sample_is_batched(
    kafka_broker: Any,
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(format="json", json=MAPPING)
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    poisoned = {7, 50, 93}
    values = [json_event(i, 1e39 if i in poisoned else 1 + i % 3) for i in range(120)]
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for v in values:
        producer.send(unique_topic, v, partition=0)
    producer.flush()
    producer.close()

    registry = CollectorRegistry()
    src = KafkaSource(
        cfg, JSON_SPEC, BatchingConfig(batch_size=32, max_batch_delay_ms=50, queue_depth=2), registry
    )
    batches: list[MicroBatch] = []
    deadline = time.monotonic() + 60
    try:
        while sum(b.size for b in batches) < 117 and time.monotonic() < deadline:
            batch = src.poll(1.0)
            if batch is not None:
                batches.append(batch)
                src.commit(batch, wait=True)
    finally:
        src.close()
    batch = MicroBatch.concat(batches)
    kept = [i for i in range(120) if i not in poisoned]
    np.testing.assert_array_equal(batch.labels, [i % 2 for i in kept])
    np.testing.assert_array_equal(batch.weights(), [1 + i % 3 for i in kept])  # every weight finite

    letters = [
        (r.value, {k: v.decode() for k, v in r.headers})
        for r in read_topic(kafka_broker.bootstrap, cfg.dead_letter_topic)
    ]
    assert [(value, h["reason"], int(h["source_offset"])) for value, h in letters] == [
        (values[i], "bad_weight", i) for i in sorted(poisoned)
    ]
    assert all("weight 'w' 1e+39 does not fit float32" in h["error"] for _, h in letters)
    assert registry.get_sample_value("kelp_records_rejected_total", {"reason": "bad_weight"}) == 3
