"""Declared casts of the JSON mapping (``source.json.casts``): what they read, and what they refuse."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgpack
import orjson
import pytest
from pydantic import ValidationError

from kelp.config import DenseFeature, FeatureSpec, JsonMapping, LabelSpec, SparseFeature
from kelp.consumers import REASONS, encode_sample
from kelp.consumers.decode import Chunk, Decoder, Rec
from kelp.consumers.errors import SourceUserError
from kelp.consumers.initial_check import InitialCheck
from kelp.consumers.json_events import MappedDecoder, cast_reader

SPEC = FeatureSpec(
    labels=[LabelSpec(name="click"), LabelSpec(name="dwell", kind="float")],
    dense=[DenseFeature(name="price"), DenseFeature(name="mobile")],
    sparse=[SparseFeature(name="user")],
)
MAPPING: dict[str, Any] = {
    "label_field": "event.clicked",
    "labels": {"dwell": "event.dwell_s"},
    "weight_field": "w",
    "event_time_field": "ts",
    "dense_fields": {"price": "item.price", "mobile": "ctx.mobile"},
    "sparse_fields": {"user": "user.id"},
    "casts": {
        "event.clicked": "bool",
        "event.dwell_s": "number",
        "w": "number",
        "ts": "iso8601",
        "item.price": "number",
        "ctx.mobile": "bool",
    },
}
T = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()


def company(**changes: Any) -> dict[str, Any]:
    """One click event as a company's producer writes it: booleans, an ISO time, numbers as strings."""
    out: dict[str, Any] = {
        "event": {"clicked": True, "dwell_s": "2.5"},
        "w": "0.5",
        "ts": "2024-05-01T12:00:00Z",
        "item": {"price": "19.90"},
        "ctx": {"mobile": False},
        "user": {"id": "alice"},
    }
    out.update(changes)
    return out


def decode(values: list[dict[str, Any]], mapping: dict[str, Any] = MAPPING) -> Chunk:
    decoder = MappedDecoder(SPEC, JsonMapping(**mapping))
    return decoder.decode([Rec("t", 0, i, orjson.dumps(v)) for i, v in enumerate(values)])


def test_declared_casts_read_booleans_iso_times_and_numeric_strings() -> None:
    chunk = decode(
        [
            company(),
            company(
                event={"clicked": False, "dwell_s": 4}, ts="2024-05-01T14:00:00+02:00", ctx={"mobile": True}
            ),
        ]
    )
    assert chunk.rejections == []
    assert chunk.labels.tolist() == [1.0, 0.0]
    assert chunk.extra_labels["dwell"].tolist() == [2.5, 4.0]
    assert chunk.weight is not None and chunk.weight.tolist() == [0.5, 0.5]
    assert chunk.ts.tolist() == [T, T]  # 14:00 at +02:00 is 12:00 UTC
    assert chunk.dense.ravel().tolist() == pytest.approx([19.9, 0.0, 19.9, 1.0])  # price, mobile


@pytest.mark.parametrize(
    ("cast", "value", "seconds"),
    [
        ("seconds", "1714564800", T),
        ("seconds", 1714564800, T),
        ("milliseconds", 1714564800000, T),
        ("milliseconds", "1714564800500", T + 0.5),
        ("iso8601", "2024-05-01T12:00:00.250Z", T + 0.25),
        ("iso8601_utc", "2024-05-01T12:00:00", T),  # no zone: read as UTC
        ("iso8601_utc", "2024-05-01T13:00:00+01:00", T),  # a zone given is kept
    ],
)
def test_event_time_casts_give_epoch_seconds(cast: str, value: Any, seconds: float) -> None:
    assert cast_reader(cast)(value) == pytest.approx(seconds)
    chunk = decode([company(ts=value)], {**MAPPING, "casts": {**MAPPING["casts"], "ts": cast}})
    assert chunk.rejections == [] and chunk.ts.tolist() == pytest.approx([seconds])


@pytest.mark.parametrize(
    ("changes", "detail"),
    [
        (
            {"event": {"clicked": "yes", "dwell_s": 1}},
            "label 'event.clicked': 'yes' is not true/false (casts: bool)",
        ),
        ({"event": {"clicked": 1, "dwell_s": "long"}}, "label 'event.dwell_s': 'long' is not a number"),
        ({"event": {"clicked": 1, "dwell_s": True}}, "label 'event.dwell_s': True is not a number"),
        ({"w": "heavy"}, "weight 'w': 'heavy' is not a number (casts: number)"),
        ({"item": {"price": "9,90"}}, "dense 'price': '9,90' is not a number (casts: number)"),
        ({"ctx": {"mobile": "no"}}, "dense 'mobile': 'no' is not true/false"),
        ({"ts": "2024-13-01T00:00:00Z"}, "event time 'ts': '2024-13-01T00:00:00Z' is not an ISO-8601 time"),
        ({"ts": 1714564800}, "event time 'ts': 1714564800 is not an ISO-8601 string (casts: iso8601)"),
        (
            {"ts": "2024-05-01T12:00:00"},
            "has no zone (Z or +hh:mm); casts: iso8601_utc reads such a time as UTC",
        ),
    ],
)
def test_a_value_its_cast_cannot_read_is_bad_type_naming_field_and_cast(
    changes: dict[str, Any], detail: str
) -> None:
    chunk = decode([company(), company(**changes)])
    assert chunk.size == 1
    (rejection,) = chunk.rejections
    assert (rejection.offset, rejection.reason) == (1, "bad_type")
    assert detail in rejection.detail
    assert rejection.reason in REASONS


