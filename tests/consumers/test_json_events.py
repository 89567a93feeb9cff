"""JSON events (``format: json``) and the plug-in decoder contract: on the real broker, and in files."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from kelp.config import (
    BatchingConfig,
    DenseFeature,
    FeatureSpec,
    FileSourceConfig,
    JsonMapping,
    KafkaSourceConfig,
    LabelSpec,
    SparseFeature,
)
from kelp.consumers import REASONS, DecodeError, MicroBatch
from kelp.consumers.decode import Rec
from kelp.consumers.errors import SourceClosedError, SourceUserError
from kelp.consumers.file_source import FileSource
from kelp.consumers.ids import id_of
from kelp.consumers.json_events import MappedDecoder
from kelp.consumers.kafka_source import KafkaSource
from kelp.consumers.plugin_decoder import load_decoder, parse_with
from kelp.harness.topic_reader import read_topic

SPEC = FeatureSpec(
    label=LabelSpec(name="label", kind="binary"),
    dense=[DenseFeature(name="age", default=30.0), DenseFeature(name="price")],
    sparse=[SparseFeature(name="user"), SparseFeature(name="category", max_ids=3)],
)
MAPPING = {
    "label_field": "clicked",
    "event_time_field": "ts",
    "dense_fields": {"age": "user.age", "price": "ctx.price"},
    "sparse_fields": {"user": "user.id", "category": "ctx.page.category"},
}
BATCHING = BatchingConfig(batch_size=64, max_batch_delay_ms=50, queue_depth=2)


def event(i: int, **changes: Any) -> dict[str, Any]:
    """Event ``i``: user ``u<i>``, one category per event plus a shared one, nested like a real producer's."""
    out: dict[str, Any] = {
        "clicked": i % 2,
        "ts": 1_700_000_000.0 + i,
        "user": {"id": f"u{i}", "age": 20 + i},
        "ctx": {"price": i / 2, "page": {"category": [str(i), "sports"]}, "ignored": {"x": 1}},
    }
    out.update(changes)
    return out


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for v in values:
        producer.send(topic, v, partition=0)
    producer.flush()
    producer.close()


def drain(src: Any, samples: int, timeout_s: float = 30.0) -> list[MicroBatch]:
    batches: list[MicroBatch] = []
    deadline = time.monotonic() + timeout_s
    while sum(b.size for b in batches) < samples and time.monotonic() < deadline:
        batch = src.poll(1.0)
        if batch is not None:
            batches.append(batch)
            src.commit(batch, wait=True)
    return batches


def rows(batches: list[MicroBatch]) -> list[dict[str, Any]]:
    """Each sample of the batches as plain values, in order."""
    out = []
    for b in batches:
        for i in range(b.size):
            cat = b.sparse["category"]
            user = b.sparse["user"]
            out.append(
                {
                    "label": float(b.labels[i]),
                    "ts": float(b.event_ts[i]),
                    "dense": b.dense[i].tolist(),
                    "user": user.values[user.offsets[i] : user.offsets[i + 1]].tolist(),
                    "category": cat.values[cat.offsets[i] : cat.offsets[i + 1]].tolist(),
                }
            )
    return out


def dead_letters(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, str]]]:
    return [(r.value, {k: v.decode() for k, v in r.headers}) for r in read_topic(bootstrap, topic)]


def expected(i: int) -> dict[str, Any]:
    return {
        "label": float(i % 2),
        "ts": 1_700_000_000.0 + i,
        "dense": [20.0 + i, i / 2],
        "user": [id_of(f"u{i}")],
        "category": [i, id_of("sports")],  # "<digits>" is that integer id, by the one id rule
    }


# ---------------------------------------------------------------- on the broker


