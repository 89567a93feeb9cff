"""A company's own JSON topic on the real broker: it trains by declared casts; a wrong one stops clearly."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgpack
import orjson
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, DenseFeature, FeatureSpec, KafkaSourceConfig, SparseFeature
from kelp.consumers.errors import SourceUserError
from kelp.consumers.ids import id_of
from kelp.consumers.kafka_source import KafkaSource

from .test_json_events import dead_letters, drain, produce

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(
    dense=[DenseFeature(name="price"), DenseFeature(name="mobile")],
    sparse=[SparseFeature(name="user"), SparseFeature(name="page", max_ids=4)],
)
MAPPING: dict[str, Any] = {
    "label_field": "event.clicked",
    "event_time_field": "event.at",
    "dense_fields": {"price": "item.price", "mobile": "ctx.device.mobile"},
    "sparse_fields": {"user": "user.uuid", "page": "ctx.page.path"},
    "casts": {
        "event.clicked": "bool",
        "event.at": "iso8601",
        "item.price": "number",
        "ctx.device.mobile": "bool",
    },
}
BATCHING = BatchingConfig(batch_size=64, max_batch_delay_ms=50, queue_depth=2)
T0 = datetime(2024, 5, 1, tzinfo=UTC)


def click(i: int) -> bytes:
    """A click event as a web backend writes it: no field is a plain number Kelp would read as is."""
    return orjson.dumps(
        {
            "event": {"clicked": i % 3 == 0, "at": f"2024-05-01T00:00:{i % 60:02d}.5Z", "name": "impression"},
            "user": {"uuid": f"3f2c-{i}", "plan": "pro"},
            "item": {"price": f"{i}.25", "currency": "EUR"},
            "ctx": {"device": {"mobile": i % 2 == 1, "os": "ios"}, "page": {"path": ["/home", f"/p/{i}"]}},
        }
    )


def test_a_company_json_topic_trains_through_the_source_with_no_dead_letters(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(format="json", json=MAPPING)
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    produce(kafka_broker.bootstrap, unique_topic, [click(i) for i in range(120)])
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        batches = drain(src, 120)
    finally:
        src.close()
    assert sum(b.size for b in batches) == 120
    labels = [float(x) for b in batches for x in b.labels]
    assert labels == [1.0 if i % 3 == 0 else 0.0 for i in range(120)]
    ts = [float(x) for b in batches for x in b.event_ts]
    assert ts == [T0.timestamp() + i % 60 + 0.5 for i in range(120)]
    dense = [row for b in batches for row in b.dense.tolist()]
    assert dense == [[i + 0.25, float(i % 2)] for i in range(120)]
    first = batches[0].sparse
    assert first["user"].values[:1].tolist() == [id_of("3f2c-0")]
    assert first["page"].values[:2].tolist() == [id_of("/home"), id_of("/p/0")]
    rejected = registry.get_sample_value(
        "kelp_consumer_rejected_records_total", {"topic": unique_topic, "reason": "bad_type"}
    )
    assert rejected is None
    assert dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic) == []


def test_a_json_source_on_a_msgpack_topic_stops_naming_json_and_the_records_it_judged(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    """One poll returns all 300 records; the check judges its 100 and says JSON was expected."""
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(format="json", json=MAPPING, initial_check_records=100)
    produce(
        kafka_broker.bootstrap,
        unique_topic,
        [msgpack.packb({"v": 1, "label": 1, "sparse": {"user": i}}) for i in range(300)],
    )
    src = KafkaSource(cfg, SPEC, BATCHING, CollectorRegistry())
    try:
        with pytest.raises(SourceUserError) as info:
            drain(src, 1)
    finally:
        src.close()
    message = str(info.value)
    assert message.startswith(f"topic {unique_topic} partition 0: 100 of the first 100 records were rejected")
    assert "the rejected records look like msgpack, not JSON objects" in message
    assert "schema-v1" not in message
