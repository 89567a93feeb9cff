"""``kelp join`` on a real broker and redis-server: labels, late clicks, commits, kill -9, replays.

Event times are in the past and ``advance_when_idle`` is off, so only the
inputs' own event times move the watermark: a heartbeat impression and click
far in event time close every window. That makes each run deterministic and
lets a replay be compared with the live run exactly.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from kelp.errors import StoreUnavailableError
from kelp.harness import KafkaBroker, RedisServer
from kelp.harness.topic_reader import read_topic
from kelp.join import JoinProcess
from kelp.join.joiner import Output, Step

from .helpers import (
    HEARTBEAT,
    T0,
    click,
    impression,
    join_config,
    join_config_dict,
    produce,
    read_output,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


def _topics(broker: KafkaBroker) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    topics = {k: f"join-{k}-{tag}" for k in ("imp", "clicks", "out", "dlq")}
    for name in topics.values():
        broker.create_topic(name)
    topics["group"] = f"join-{tag}"
    return topics


def _stream(n: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], dict[str, float]]:
    """``n`` requests of three candidates; every third request's second candidate clicked in time.

    Returns the impressions, the clicks, and the expected click label of every sample id.
    """
    imps, clicks, expected = [], [], {}
    for i in range(n):
        rid = f"r{i}"
        imps.append((rid, impression(rid, T0 + i)))
        for row in range(3):
            expected[f"{rid}/{row}"] = 0.0
        if i % 3 == 0:
            clicks.append((rid, click(rid, T0 + i + 10, 102)))
            expected[f"{rid}/1"] = 1.0
    return imps, clicks, expected


def _heartbeats(bootstrap: str, topics: dict[str, str], ts: float) -> None:
    produce(bootstrap, topics["imp"], [(HEARTBEAT, impression(f"{HEARTBEAT}-{ts}", ts))])
    produce(bootstrap, topics["clicks"], [(HEARTBEAT, click(f"{HEARTBEAT}-{ts}", ts, 1))])


def _run_until(process: JoinProcess, done: threading.Event, timeout_s: float = 60.0) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), kwargs={"until": done.is_set}, daemon=True)
    thread.start()
    thread.join(timeout_s)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


def _messages(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return 0


def _real(samples: list[dict]) -> list[dict]:
    return [s for s in samples if not s["id"].startswith(HEARTBEAT)]


def test_clicks_become_positives_the_rest_negatives_and_offsets_commit(
    kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    imps, clicks, expected = _stream(30)
    produce(bootstrap, topics["imp"], [*imps, ("bad", b"\xc1 not msgpack")])
    produce(bootstrap, topics["clicks"], clicks)
    _heartbeats(bootstrap, topics, T0 + 1000)
    cfg = join_config(bootstrap, redis_url, topics)
    process = JoinProcess(cfg)
    done = threading.Event()
    seen: list[dict] = []

    def finished() -> bool:
        seen[:] = _real(read_output(bootstrap, topics["out"]))
        return len(seen) >= len(expected)

    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(finished, 60, "every candidate labelled")
    finally:
        stop.set()
        thread.join(15)
    done.set()
    assert {s["id"]: s["click"] for s in seen} == expected
    assert len(seen) == len(expected)  # each once
    assert not any(s["late"] for s in seen)
    m = process.metrics
    assert m.samples.labels(task="click", label="positive")._value.get() == 10
    assert m.samples.labels(task="click", label="negative")._value.get() == 80
    assert m.rejected.labels(input="impressions", reason="bad_msgpack")._value.get() == 1
    letters = read_topic(bootstrap, topics["dlq"])
    assert [dict(m.headers)["reason"] for m in letters] == [b"bad_msgpack"]
    # Every input record that was read is committed: nothing is read twice on the next start.
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=topics["group"])
    for topic in (topics["imp"], topics["clicks"]):
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp])[tp]
        assert consumer.committed(tp) == end
    consumer.close()


def test_a_late_click_is_emitted_again_as_a_flagged_positive(
    kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topics["imp"], [("r1", impression("r1", T0))])
    _heartbeats(bootstrap, topics, T0 + 500)
    cfg = join_config(bootstrap, redis_url, topics)
    process = JoinProcess(cfg)
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(_real(read_output(bootstrap, topics["out"]))) == 3, 60, "three negatives")
        produce(bootstrap, topics["clicks"], [("r1", click("r1", T0 + 30, 103))])
        wait_for(lambda: len(_real(read_output(bootstrap, topics["out"]))) == 4, 60, "the correction")
    finally:
        stop.set()
        thread.join(15)
    out = _real(read_output(bootstrap, topics["out"]))
    assert sorted((s["id"], s["click"], s["late"]) for s in out) == [
        ("r1/0", 0.0, False),
        ("r1/1", 0.0, False),
        ("r1/2", 0.0, False),
        ("r1/2", 1.0, True),
    ]
    assert process.metrics.actions.labels(task="click", result="late")._value.get() == 1


def test_kill_9_loses_nothing_and_a_replay_emits_the_same_events(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    imps, clicks, expected = _stream(1500)
    steps = 40  # records per step: the uncommitted tail a kill can repeat is about one step
    doc = join_config_dict(bootstrap, redis_url, topics, max_poll_records=steps)
    config = write_config(tmp_path / "join.yaml", doc)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    log = tmp_path / "join.log"

    def launch() -> subprocess.Popen:
        with log.open("ab") as sink:  # a file, not a pipe: nobody reads the log while it runs
            return subprocess.Popen(
                [sys.executable, "-m", "kelp.cli", "join", "--config", str(config)],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    by_request = dict(clicks)

    def feed(start: int, stop: int) -> None:
        for first in range(start, stop, 50):
            chunk = imps[first : first + 50]
            produce(bootstrap, topics["imp"], chunk)
            produce(bootstrap, topics["clicks"], [(r, by_request[r]) for r, _ in chunk if r in by_request])
            time.sleep(0.1)

    def feed_the_rest() -> None:  # the stream goes on while the joiner is killed and restarted
        feed(50, len(imps))
        _heartbeats(bootstrap, topics, T0 + 5000)

    feeder = threading.Thread(target=feed_the_rest, daemon=True)
    ready = f"http://127.0.0.1:{doc['join']['port']}/readyz"
    first = launch()
    try:
        wait_for(lambda: _status(ready) == 200, 60, "the joiner ready")
        feed(0, 50)
        wait_for(lambda: _messages(bootstrap, topics["out"]) >= 1, 60, "the first output")
        feeder.start()
        wait_for(lambda: _messages(bootstrap, topics["out"]) >= 30, 90, "a first part of the output")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    before = len(_real(read_output(bootstrap, topics["out"])))
    assert feeder.is_alive(), log.read_text()[-3000:]  # killed mid-stream
    second = launch()
    try:
        wait_for(lambda: _status(ready) == 200, 60, "the restarted joiner ready")
        wait_for(
            lambda: {s["id"] for s in _real(read_output(bootstrap, topics["out"]))} >= set(expected),
            120,
            "every candidate labelled after the restart",
        )
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0, log.read_text()[-3000:]
    live = _real(read_output(bootstrap, topics["out"]))
    labels: dict[str, set[float]] = {}
    for s in live:
        labels.setdefault(s["id"], set()).add(s["click"])
    assert {k: v.pop() for k, v in labels.items() if len(v) == 1} == expected  # one label per sample id
    repeats = sum(Counter(s["id"] for s in live).values()) - len(expected)
    assert before < len(expected)
    assert repeats <= 3 * 2 * steps, f"{repeats} repeated sample ids"  # about a step's worth at most

    # A replay of the same input topics (another group, another deployment's state) emits the same events.
    replay_topics = {
        **topics,
        "out": topics["out"] + "-replay",
        "group": topics["group"] + "-replay",
        "deployment": "jt-replay",
    }
    kafka_broker.create_topic(replay_topics["out"])
    process = JoinProcess(join_config(bootstrap, redis_url, replay_topics))
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: len(_real(read_output(bootstrap, replay_topics["out"]))) >= len(expected),
            120,
            "the replay",
        )
    finally:
        stop.set()
        thread.join(15)
    replay = _real(read_output(bootstrap, replay_topics["out"]))
    assert sorted((s["id"], s["click"], s["late"]) for s in replay) == sorted(
        {(s["id"], s["click"], s["late"]) for s in live}
    )


def test_a_redis_that_goes_away_stops_the_joiner_in_one_line_and_loses_nothing(
    kafka_broker: KafkaBroker,
) -> None:
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topics["imp"], [("r1", impression("r1", T0))])
    with RedisServer() as redis_server:
        process = JoinProcess(join_config(bootstrap, redis_server.url, topics))
        failure: list[BaseException] = []

        def run() -> None:
            try:
                process.run(threading.Event())
            except BaseException as exc:  # the test asserts on it
                failure.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_for(lambda: process.metrics.impressions.labels(result="new")._value.get() == 1, 60, "r1 read")
        redis_server.kill()
        produce(bootstrap, topics["clicks"], [("r1", click("r1", T0 + 1, 101))])
        thread.join(60)
    assert not thread.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], StoreUnavailableError), failure
    assert "the waiting store" in str(failure[0])
    # The click's step failed before its commit: the group reads it again on the next start.
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=topics["group"])
    try:
        assert consumer.committed(TopicPartition(topics["clicks"], 0)) in (None, 0)
    finally:
        consumer.close()


def test_a_click_read_before_its_impression_waits_for_it(kafka_broker: KafkaBroker, redis_url: str) -> None:
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topics["clicks"], [("r1", click("r1", T0 + 2, 102))])
    process = JoinProcess(join_config(bootstrap, redis_url, topics, action_grace_s=30))
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        waiting = process.metrics.actions.labels(task="click", result="waiting")
        wait_for(lambda: waiting._value.get() == 1, 60, "the click waiting")
        produce(bootstrap, topics["imp"], [("r1", impression("r1", T0))])
        wait_for(lambda: len(_real(read_output(bootstrap, topics["out"]))) == 1, 60, "the positive")
    finally:
        stop.set()
        thread.join(15)
    assert [(s["id"], s["click"]) for s in _real(read_output(bootstrap, topics["out"]))] == [("r1/1", 1.0)]
    assert process.metrics.actions.labels(task="click", result="early")._value.get() == 1


# -- hostile inputs ---------------------------------------------------------------------------------

FAR_FUTURE = 4_102_444_800.0  # 2100-01-01


def _letters(bootstrap: str, topic: str) -> list[Any]:
    return read_topic(bootstrap, topic)


def _count(metric: Any) -> float:
    return float(metric._value.get())


def test_far_future_and_non_finite_times_are_dead_lettered_and_real_clicks_still_join(
    kafka_broker: KafkaBroker, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A click dated 2100 while the impressions are idle, and impressions timed inf and NaN: none may
    crash the joiner, move (and store) its watermark, or make the real click that follows an orphan."""
    caplog.set_level(logging.WARNING, logger="kelp.join")
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    produce(
        bootstrap,
        topics["imp"],
        [("rinf", impression("rinf", math.inf)), ("rnan", impression("rnan", math.nan))],
    )
    # Following the wall clock while every partition is idle is the signal that the impressions'
    # partition is idle: from then on a click partition that is read holds the watermark alone.
    config = join_config(bootstrap, redis_url, topics, idle_partition_s=1, advance_when_idle=True)
    process = JoinProcess(config)
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    rejected = process.metrics.rejected
    try:
        wait_for(
            lambda: _count(rejected.labels(input="impressions", reason="bad_type")) == 2, 60, "bad times"
        )
        wait_for(lambda: _count(process.metrics.watermark) > 0, 60, "the watermark following the clock")
        produce(bootstrap, topics["clicks"], [("ghost", click("ghost", FAR_FUTURE, 101))])
        wait_for(
            lambda: _count(rejected.labels(input="actions", reason="future_ts")) == 1, 60, "the future click"
        )
        # Counted after the step that read the click applied its state: a watermark taken from the
        # click (the only partition holding it then) would be 2100 now, in memory and in Redis.
        assert 0 < _count(process.metrics.watermark) < time.time() + 300
        stored = redis.Redis.from_url(redis_url).get("{kelp:jt:join}:wm")
        assert stored is not None and float(stored) < time.time() + 300
        now = time.time()  # windows close a minute of wall clock from now: after the test
        produce(bootstrap, topics["imp"], [("r1", impression("r1", now))])
        produce(bootstrap, topics["clicks"], [("r1", click("r1", now + 1, 102))])
        wait_for(lambda: len(read_output(bootstrap, topics["out"])) >= 1, 60, "the positive")
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(15)
    assert [(s["id"], s["click"]) for s in read_output(bootstrap, topics["out"])] == [("r1/1", 1.0)]
    matched = process.metrics.actions.labels(task="click", result="matched")
    assert _count(matched) == 1
    stored = redis.Redis.from_url(redis_url).get("{kelp:jt:join}:wm")
    assert stored is not None and float(stored) < time.time() + 300
    reasons = sorted(dict(m.headers)["reason"] for m in _letters(bootstrap, topics["dlq"]))
    assert reasons == [b"bad_type", b"bad_type", b"future_ts"]
    # The waiting state shares the store's Redis here: said once at start, the URL redacted.
    shared = [r.getMessage() for r in caplog.records if "join.redis_url is not set" in r.getMessage()]
    assert len(shared) == 1 and "maxmemory-policy" in shared[0]