@pytest.mark.integration
def test_nested_json_objects_from_a_topic_decode_into_the_expected_batch(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    values = [orjson.dumps(event(i)) for i in range(40)]
    # Optional fields left out or null: dense reads the default, no ts, no ids.
    values.append(orjson.dumps({"clicked": 1, "user": {"id": 7, "age": None}, "ctx": {}}))
    values.append(orjson.dumps({"clicked": 0, "user": {"id": "0042"}}))
    produce(kafka_broker.bootstrap, unique_topic, values)
    cfg = kafka_config(format="json", json=MAPPING)
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        got = rows(drain(src, 42))
    finally:
        src.close()
    assert got[:40] == [expected(i) for i in range(40)]
    for row, want in zip(
        got[40:],
        [
            {"label": 1.0, "dense": [30.0, 0.0], "user": [7], "category": []},
            {"label": 0.0, "dense": [30.0, 0.0], "user": [42], "category": []},
        ],
        strict=True,
    ):
        assert math.isnan(row.pop("ts"))
        assert row == want
    assert registry.get_sample_value("kelp_consumer_records_total", {"topic": unique_topic}) == 42


@pytest.mark.integration
def test_malformed_json_records_are_dead_lettered_with_their_reason_and_counted(
    kafka_broker,  # type: ignore[no-untyped-def]
    unique_topic: str,
    kafka_config: Callable[..., KafkaSourceConfig],
) -> None:
    kafka_broker.create_topic(unique_topic, 1)
    cfg = kafka_config(format="json", json=MAPPING)
    kafka_broker.create_topic(cfg.dead_letter_topic, 1)
    bad = {
        b'{"clicked": 1, "user": ': "bad_json",
        b"[1, 2]": "bad_json",
        orjson.dumps(event(0, clicked=None)): "missing_label",
        orjson.dumps({"user": {"id": 1}}): "missing_label",
        orjson.dumps(event(0, clicked="yes")): "bad_type",
        orjson.dumps(event(0, user={"id": 1, "age": "old"})): "bad_type",
        orjson.dumps(event(0, user="alice")): "bad_type",
        orjson.dumps(event(0, user={"id": -5})): "bad_id",
        orjson.dumps(event(0, user={"id": 1.5})): "bad_id",
        orjson.dumps(event(0, user={"id": {"nested": 1}})): "bad_type",
        orjson.dumps(event(0, clicked=2)): "bad_label",
        orjson.dumps(event(0, ctx={"page": {"category": [1, 2, 3, 4]}})): "too_many_ids",
    }
    stream: list[bytes] = []
    for i in range(60):
        stream.append(orjson.dumps(event(i)))
        if i < len(bad):
            stream.append(list(bad)[i])
    produce(kafka_broker.bootstrap, unique_topic, stream)
    registry = CollectorRegistry()
    src = KafkaSource(cfg, SPEC, BATCHING, registry)
    try:
        got = rows(drain(src, 60))
    finally:
        src.close()
    assert got == [expected(i) for i in range(60)]
    letters = dead_letters(kafka_broker.bootstrap, cfg.dead_letter_topic)
    assert {value: headers["reason"] for value, headers in letters} == bad
    by_value = {value: headers for value, headers in letters}
    assert "user: id -5 is outside" in by_value[orjson.dumps(event(0, user={"id": -5}))]["error"]
    assert by_value[orjson.dumps(event(0, user="alice"))]["error"] == ("user.age: user is str, not an object")
    for reason in set(bad.values()):
        assert registry.get_sample_value(
            "kelp_consumer_rejected_records_total", {"topic": unique_topic, "reason": reason}
        ) == list(bad.values()).count(reason)


# ---------------------------------------------------------------- files


def test_a_json_lines_file_replays_and_names_bad_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    lines = [orjson.dumps(event(i)).decode() for i in range(5)]
    lines.insert(2, "")  # blank lines are skipped, and still counted in line numbers
    lines.insert(4, '{"clicked": 1, "user": {"id": true}}')
    path.write_text("\n".join(lines) + "\n")
    cfg = FileSourceConfig(path=path, format="json", json=MAPPING)
    registry = CollectorRegistry()
    src = FileSource(cfg, SPEC, BatchingConfig(batch_size=2), registry)
    with caplog.at_level("WARNING"):
        got = rows(list(src))
    assert got == [expected(i) for i in range(5)]
    assert (
        registry.get_sample_value(
            "kelp_consumer_rejected_records_total", {"topic": str(path), "reason": "bad_id"}
        )
        == 1
    )
    assert any(getattr(r, "source", None) == f"{path}:5" for r in caplog.records)
    with pytest.raises(SourceClosedError):
        src.poll()


# ---------------------------------------------------------------- config and contract


def test_a_list_of_names_maps_each_feature_to_the_field_of_its_name() -> None:
    mapping = JsonMapping(label_field="y", dense_fields=["age", "price"], sparse_fields=["user"])
    assert mapping.dense_fields == {"age": "age", "price": "price"}
    assert mapping.sparse_fields == {"user": "user"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"format": "json"}, "format 'json' needs a json mapping"),
        ({"json": {"label_field": "y"}}, "read only with format 'json' or a decoder"),
        ({"decoder": "mod:Thing"}, "a decoder needs a json mapping"),
        ({"decoder": "not a ref", "json": {"label_field": "y"}}, "expected package.module:attr"),
        ({"decoder_args": {"x": 1}}, "decoder_args given without a decoder"),
        ({"format": "json", "json": {"label_field": "a..b"}}, "is not a dotted path"),
        ({"format": "json", "json": {"label_field": "y", "weight": "w"}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_json_and_decoder_settings_are_refused_at_load(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KafkaSourceConfig(bootstrap_servers=["b:9092"], topics=["t"], **fields)


def test_a_mapping_naming_an_undeclared_feature_or_leaving_a_sparse_one_out_is_a_user_error() -> None:
    with pytest.raises(SourceUserError, match=r"source.json.dense_fields.height: 'height' is not a declared"):
        MappedDecoder(
            SPEC, JsonMapping(label_field="y", dense_fields=["height"], sparse_fields=["user", "category"])
        )
    with pytest.raises(SourceUserError, match="category have no field"):
        MappedDecoder(SPEC, JsonMapping(label_field="y", sparse_fields=["user"]))


class Envelope:
    """A plug-in decoder: ``<kind>|<json>``; kind ``x`` is an unknown reason, ``boom`` a decoder bug."""

    def __init__(self, spec: FeatureSpec, prefix: str = "ev") -> None:
        self.prefix = prefix

    def decode(self, value: bytes) -> dict[str, Any]:
        kind, _, body = value.partition(b"|")
        if kind == b"x":
            raise DecodeError("no_such_reason", "made up")
        if kind == b"boom":
            raise RuntimeError("decoder bug")
        if kind != self.prefix.encode():
            raise DecodeError("bad_payload", f"kind {kind!r}")
        return orjson.loads(body)


def test_a_plug_in_decoder_goes_through_the_json_mapping_and_its_errors_become_bounded_reasons() -> None:
    decoder = load_decoder(f"{__name__}:Envelope", SPEC, {"prefix": "ev"})
    mapped = MappedDecoder(SPEC, JsonMapping(**MAPPING), parse_with(decoder))
    values = [b"ev|" + orjson.dumps(event(1)), b"zz|{}", b"x|{}", b"boom|{}", b"ev|" + orjson.dumps({"c": 1})]
    chunk = mapped.decode([Rec("t", 0, i, v) for i, v in enumerate(values)])
    assert chunk.size == 1 and chunk.values["user"].tolist() == [id_of("u1")]
    assert chunk.dense.tolist() == [[21.0, 0.5]]
    got = [(r.offset, r.reason, r.detail) for r in chunk.rejections]
    assert got == [
        (1, "bad_payload", "kind b'zz'"),
        (2, "bad_payload", "no_such_reason: made up"),
        (3, "bad_payload", "Envelope: RuntimeError: decoder bug"),
        (4, "missing_label", "no 'clicked' field"),
    ]
    assert all(r.reason in REASONS for r in chunk.rejections)


@pytest.mark.parametrize(
    ("ref", "args", "message"),
    [
        ("no_such_module_kelp:X", {}, "cannot import no_such_module_kelp"),
        (f"{__name__}:Nope", {}, "has no Nope"),
        (f"{__name__}:Envelope", {"colour": "red"}, "source.decoder_args for"),
        (f"{__name__}:SPEC", {}, "not a callable"),
    ],
)
def test_a_decoder_that_cannot_be_made_is_a_one_line_user_error(
    ref: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(SourceUserError, match=message) as info:
        load_decoder(ref, SPEC, args)
    assert "\n" not in str(info.value)


def test_dense_values_land_as_float32_columns_in_config_order() -> None:
    mapped = MappedDecoder(SPEC, JsonMapping(**MAPPING))
    chunk = mapped.decode([Rec("t", 0, 0, orjson.dumps(event(3, ctx={"price": 9})))])
    assert chunk.dense.dtype == np.float32 and chunk.dense.tolist() == [[23.0, 9.0]]
    assert chunk.lengths["category"].tolist() == [0]