def test_a_cast_value_still_meets_the_label_checks() -> None:
    """A cast reads the value; the label's own rules (0/1 for a binary task) still judge it."""
    chunk = decode(
        [company(event={"clicked": "2", "dwell_s": 1})],
        {**MAPPING, "casts": {**MAPPING["casts"], "event.clicked": "number"}},
    )
    assert [r.reason for r in chunk.rejections] == ["bad_label"]


def test_undeclared_fields_stay_strict_and_say_a_cast_can_read_them() -> None:
    chunk = decode([company()], {**MAPPING, "casts": {}})
    (rejection,) = chunk.rejections
    assert rejection.reason == "bad_type"
    assert rejection.detail == (
        "label 'event.clicked' is bool, expected a number (source.json.casts can declare how to read it)"
    )


@pytest.mark.parametrize(
    ("casts", "message"),
    [
        ({"nope": "bool"}, "casts.nope: 'nope' is not a mapped path"),
        ({"ts": "bool"}, "casts.ts: bool does not apply to event time fields"),
        ({"event.clicked": "iso8601"}, "casts.event.clicked: iso8601 does not apply to label fields"),
        ({"w": "bool"}, "casts.w: bool does not apply to weight fields"),
        ({"user.id": "number"}, "casts.user.id: number does not apply to sparse fields"),
        ({"ts": "unix"}, "Input should be 'bool', 'number', 'seconds'"),
    ],
)
def test_casts_that_do_not_fit_their_field_are_refused_at_load(casts: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JsonMapping(**{**MAPPING, "casts": casts})


@pytest.mark.parametrize(
    ("cast", "value"), [("seconds", "nan"), ("seconds", "inf"), ("milliseconds", "soon"), ("seconds", True)]
)
def test_an_epoch_cast_takes_only_a_finite_number(cast: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"is not a finite number of epoch {cast} \\(casts: {cast}\\)"):
        cast_reader(cast)(value)


# ---------------------------------------------------------------- the wrong-format stop


def _records(values: list[bytes], decoder: Any) -> Chunk:
    return decoder.decode([Rec("events", 0, i, v) for i, v in enumerate(values)])


def test_the_stop_counts_the_records_it_judged_not_the_whole_poll() -> None:
    """One poll brings 2000 records; the check judges its first 100 and says so."""
    spec = FeatureSpec(sparse=[SparseFeature(name="a")])
    values = [orjson.dumps({"label": 1}) for _ in range(1990)] + [encode_sample(1, sparse={"a": 1})] * 10
    check = InitialCheck(sample=100, max_fraction=0.99)
    with pytest.raises(SourceUserError) as info:
        check.offer(("events", 0), _records(values, Decoder(spec)), len(values), caught_up=False)
    assert str(info.value).startswith(
        "topic events partition 0: 100 of the first 100 records were rejected (bad_msgpack 100;"
    )


def test_a_json_source_of_msgpack_records_names_json_as_what_was_expected() -> None:
    decoder = MappedDecoder(SPEC, JsonMapping(**MAPPING))
    values = [msgpack.packb({"v": 1, "label": 1, "sparse": {"user": i}}) for i in range(100)]
    check = InitialCheck(sample=100, max_fraction=0.99, expects="JSON objects")
    with pytest.raises(SourceUserError) as info:
        check.offer(("events", 0), _records(values, decoder), 100, caught_up=False)
    message = str(info.value)
    assert "(bad_json 100;" in message
    assert "the rejected records look like msgpack, not JSON objects" in message
    assert "schema-v1" not in message
    assert "set source.format, source.topic_formats or source.decoder to what the topic holds" in message


def test_json_records_whose_fields_do_not_fit_are_told_to_fix_the_mapping() -> None:
    """Records of the right format but the wrong fields: the hint is the mapping, not the topic."""
    decoder = MappedDecoder(SPEC, JsonMapping(**MAPPING))
    values = [orjson.dumps({"clicked": 1, "user": {"id": i}}) for i in range(100)]
    check = InitialCheck(sample=100, max_fraction=0.99, expects="JSON objects")
    with pytest.raises(SourceUserError) as info:
        check.offer(("events", 0), _records(values, decoder), 100, caught_up=False)
    message = str(info.value)
    assert "(missing_label 100; first: no 'event.clicked' field)" in message
    assert "they read as JSON objects (looks like JSON) but their fields do not fit the config" in message
    assert "fix the field mapping (source.json, features) or the producer" in message
