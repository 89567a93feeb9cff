"""The example plug-in decoder (examples/avro-decoder): Confluent-framed Avro read from the real broker."""

from __future__ import annotations

import json
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, KafkaSourceConfig, load_config
from kelp.consumers.errors import SourceUserError
from kelp.consumers.ids import id_of
from kelp.consumers.kafka_source import KafkaSource
from kelp.consumers.plugin_decoder import load_decoder
from kelp.harness.topic_reader import read_topic

pytest.importorskip("fastavro")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "avro-decoder"
CONFIG = EXAMPLE / "avro-clicks.yaml"
SCHEMA = json.loads((EXAMPLE / "click.avsc").read_text())


@pytest.fixture
def avro_decoder(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example module, imported the way a user runs it: its directory on the Python path."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import avro_decoder

    yield avro_decoder
    sys.modules.pop("avro_decoder", None)


def click(i: int) -> dict[str, Any]:
    return {
        "clicked": i % 2,
        "ts": 1_700_000_000.0 + i,
        "user": {"id": f"user-{i}", "age": None if i % 5 == 0 else float(20 + i)},
        "item_id": 1000 + i,
        "categories": ["shoes", str(i)],
    }


def dead_letters(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, str]]]:
    return [(r.value, {k: v.decode() for k, v in r.headers}) for r in read_topic(bootstrap, topic)]


@pytest.mark.integration
def test_framed_avro_records_decode_and_bad_frames_are_dead_lettered(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
    avro_decoder: ModuleType,
) -> None:
    example = load_config(CONFIG)
    assert isinstance(example.source, KafkaSourceConfig)
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(
        decoder=example.source.decoder,
        decoder_args={"schemas": {"1": "click.avsc"}, "schema_dir": str(EXAMPLE)},
        json=example.source.json_mapping.model_dump(),  # type: ignore[union-attr]
    )
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    good = [avro_decoder.frame(SCHEMA, 1, click(i)) for i in range(30)]
    body = good[0][5:]
    bad = {
        b"\x01" + struct.pack(">I", 1) + body: "bad_payload",  # not Confluent's magic byte
        b"\x00" + struct.pack(">I", 7) + body: "unknown_schema",
        b"\x00\x00": "bad_payload",  # shorter than the header
        b"\x00" + struct.pack(">I", 1) + b"\x02": "bad_payload",  # an Avro datum cut short
    }
    stream = good[:10] + list(bad) + good[10:]
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for value in stream:
        producer.send(unique_topic, value, partition=0)
    producer.flush()
    producer.close()

    registry = CollectorRegistry()
    src = KafkaSource(cfg, example.features, BatchingConfig(batch_size=64, max_batch_delay_ms=50), registry)
    batches = []
    deadline = time.monotonic() + 30
    try:
        while sum(b.size for b in batches) < 30 and time.monotonic() < deadline:
            batch = src.poll(1.0)
            if batch is not None:
                batches.append(batch)
                src.commit(batch, wait=True)
    finally:
        src.close()

    labels = [float(x) for b in batches for x in b.labels]
    users = [int(x) for b in batches for x in b.sparse["user"].values]
    items = [int(x) for b in batches for x in b.sparse["item"].values]
    categories = [int(x) for b in batches for x in b.sparse["category"].values]
    ages = [float(x) for b in batches for x in b.dense[:, 0]]
    assert labels == [float(i % 2) for i in range(30)]
    assert users == [id_of(f"user-{i}") for i in range(30)]
    assert items == [1000 + i for i in range(30)]
    assert categories == [c for i in range(30) for c in (id_of("shoes"), i)]
    assert ages == [30.0 if i % 5 == 0 else 20.0 + i for i in range(30)]  # a null age reads the default
    letters = dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic)
    assert {value: headers["reason"] for value, headers in letters} == bad
    assert {headers["error"] for value, headers in letters if headers["reason"] == "unknown_schema"} == {
        "schema id 7 is not configured (known: 1)"
    }
    assert (
        registry.get_sample_value(
            "kelp_consumer_rejected_records_total", {"topic": unique_topic, "reason": "bad_payload"}
        )
        == 3
    )


def test_the_example_decoder_refuses_a_missing_schema_file_at_start(avro_decoder: ModuleType) -> None:
    example = load_config(CONFIG)
    with pytest.raises(SourceUserError, match=r"source\.decoder_args for avro_decoder:ConfluentAvroDecoder"):
        load_decoder("avro_decoder:ConfluentAvroDecoder", example.features, {"schemas": {"1": "nope.avsc"}})
