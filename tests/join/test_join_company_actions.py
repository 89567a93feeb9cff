"""Actions as a company writes them: nested ids, ISO times, a plug-in decoder; bad ones dead-lettered."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from kelp.config import ActionStream, FeatureSpec
from kelp.consumers import DecodeError
from kelp.consumers.errors import SourceUserError
from kelp.consumers.ids import id_of
from kelp.harness import KafkaBroker
from kelp.harness.topic_reader import read_topic
from kelp.join import JoinProcess
from kelp.join.records import InputError, load_action_decoders, read_action

from .helpers import HEARTBEAT, T0, impression, join_config, produce, read_output, wait_for

COMPANY = {
    "request_id_field": "event.request.id",
    "item_field": "target.sku",
    "ts_field": "event.at",
    "casts": {"event.at": "iso8601"},
}


def iso(t: float, zone: str = "Z") -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + zone


def company_click(rid: str, t: float, sku: Any) -> bytes:
    return orjson.dumps(
        {"event": {"request": {"id": rid}, "at": iso(t), "type": "click"}, "target": {"sku": sku}}
    )


def stream(**changes: Any) -> ActionStream:
    return ActionStream(topic="clicks", task="click", window_s=60, **{**COMPANY, **changes})


def test_nested_ids_and_iso_times_are_read_by_the_declared_paths_and_cast() -> None:
    action = read_action(stream(), company_click("r1", T0 + 5, "sku-9"), 0)
    assert (action.request_id, action.item, action.ts) == ("r1", id_of("sku-9"), T0 + 5)
    ms = stream(casts={"event.at": "milliseconds"})
    value = orjson.dumps({"event": {"request": {"id": 7}, "at": str(int(T0 * 1000))}, "target": {"sku": 3}})
    assert read_action(ms, value, 0).ts == T0


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (
            orjson.dumps(
                {"event": {"request": {"id": "r1"}, "at": "2024-05-01T12:00:00"}, "target": {"sku": 1}}
            ),
            "bad_type",
            "event time at 'event.at': '2024-05-01T12:00:00' has no zone",
        ),
        (
            orjson.dumps({"event": {"request": {"id": "r1"}, "at": iso(T0)}, "target": {"sku": {"id": 4}}}),
            "bad_id",
            "(an object with id: point item_field at the id inside it, a dotted path)",
        ),
        (
            orjson.dumps({"event": {"request": {"id": {"uuid": "x"}}, "at": iso(T0)}}),
            "bad_type",
            "request id at 'event.request.id' is dict (an object with uuid",
        ),
    ],
)
def test_an_action_its_mapping_cannot_read_names_the_field_and_reason(
    value: bytes, reason: str, detail: str
) -> None:
    with pytest.raises(InputError) as info:
        read_action(stream(), value, 0)
    assert info.value.reason == reason and detail in info.value.detail


class Pipe:
    """A plug-in decoder of ``rid|item|iso-time`` action records."""

    def __init__(self, spec: FeatureSpec | None, sep: str = "|") -> None:
        assert spec is None  # actions have no feature spec
        self.sep = sep

    def decode(self, value: bytes) -> dict[str, Any]:
        parts = value.decode().split(self.sep)
        if len(parts) != 3:
            raise DecodeError("bad_payload", f"{len(parts)} fields, expected 3")
        return {"rid": parts[0], "item": parts[1], "at": parts[2]}


def test_a_plug_in_decoder_reads_action_records_and_its_refusals_keep_their_reason() -> None:
    piped = ActionStream(
        topic="clicks",
        task="click",
        window_s=60,
        decoder=f"{__name__}:Pipe",
        decoder_args={"sep": ";"},
        request_id_field="rid",
        item_field="item",
        ts_field="at",
        casts={"at": "iso8601_utc"},
    )
    load_action_decoders([piped])
    action = read_action(piped, b"r3;sku-1;2023-11-14T22:13:25", 0)
    assert (action.request_id, action.item, action.ts) == ("r3", id_of("sku-1"), 1_700_000_005.0)
    with pytest.raises(InputError, match="bad_payload: 2 fields, expected 3"):
        read_action(piped, b"r3;sku-1", 0)
    broken = piped.model_copy(update={"decoder": f"{__name__}:Nope"})
    with pytest.raises(SourceUserError, match=r"join.actions\[topic=clicks\].decoder .*has no Nope"):
        load_action_decoders([broken])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"casts": {"target.sku": "iso8601"}}, "casts.target.sku: only the event time"),
        ({"casts": {"event.at": "bool"}}, "Input should be 'seconds', 'milliseconds', 'iso8601'"),
        ({"decoder": "m:Cls", "format": "msgpack"}, "decoder and format exclude each other"),
        ({"decoder_args": {"a": 1}}, "decoder_args given without a decoder"),
    ],
)
def test_action_casts_and_decoders_are_checked_at_load(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        stream(**fields)


@pytest.mark.integration
def test_company_actions_join_and_the_unreadable_ones_are_dead_lettered_and_logged(
    kafka_broker: KafkaBroker, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    tag = uuid.uuid4().hex[:8]
    topics = {k: f"join-{k}-{tag}" for k in ("imp", "clicks", "out", "dlq")}
    for name in topics.values():
        kafka_broker.create_topic(name)
    topics["group"] = f"join-{tag}"
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topics["imp"], [(f"r{i}", impression(f"r{i}", T0 + i)) for i in range(3)])
    produce(bootstrap, topics["imp"], [(HEARTBEAT, impression(HEARTBEAT, T0 + 1000))])
    zoneless = orjson.dumps(
        {"event": {"request": {"id": "r2"}, "at": "2023-11-14T22:13:30"}, "target": {"sku": 101}}
    )
    nested = orjson.dumps(
        {"event": {"request": {"id": "r2"}, "at": iso(T0 + 5)}, "target": {"sku": {"id": 102}}}
    )
    clicks = [
        ("r0", company_click("r0", T0 + 5, 102)),
        ("r1", company_click("r1", T0 + 6, "103")),  # a string id: the one id rule reads it as 103
        ("r2", zoneless),
        ("r2", nested),
        ("r2", b"<click rid='r2'/>"),
        (HEARTBEAT, company_click(HEARTBEAT, T0 + 1000, 1)),
    ]
    produce(bootstrap, topics["clicks"], clicks)
    action = {"topic": topics["clicks"], "task": "click", "window_s": 60, **COMPANY}
    process = JoinProcess(join_config(bootstrap, redis_url, topics, actions=[action]))
    seen: list[dict[str, Any]] = []

    def finished() -> bool:
        out = read_output(bootstrap, topics["out"])
        seen[:] = [s for s in out if not s["id"].startswith(HEARTBEAT)]
        return len(seen) >= 9

    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(finished, 90, "every candidate labelled")
    finally:
        stop.set()
        thread.join(15)
    positives = sorted(s["id"] for s in seen if s["click"] == 1.0)
    assert positives == ["r0/1", "r1/2"] and len(seen) == 9
    letters = {bytes(dict(m.headers)["reason"]): m for m in read_topic(bootstrap, topics["dlq"])}
    assert sorted(letters) == [b"bad_id", b"bad_payload", b"bad_type"]
    assert letters[b"bad_type"].value == zoneless
    assert b"has no zone" in dict(letters[b"bad_type"].headers)["error"]
    assert dict(letters[b"bad_id"].headers)["source_topic"] == topics["clicks"].encode()
    said = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("join: rejected actions record")
    ]
    assert sorted(m.split(":")[1].strip() for m in said) == [
        "rejected actions record (bad_id)",
        "rejected actions record (bad_payload)",
        "rejected actions record (bad_type)",
    ]