def test_an_output_the_topic_refuses_for_good_is_dead_lettered_and_the_join_goes_on(
    kafka_broker: KafkaBroker, redis_url: str
) -> None:
    """An event larger than the output topic's max.message.bytes, and request ids past the shared
    rule: dead letters (too large for the dead-letter topic too: without their value), never a
    step retried forever."""
    tag = uuid.uuid4().hex[:8]
    topics = {k: f"join-{k}-{tag}" for k in ("imp", "clicks", "out", "dlq")}
    # Below the joiner's batches: a refused batch is split by the client, so only rbig is refused.
    limits = {"out": "20000", "dlq": "100000"}
    for k, name in topics.items():
        kafka_broker.create_topic(name, config={"max.message.bytes": limits[k]} if k in limits else None)
    topics["group"] = f"join-{tag}"
    bootstrap = kafka_broker.bootstrap
    big = impression("rbig", T0, items=list(range(1, 1001)))  # 1000 candidates: a ~45 KB event
    huge_id = "h" * 400_000
    produce(
        bootstrap,
        topics["imp"],
        [("rbig", big), ("r2", impression("r2", T0 + 1)), ("h", impression(huge_id, T0 + 1))],
    )
    produce(
        bootstrap, topics["clicks"], [("r2", click("r2", T0 + 2, 102)), ("h", click(huge_id, T0 + 2, 101))]
    )
    _heartbeats(bootstrap, topics, T0 + 1000)
    process = JoinProcess(join_config(bootstrap, redis_url, topics))
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    rejected = process.metrics.rejected
    try:
        wait_for(lambda: len(_real(read_output(bootstrap, topics["out"]))) >= 3, 90, "r2 labelled")
        wait_for(
            lambda: _count(rejected.labels(input="impressions", reason="output_too_large")) == 1,
            30,
            "the dlq",
        )
    finally:
        stop.set()
        thread.join(15)
    assert sorted((s["id"], s["click"]) for s in _real(read_output(bootstrap, topics["out"]))) == [
        ("r2/0", 0.0),
        ("r2/1", 1.0),
        ("r2/2", 0.0),
    ]
    assert _count(process.metrics.send_failures) == 0
    assert _count(rejected.labels(input="impressions", reason="bad_request_id")) == 1
    assert _count(rejected.labels(input="actions", reason="bad_request_id")) == 1
    letters = {dict(m.headers)["reason"]: m for m in _letters(bootstrap, topics["dlq"]) if b"rbig" in m.value}
    assert letters[b"output_too_large"].value == big
    assert b"MessageSizeTooLargeError" in dict(letters[b"output_too_large"].headers)["error"]
    too_big = [
        m for m in _letters(bootstrap, topics["dlq"]) if dict(m.headers)["reason"] == b"bad_request_id"
    ]
    assert len(too_big) == 2 and all(m.value == b"" and "value_omitted" in dict(m.headers) for m in too_big)
    keys = redis.Redis.from_url(redis_url).keys("*")
    assert keys and max(len(k) for k in keys) < 200  # nothing stored for the 400,000-character id
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=topics["group"])
    try:
        for topic in (topics["imp"], topics["clicks"]):
            tp = TopicPartition(topic, 0)
            assert consumer.committed(tp) == consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def test_corrupt_join_state_is_dropped_counted_and_the_join_goes_on(
    kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topics = _topics(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    client = redis.Redis.from_url(redis_url)
    tag = "{kelp:jt:join}"
    client.set(tag + ":i:r1", b"\xc1 corrupt")
    client.zadd(tag + ":due", {"r1": T0 + 60})
    client.set(tag + ":a:r2", b"\xc1 corrupt")
    client.zadd(tag + ":early", {"r2": T0 + 60})
    produce(bootstrap, topics["imp"], [("r1", impression("r1", T0)), ("r3", impression("r3", T0))])
    produce(bootstrap, topics["clicks"], [("r3", click("r3", T0 + 1, 101)), ("r2", click("r2", T0 + 2, 101))])
    _heartbeats(bootstrap, topics, T0 + 1000)
    process = JoinProcess(join_config(bootstrap, redis_url, topics))
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(_real(read_output(bootstrap, topics["out"]))) >= 6, 90, "r1 and r3 labelled")
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive()
    out = sorted((s["id"], s["click"]) for s in _real(read_output(bootstrap, topics["out"])))
    assert out == [("r1/0", 0.0), ("r1/1", 0.0), ("r1/2", 0.0), ("r3/0", 1.0), ("r3/1", 0.0), ("r3/2", 0.0)]
    corrupt = process.metrics.state_corrupt
    assert (
        _count(corrupt.labels(kind="impression")) == 1 and _count(corrupt.labels(kind="early_actions")) == 1
    )
    assert client.get(tag + ":i:r1") != b"\xc1 corrupt" and client.get(tag + ":a:r2") is None


def test_a_stored_watermark_past_the_wall_clock_is_reported_at_start(
    kafka_broker: KafkaBroker, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A watermark a pre-fix joiner stored from a far-future time: the operator is told how to repair it."""
    caplog.set_level(logging.WARNING, logger="kelp.join")
    topics = _topics(kafka_broker)
    redis.Redis.from_url(redis_url).set("{kelp:jt:join}:wm", repr(FAR_FUTURE))
    process = JoinProcess(join_config(kafka_broker.bootstrap, redis_url, topics))
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: process.ready, 60, "the joiner ready")
    finally:
        stop.set()
        thread.join(15)
    said = [r.getMessage() for r in caplog.records if "stored watermark" in r.getMessage()]
    assert len(said) == 1 and "past the wall clock" in said[0] and "docs/join.md" in said[0]


def test_a_watermark_key_of_another_type_is_dropped_counted_and_the_joiner_starts(
    kafka_broker: KafkaBroker, redis_url: str
) -> None:
    """GET on a list answers WRONGTYPE while the joiner opens: quarantined like a value that is not a
    time, never a traceback at every start."""
    topics = _topics(kafka_broker)
    client = redis.Redis.from_url(redis_url)
    client.rpush("{kelp:jt:join}:wm", b"1700000000.0")
    process = JoinProcess(join_config(kafka_broker.bootstrap, redis_url, topics))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            process.run(stop)
        except BaseException as exc:  # the test asserts on it
            failure.append(exc)

    stop = threading.Event()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    corrupt = process.metrics.state_corrupt.labels(kind="watermark")
    try:
        wait_for(lambda: _count(corrupt) == 1 or failure, 60, "the watermark dropped")
    finally:
        stop.set()
        thread.join(15)
    assert failure == [] and process.ready
    assert _count(corrupt) == 1 and client.type("{kelp:jt:join}:wm") in (b"none", b"string")


def test_an_output_refused_for_good_without_a_dead_letter_topic_is_dropped_with_an_error(
    kafka_broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """No dead-letter topic: the event the output topic refuses is counted and the step commits past
    it, so the line that says a labelled event is gone is an ERROR."""
    from kafka import KafkaProducer

    tag = uuid.uuid4().hex[:8]
    topics = {k: f"join-{k}-{tag}" for k in ("imp", "clicks", "out", "dlq")}
    kafka_broker.create_topic(topics["out"], config={"max.message.bytes": "20000"})
    cfg = join_config(kafka_broker.bootstrap, "redis://127.0.0.1:1", topics, dead_letter_topic=None)
    # The joiner's own producer settings: not idempotent, requests larger than any topic allows.
    producer = KafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap,
        acks="all",
        enable_idempotence=False,
        max_request_size=16 << 20,
    )
    try:
        process = JoinProcess(cfg, consumer=object(), producer=producer)
        big = b"x" * 30_000
        out = Output(b"r1", big, 1, {"click": np.ones(1, np.float32)}, False, T0, source=b"impression")
        step = Step(outputs=[out])
        caplog.set_level(logging.WARNING, logger="kelp.join")
        assert process._deliver(step, threading.Event())
    finally:
        producer.close(timeout=5)
    assert step.outputs == [] and [r.reason for r in step.rejected] == ["output_too_large"]
    said = [r for r in caplog.records if "r1" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.ERROR] and "dead_letter_topic" in said[0].getMessage()
