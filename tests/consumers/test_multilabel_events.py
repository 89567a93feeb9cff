"""Several labels and a sample weight per event: JSON and msgpack (single and columnar) into the batch."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig, SparseFeature
from kelp.config.sources import JsonMapping
from kelp.consumers import REASONS, MicroBatch
from kelp.consumers.codec import encode_columns, encode_sample
from kelp.consumers.decode import Chunk, Decoder, Rec
from kelp.consumers.errors import SourceUserError
from kelp.consumers.json_events import MappedDecoder
from kelp.consumers.kafka_source import KafkaSource
from kelp.harness.topic_reader import read_topic

SPEC = FeatureSpec(
    labels=[{"name": "click"}, {"name": "buy"}, {"name": "dwell", "kind": "float"}],
    sparse=[SparseFeature(name="user")],
)
ONE = FeatureSpec(sparse=[SparseFeature(name="user")])


def decode(spec: FeatureSpec, values: list[bytes]) -> Chunk:
    return Decoder(spec).decode([Rec("t", 0, i, v) for i, v in enumerate(values)])


def reasons(chunk: Chunk) -> dict[int, str]:
    return {r.offset: r.reason for r in chunk.rejections}


def test_single_msgpack_events_carry_every_label_and_their_weight() -> None:
    values = [
        encode_sample(1, sparse={"user": 1}, labels={"click": 1, "buy": 0, "dwell": 2.5}, weight=0.5),
        msgpack.packb({"v": 1, "labels": {"click": 0, "buy": 1, "dwell": 0.0}, "sparse": {"user": 2}}),
        encode_sample(1, sparse={"user": 3}, labels={"click": 1, "buy": 1, "dwell": 1.0}, weight=-1.0),
        encode_sample(1, sparse={"user": 4}, labels={"click": 1, "buy": 1, "dwell": 1.0}, weight=math.inf),
        encode_sample(1, sparse={"user": 5}, labels={"click": 1, "buy": 2, "dwell": 1.0}),
        encode_sample(1, sparse={"user": 6}, labels={"click": 1, "dwell": 1.0}),
        encode_sample(1, sparse={"user": 7}, labels={"click": 1, "buy": 0, "dwell": 1.0, "cart": 1}),
        encode_sample(1, sparse={"user": 8}, labels={"click": 1, "buy": 0, "dwell": 1.0}, weight="heavy"),  # type: ignore[arg-type]
    ]
    chunk = decode(SPEC, values)
    assert reasons(chunk) == {
        2: "bad_weight",
        3: "bad_weight",
        4: "bad_label",
        5: "missing_label",
        6: "bad_label",
        7: "bad_type",
    }
    assert "bad_weight" in REASONS
    np.testing.assert_array_equal(chunk.labels, [1, 0])
    np.testing.assert_array_equal(chunk.extra_labels["buy"], [0, 1])
    np.testing.assert_array_equal(chunk.extra_labels["dwell"], [2.5, 0.0])
    np.testing.assert_array_equal(chunk.weight, [0.5, 1.0])  # no weight reads 1


@pytest.mark.parametrize("packed", [True, False])
def test_columnar_msgpack_events_carry_label_columns_and_weights(packed: bool) -> None:
    users = np.arange(4, dtype=np.uint64)
    good = encode_columns(
        np.array([1, 0, 1, 0]),
        sparse={"user": users},
        packed=packed,
        task_labels={
            "click": np.array([1, 0, 1, 0]),
            "buy": np.array([0, 0, 1, 1]),
            "dwell": np.array([0.5, 1, 2, 3]),
        },
        weight=np.array([1, 2, 0, 1]),
    )
    bad = encode_columns(
        np.array([1, 0]),
        sparse={"user": users[:2]},
        packed=packed,
        task_labels={"click": np.array([1, 0]), "buy": np.array([0, 0]), "dwell": np.array([0.5, 1])},
        weight=np.array([1, np.nan]),
    )
    chunk = decode(SPEC, [good, bad])
    assert [(r.offset, r.reason, r.rows) for r in chunk.rejections] == [(1, "bad_weight", 1)]
    np.testing.assert_array_equal(chunk.labels, [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(chunk.extra_labels["buy"], [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(chunk.extra_labels["dwell"], [0.5, 1, 2, 3, 0.5])
    np.testing.assert_array_equal(chunk.weight, [1, 2, 0, 1, 1])


def test_one_label_events_with_a_weight_skip_the_fast_paths_and_keep_it() -> None:
    plain = [encode_sample(1, sparse={"user": i}) for i in range(3)]
    weighted = [
        encode_sample(0, sparse={"user": 9}, weight=3.0),
        encode_sample(0, sparse={"user": 9}, weight=-2.0),
    ]
    decoder = Decoder(ONE)
    first = decoder.decode([Rec("t", 0, i, v) for i, v in enumerate(plain)])  # learns the plain layout
    assert first.weight is None and first.extra_labels == {}
    chunk = decoder.decode([Rec("t", 0, i, v) for i, v in enumerate(plain + weighted)])
    assert reasons(chunk) == {4: "bad_weight"}
    np.testing.assert_array_equal(chunk.weight, [1, 1, 1, 3])
    columnar = encode_columns(
        np.array([1, 0]), sparse={"user": np.array([1, 2], np.uint64)}, weight=np.array([2, 0])
    )
    np.testing.assert_array_equal(decoder.decode([Rec("t", 0, 0, columnar)]).weight, [2, 0])


MAPPING = {
    "label_field": "ev.click",
    "labels": {"buy": "ev.buy", "dwell": "ev.dwell_s"},
    "weight_field": "w",
    "sparse_fields": {"user": "user"},
}


def json_event(i: int, **changes: Any) -> bytes:
    out: dict[str, Any] = {
        "ev": {"click": i % 2, "buy": (i // 2) % 2, "dwell_s": i / 4},
        "user": i,
        "w": 1 + i,
    }
    out.update(changes)
    return orjson.dumps(out)


def test_json_events_map_each_label_and_the_weight() -> None:
    decoder = MappedDecoder(SPEC, JsonMapping(**MAPPING))
    values = [json_event(i) for i in range(4)]
    values += [
        json_event(4, w=None),
        json_event(5, w=-0.5),
        json_event(6, ev={"click": 1, "dwell_s": 1}),
        json_event(7, ev={"click": 1, "buy": 0.5, "dwell_s": 1}),
        json_event(8, w=True),
    ]
    chunk = decoder.decode([Rec("t", 0, i, v) for i, v in enumerate(values)])
    assert reasons(chunk) == {5: "bad_weight", 6: "missing_label", 7: "bad_label", 8: "bad_type"}
    np.testing.assert_array_equal(chunk.labels, [0, 1, 0, 1, 0])
    np.testing.assert_array_equal(chunk.extra_labels["buy"], [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(chunk.extra_labels["dwell"], [0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(chunk.weight, [1, 2, 3, 4, 1])


def test_label_configs_and_mappings_that_disagree_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"features\.label and features\.labels are exclusive"):
        FeatureSpec(label={"name": "a"}, labels=[{"name": "b"}])
    with pytest.raises(ValidationError, match="duplicate label name"):
        FeatureSpec(labels=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValidationError, match="loss_weight"):
        FeatureSpec(labels=[{"name": "a", "loss_weight": -1}])
    for reserved in ("ts", "weight", "dense", "labels"):  # a message would read that field as the label
        with pytest.raises(ValidationError, match=f"label name '{reserved}' is a field of the event schema"):
            FeatureSpec(labels=[{"name": "click"}, {"name": reserved}])
    with pytest.raises(ValidationError, match="label name 'sparse'"):
        FeatureSpec(label={"name": "sparse"})
    with pytest.raises(SourceUserError, match=r"source.json.labels: label\(s\) dwell have no field"):
        MappedDecoder(SPEC, JsonMapping(**{**MAPPING, "labels": {"buy": "ev.buy"}}))
    with pytest.raises(SourceUserError, match=r"source\.json\.labels\.click"):
        MappedDecoder(SPEC, JsonMapping(**{**MAPPING, "labels": {**MAPPING["labels"], "click": "x"}}))
    one = FeatureSpec(label={"name": "clicked"})
    assert one.task_names() == ("clicked",) and one.labels is None
    again = FeatureSpec.model_validate(SPEC.model_dump(mode="json"))  # a snapshot re-reads its spec
    assert again.model_dump(mode="json") == SPEC.model_dump(mode="json")


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for v in values:
        producer.send(topic, v, partition=0)
    producer.flush()
    producer.close()


@pytest.mark.integration
def test_weighted_two_label_events_from_kafka_reach_the_batch_and_bad_weights_are_dead_lettered(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config()
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    good = [
        encode_sample(
            i % 2, sparse={"user": i}, labels={"click": i % 2, "buy": 1 - i % 2, "dwell": i}, weight=i / 10
        )
        for i in range(30)
    ]
    bad = encode_sample(1, sparse={"user": 99}, labels={"click": 1, "buy": 0, "dwell": 0}, weight=-3.0)
    _produce(kafka_broker.bootstrap, unique_topic, [*good[:10], bad, *good[10:]])
    registry = CollectorRegistry()
    src = KafkaSource(
        cfg, SPEC, BatchingConfig(batch_size=64, max_batch_delay_ms=50, queue_depth=2), registry
    )
    batches: list[MicroBatch] = []
    deadline = time.monotonic() + 30
    try:
        while sum(b.size for b in batches) < 30 and time.monotonic() < deadline:
            batch = src.poll(1.0)
            if batch is not None:
                batches.append(batch)
                src.commit(batch, wait=True)
    finally:
        src.close()
    batch = MicroBatch.concat(batches)
    np.testing.assert_array_equal(batch.labels, [i % 2 for i in range(30)])
    np.testing.assert_array_equal(batch.extra_labels["buy"], [1 - i % 2 for i in range(30)])
    np.testing.assert_array_equal(batch.extra_labels["dwell"], np.arange(30))
    np.testing.assert_allclose(batch.weights(), np.arange(30) / 10, rtol=1e-6)
    np.testing.assert_array_equal(batch.task_labels(SPEC.task_names())[:, 1], batch.extra_labels["buy"])
    letters = [
        (r.value, {k: v.decode() for k, v in r.headers})
        for r in read_topic(kafka_broker.bootstrap, cfg.dead_letter_topic)
    ]
    assert [(value, headers["reason"]) for value, headers in letters] == [(bad, "bad_weight")]
    assert (
        registry.get_sample_value(
            "kelp_consumer_rejected_records_total", {"topic": unique_topic, "reason": "bad_weight"}
        )
        == 1
    )
