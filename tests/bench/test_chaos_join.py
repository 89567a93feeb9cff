"""The chaos bench's join instruments: true-click books on a real topic, the click load, the crash counter.

``kelp bench chaos`` itself runs for minutes and is not part of the suite;
these tests check what its join invariants rest on, so that a 0 means
something: a true click the joiner never emitted positive is counted
orphaned, a late correction still counts as joined, dead letters are counted
by reason, clicks are owed only for acknowledged impressions, and an exit of
the joiner is a crash unless the bench had its Redis away.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest
from kafka import KafkaConsumer, KafkaProducer

from kelp.bench import chaos_rig
from kelp.bench.chaos_checks import OutputReader, account_true_clicks
from kelp.bench.chaos_faults import join_future_action, join_nonfinite_impression
from kelp.bench.chaos_load import CANDIDATES, CLICK_DELAY_S, ClickLoad, impression_record
from kelp.bench.chaos_procs import JoinWatch, KelpProcess
from kelp.bench.chaos_rig import IDLE_PARTITION_S, WINDOW_S, JoinSide, JoinTopics, join_config
from kelp.harness import KafkaBroker
from kelp.join.records import Impression

pytestmark = pytest.mark.integration


def _wait(predicate: Callable[[], Any], timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    assert predicate(), f"timed out waiting for {what}"


def _labelled(rid: str, rows: list[int], clicks: list[float], late: bool) -> bytes:
    """What the joiner emits for ``rows`` of request ``rid`` (cut from a real impression record)."""
    imp = Impression.from_raw(impression_record(rid, 1.7e9, np.arange(4, dtype=np.uint64) + 10))
    labels = {"click": np.asarray(clicks, dtype=np.float32)}
    return imp.labelled(np.asarray(rows), labels, None, late)


def test_the_books_count_a_click_never_emitted_positive_as_orphaned(
    kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    out, dlq = f"{unique_topic}-out", f"{unique_topic}-dlq"
    kafka_broker.create_topic(out)
    kafka_broker.create_topic(dlq)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    producer.send(out, _labelled("r1", [0, 1, 2, 3], [0, 0, 1, 0], late=False))  # r1/2 on time
    producer.send(
        out, _labelled("r2", [0, 1, 2, 3], [0, 0, 0, 0], late=False)
    )  # r2/1 clicked, never positive
    producer.send(out, _labelled("r3", [0, 1, 2, 3], [0, 0, 0, 0], late=False))
    producer.send(out, _labelled("r3", [0], [1], late=True))  # r3/0: a late correction is still a positive
    for reason in ("future_ts", "bad_type", "bad_type"):
        producer.send(dlq, b"\x00", headers=[("reason", reason.encode()), ("error", b"x")])
    producer.flush(30)
    producer.close()

    reader = OutputReader(kafka_broker.bootstrap, out, dlq)
    reader.start()
    try:
        _wait(lambda: reader.outputs == 4 and sum(reader.dead_letters.values()) == 3, what="everything read")
    finally:
        reader.finish()
    positives, negatives, outputs, unreadable, dead = reader.figures()
    assert positives == {"r1/2": False, "r3/0": True}
    assert (negatives, outputs, unreadable) == (3 + 4 + 4, 4, 0)
    assert dead == {"future_ts": 1, "bad_type": 2}

    books = account_true_clicks(["r1/2", "r2/1", "r3/0"], positives)
    assert (books.true_clicks, books.joined, books.joined_only_late) == (3, 2, 1)
    assert books.orphaned == 1 and books.orphaned_examples == ["r2/1"]


def test_the_load_owes_clicks_only_for_acknowledged_impressions_and_pauses(
    kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    imp, clicks = f"{unique_topic}-imp", f"{unique_topic}-clicks"
    kafka_broker.create_topic(imp)
    kafka_broker.create_topic(clicks)
    load = ClickLoad(kafka_broker.bootstrap, imp, clicks, rate=40.0, seed=3)
    load.start()
    _wait(lambda: load.impressions_acked >= 10, what="10 impressions acknowledged")
    with load.paused():
        time.sleep(0.3)  # an impression being sent as the pause began is acknowledged meanwhile
        paused_at = load.impressions_sent
        _wait(lambda: len(load.snapshot()) >= 3, what="clicks owed before the pause")
        assert load.impressions_sent == paused_at
    load.finish()
    assert load.error is None
    true_clicks = load.snapshot()
    assert load.impressions_failed == 0 and load.clicks_failed == 0

    def read(topic: str, n: int) -> list[Any]:
        consumer = KafkaConsumer(
            topic, bootstrap_servers=kafka_broker.bootstrap, auto_offset_reset="earliest"
        )
        got: list[Any] = []
        try:
            _wait(lambda: got.extend(r for rs in consumer.poll(200).values() for r in rs) or len(got) >= n)
            return got
        finally:
            consumer.close()

    impressions = {r.key.decode(): msgpack.unpackb(r.value)["ts"] for r in read(imp, load.impressions_sent)}
    sent = [orjson.loads(r.value) for r in read(clicks, len(true_clicks))]
    assert len(impressions) == load.impressions_sent
    # every click sent is a true click, of a candidate of an impression on the topic, a few seconds later
    assert sorted(f"{c['request_id']}/{(c['item'] - 1000) % CANDIDATES}" for c in sent) == sorted(true_clicks)
    for c in sent:
        delay = c["ts"] - impressions[c["request_id"]]
        assert CLICK_DELAY_S[0] <= delay, (
            c
        )  # the click's event time is its own wall clock, after its impression


def _exiting_process(tmp_path: Path, code: int, after_s: float) -> KelpProcess:
    process = KelpProcess("fake-join", [], 1, tmp_path)
    process.argv = [sys.executable, "-c", f"import sys, time; time.sleep({after_s}); sys.exit({code})"]
    return process


def test_the_watch_counts_an_exit_outside_a_store_outage_as_a_crash_and_restarts(tmp_path: Path) -> None:
    process = _exiting_process(tmp_path, code=3, after_s=0.2)
    watch = JoinWatch(process, interval_s=0.05, grace_s=0.3, backoff_s=(0.05, 0.1))
    process.start()
    watch.start()
    try:
        _wait(lambda: watch.crash_loops >= 2, what="two crashes")
        with watch.store_outage():
            expected = watch.store_outage_exits
            _wait(lambda: watch.store_outage_exits > expected, what="an exit during the outage")
        crashes = watch.crash_loops
        _wait(lambda: watch.crash_loops > crashes, what="a crash after the outage and its grace")
    finally:
        watch.finish()
        process.stop(5)
    exits = list(watch.exits)
    assert exits and all(e.code == 3 for e in exits)
    # each exit restarted, as Kubernetes would (but the last, when the watch stopped during its back-off)
    assert len(exits) <= process.incarnations <= len(exits) + 1
    assert watch.crash_loops + watch.store_outage_exits == len(exits)


def test_the_watch_does_not_count_the_bench_stopping_the_joiner(tmp_path: Path) -> None:
    process = _exiting_process(tmp_path, code=0, after_s=60)
    watch = JoinWatch(process, interval_s=0.05)
    process.start()
    watch.start()
    time.sleep(0.3)
    watch.finish()  # first the watch, then the stop: the bench's own exit
    process.stop(5)
    assert watch.exits == [] and watch.crash_loops == 0 and process.incarnations == 1


def test_the_join_config_is_valid_and_makes_an_idle_impressions_partition_plausible() -> None:
    doc = join_config(
        "127.0.0.1:9092", "redis://127.0.0.1:6379/0", JoinTopics.fresh(), port=9999, socket_timeout_s=1.0
    )
    assert doc["join"]["idle_partition_s"] == IDLE_PARTITION_S < WINDOW_S
    assert doc["join"]["actions"][0]["window_s"] > CLICK_DELAY_S[1] + doc["join"]["allowed_lateness_s"]


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("KELP_SLOW"),
    reason="the rig's joiner under both faults, for seconds; tests/join covers each fault; KELP_SLOW=1",
)
def test_a_running_join_takes_both_hostile_time_faults_without_orphans_or_crashes(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The join side of the rig alone, on a real broker and redis-server, with the two join faults."""
    monkeypatch.setattr(chaos_rig, "JOIN_RECOVERY_TIMEOUT_S", 20.0)
    monkeypatch.setattr(chaos_rig, "JOIN_SETTLE_TIMEOUT_S", 30.0)
    side = JoinSide(kafka_broker, redis_url, tmp_path, socket_timeout_s=1.0)
    rig: Any = SimpleNamespace(join=side)
    with contextlib.ExitStack() as stack:
        side.start(stack)
        _wait(lambda: side.reader.joined(side.load.snapshot()), 90, "a first click joined")
        future = join_future_action(rig, None, random.Random(1))
        nonfinite = join_nonfinite_impression(rig, None, random.Random(2))
        report = side.settle()
    logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(tmp_path.glob("join-*.log")))
    invariants = {
        k: report[k] for k in ("join_crash_loops", "join_orphaned_true_clicks", "join_dead_letters")
    }
    expected = {
        "join_crash_loops": 0,
        "join_orphaned_true_clicks": 0,
        "join_dead_letters": {"future_ts": 1, "bad_type": 2},
    }
    assert invariants == expected, (future, nonfinite, report["join_exits"], logs)
    assert report["join_true_clicks"] > 0
    assert future["join_positive_again_s"] is not None and nonfinite["join_positive_again_s"] is not None
