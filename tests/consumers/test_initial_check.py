"""The initial check and the rejection log, on real decoded chunks (no broker needed)."""

from __future__ import annotations

import logging

import msgpack
import orjson
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import FeatureSpec, SparseFeature
from kelp.consumers import encode_sample
from kelp.consumers.deadletter import LogDeadLetter, RejectLog
from kelp.consumers.decode import Chunk, Decoder, Rec
from kelp.consumers.errors import SourceUserError
from kelp.consumers.initial_check import InitialCheck, looks_like
from kelp.consumers.metrics import ConsumerMetrics
from kelp.errors import UserError

SPEC = FeatureSpec(sparse=[SparseFeature(name="a")])
KEY = ("events", 3)


def chunk(values: list[bytes], first_offset: int = 0) -> Chunk:
    records = [Rec("events", 3, first_offset + i, v) for i, v in enumerate(values)]
    return Decoder(SPEC).decode(records)


def good(n: int) -> list[bytes]:
    return [encode_sample(1, sparse={"a": i}) for i in range(n)]


def json_records(n: int) -> list[bytes]:
    return [orjson.dumps({"label": 1, "user": f"u{i}"}) for i in range(n)]


@pytest.mark.parametrize(
    ("value", "shape"),
    [
        (b'{"label": 1, "user": "u7"}', "looks like JSON"),
        (b'[1, 2, {"a": null}]', "looks like JSON"),
        (b'{"label": 1}\n{"label": 0}\n', "looks like JSON"),  # JSON lines in one record
        (b'{"label": 1, "cut": "' + b"x" * 5000, "looks like JSON"),  # too long to parse whole
        (b"1\t3\t\t5a9ed9b0\t68fd1e64", "looks like CSV/TSV text"),
        (b"user,item,rating\n1,2,5\n", "looks like CSV/TSV text"),
        (msgpack.packb({"v": 2, "label": 1}), "looks like msgpack"),
        (msgpack.packb([1, 2, 3]), "looks like msgpack"),
        (b"click from user 7", "looks like UTF-8 text"),
        ("naïve café".encode(), "looks like UTF-8 text"),
        (bytes([0xFF, 0xC1, 0x00, 0x17]), "is binary"),
        (b"", "is empty"),
    ],
)
def test_looks_like_names_what_a_record_seems_to_be(value: bytes, shape: str) -> None:
    assert looks_like(value) == shape


def test_records_are_held_until_the_sample_is_read_then_handed_on_in_order() -> None:
    check = InitialCheck(sample=100, max_fraction=0.99)
    first = chunk(good(60))
    second = chunk(json_records(5) + good(45), first_offset=60)
    assert check.offer(KEY, first, 60, caught_up=False) == []
    assert check.offer(KEY, second, 50, caught_up=False) == [first, second]
    later = chunk(json_records(10), first_offset=110)
    assert check.offer(KEY, later, 10, caught_up=False) == [later]  # decided: no more holding


def test_a_partition_of_the_wrong_format_fails_with_one_line_naming_it() -> None:
    check = InitialCheck(sample=100, max_fraction=0.99)
    assert check.offer(KEY, chunk(json_records(70)), 70, caught_up=False) == []
    with pytest.raises(SourceUserError) as info:
        check.offer(KEY, chunk(json_records(30), first_offset=70), 30, caught_up=False)
    assert isinstance(info.value, UserError)  # kelp train: exit 2, one line
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "topic events partition 3: 100 of the first 100 records were rejected (bad_msgpack 100"
    )
    assert "the rejected records look like JSON, not schema-v1 msgpack events" in message
    assert "Stopped without committing" in message and "source.max_initial_reject_fraction: null" in message


def test_the_fraction_is_a_share_of_records_not_all_or_nothing() -> None:
    nearly = InitialCheck(sample=100, max_fraction=0.99)
    with pytest.raises(SourceUserError, match="99 of the first 100 records"):
        nearly.offer(KEY, chunk(good(1) + json_records(99)), 100, caught_up=False)
    below = InitialCheck(sample=100, max_fraction=0.99)
    values = good(2) + json_records(98)
    got = below.offer(KEY, chunk(values), 100, caught_up=False)
    assert len(got) == 1 and got[0].size == 2 and len(got[0].rejections) == 98


def test_a_caught_up_partition_hands_on_early_and_keeps_counting() -> None:
    """A small or slow topic is never stuck behind the check; the check still fires at the sample."""
    check = InitialCheck(sample=100, max_fraction=0.99)
    small = chunk(json_records(40))
    assert check.offer(KEY, small, 40, caught_up=True) == [small]
    more = chunk(json_records(40), first_offset=40)
    assert check.offer(KEY, more, 40, caught_up=False) == []
    with pytest.raises(SourceUserError, match="100 of the first 100 records"):
        check.offer(KEY, chunk(json_records(20), first_offset=80), 20, caught_up=False)


def test_partitions_are_checked_apart_and_a_revoked_one_starts_over() -> None:
    check = InitialCheck(sample=10, max_fraction=0.99)
    other = ("events", 4)
    assert check.offer(KEY, chunk(json_records(5)), 5, caught_up=False) == []
    good_chunk = chunk(good(10))
    assert check.offer(other, good_chunk, 10, caught_up=False) == [good_chunk]
    check.forget(KEY)  # its held records were never handed on: the new owner reads them again
    assert check.offer(KEY, chunk(json_records(5)), 5, caught_up=False) == []


def test_none_disables_the_check() -> None:
    check = InitialCheck(sample=10, max_fraction=None)
    bad = chunk(json_records(50))
    assert check.offer(KEY, bad, 50, caught_up=False) == [bad]


def test_rejections_are_logged_at_once_then_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    sink = LogDeadLetter(ConsumerMetrics(CollectorRegistry()), log_first=3, log_every_s=60.0)
    sink.reject_log.clock = lambda: now[0]
    rejections = chunk([*json_records(10), msgpack.packb({"v": 2, "label": 1})]).rejections
    with caplog.at_level(logging.WARNING, logger="kelp.consumers.deadletter"):
        for rejection in rejections:
            sink.reject(rejection)
        lines = [r for r in caplog.records if r.getMessage() == "rejected record"]
        # The first 3 bad_msgpack at once, and the first bad_version (its own budget).
        assert [(r.reason, r.source) for r in lines] == [
            ("bad_msgpack", "events:3:0"),
            ("bad_msgpack", "events:3:1"),
            ("bad_msgpack", "events:3:2"),
            ("bad_version", "events:3:10"),
        ]
        caplog.clear()
        now[0] = 61.0
        sink.reject(rejections[0])
        (line,) = caplog.records
        assert line.reason == "bad_msgpack" and line.total == 11 and line.not_logged_since_last == 7
    assert sink.reject_log.seen("bad_msgpack") == 11


def test_reject_log_budget_is_per_key() -> None:
    now = [0.0]
    log = RejectLog(first=1, every_s=10.0, clock=lambda: now[0])
    assert log.note("a", "m", {}) is True
    assert log.note("a", "m", {}) is False
    assert log.note("b", "m", {}) is True
    now[0] = 10.0
    assert log.note("a", "m", {}) is True
    assert log.note("a", "m", {}) is False
