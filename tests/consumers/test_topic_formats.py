"""``source.topic_formats``: one Kafka source reads a JSON topic and a schema-v1 msgpack topic together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig
from kelp.consumers.codec import encode_sample
from kelp.consumers.decode import Rec
from kelp.consumers.formats import expected_records, topic_decoders
from kelp.consumers.kafka_source import KafkaSource

from .test_json_events import drain, produce

SPEC = FeatureSpec.model_validate(
    {"label": {"name": "click"}, "dense": [{"name": "price"}], "sparse": [{"name": "user"}]}
)
MAPPING = {
    "label_field": "clicked",
    "dense_fields": {"price": "ctx.price"},
    "sparse_fields": {"user": "user.id"},
}
BATCHING = BatchingConfig(batch_size=64, max_batch_delay_ms=50, queue_depth=2)


def _source(**fields: Any) -> KafkaSourceConfig:
    return KafkaSourceConfig(bootstrap_servers=["b:9092"], topics=["raw", "joined"], **fields)


def test_each_topic_is_read_in_its_listed_format_and_the_rest_in_source_format() -> None:
    src = _source(format="json", json=MAPPING, topic_formats={"joined": "msgpack"})
    assert (src.topic_format("raw"), src.topic_format("joined")) == ("json", "msgpack")
    plugged = _source(decoder="mod:Thing", json=MAPPING, topic_formats={"joined": "msgpack"})
    assert (plugged.topic_format("raw"), plugged.topic_format("joined")) == ("decoder", "msgpack")
    # A json mapping is wanted by a json topic even when source.format is msgpack.
    assert _source(json=MAPPING, topic_formats={"raw": "json"}).mapped


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topic_formats": {"other": "msgpack"}}, "'other' is not in source.topics"),
        ({"topic_formats": {"raw": "avro"}}, "topic_formats.raw"),
        ({"topic_formats": {"raw": "json"}}, r"topic_formats json \(raw\) needs a json mapping"),
        (
            {"decoder": "mod:Thing", "json": MAPPING, "topic_formats": {"raw": "json", "joined": "msgpack"}},
            "the decoder reads none",
        ),
    ],
)
def test_bad_topic_formats_are_refused_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _source(**fields)


def test_each_topic_gets_the_decoder_and_the_wrong_format_wording_of_its_own_format() -> None:
    src = _source(format="json", json=MAPPING, topic_formats={"joined": "msgpack"})
    decoders = topic_decoders(src, SPEC)
    event = encode_sample(1.0, [2.0], {"user": "u1"}, labels={"click": 1.0})
    raw = orjson.dumps({"clicked": 1, "user": {"id": "u1"}, "ctx": {"price": 2.0}})
    for topic, value in (("joined", event), ("raw", raw)):
        chunk = decoders[topic].decode([Rec(topic, 0, 0, value)])
        assert (chunk.size, chunk.rejections) == (1, [])
    # msgpack read as JSON is what the initial check judges a wrong-format topic by.
    assert decoders["raw"].decode([Rec("raw", 0, 0, event)]).rejections[0].reason == "bad_json"
    assert expected_records(src, "joined") == "schema-v1 msgpack events"
    assert expected_records(src, "raw") == "JSON objects"


@pytest.mark.integration
def test_one_source_decodes_a_json_topic_and_a_msgpack_topic_without_dead_letters(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    joined = f"{unique_topic}-joined"
    for topic in (unique_topic, joined):
        kafka_broker.create_topic(topic, 1)
    raw = [orjson.dumps({"clicked": i % 2, "user": {"id": f"u{i}"}, "ctx": {"price": i}}) for i in range(30)]
    produce(kafka_broker.bootstrap, unique_topic, raw)
    events = [encode_sample(1.0, [100.0 + i], {"user": f"j{i}"}, labels={"click": 1.0}) for i in range(20)]
    produce(kafka_broker.bootstrap, joined, events)
    cfg = kafka_config(
        topics=[unique_topic, joined], format="json", json=MAPPING, topic_formats={joined: "msgpack"}
    )
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        batches = drain(src, 50, timeout_s=60.0)
    finally:
        src.close()
    prices = sorted(price for b in batches for price in b.dense[:, 0].tolist())
    assert prices == [float(i) for i in range(30)] + [100.0 + i for i in range(20)]
    for topic, samples in ((unique_topic, 30), (joined, 20)):
        assert registry.get_sample_value("kelp_consumer_samples_total", {"topic": topic}) == samples
    rejected = [s for m in registry.collect() for s in m.samples if "rejected" in s.name and s.value]
    assert rejected == []
