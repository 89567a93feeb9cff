"""``kelp bench join``: labelled samples/s through ``kelp join`` vs a raw consume, state bytes, label delay.

Starts a broker (Apache Kafka by default, ``--broker tansu`` for Tansu) and
redis-server. The workload is the serving request log of criteo-synth
requests: ``CANDIDATES`` candidates each (13 dense, 26 sparse features, as
``serving.request_log`` writes them), the candidate named by its ``C2`` id;
each candidate whose criteo-synth label is 1 is clicked with probability
``CLICK_SHARE`` (about 5% of candidates), some seconds after the request.

Two phases:

* **throughput** (a replay): every impression and click is produced first,
  then a heartbeat far ahead in event time. Measured, alternating ``REPS``
  times on the same topics: the baseline, a plain kafka-python consume of
  both input topics with no decoding (one fresh consumer per run), and
  :class:`~kelp.join.process.JoinProcess` with a fresh group and fresh
  Redis state, from its first step to the step that emitted the last
  candidate. Both rates count candidates (``samples``), so ``ratio`` is
  joined samples/s over raw-consumed samples/s. After the last Kelp run,
  ``redis_bytes_per_waiting_impression`` is redis-server's ``used_memory``
  growth over the impressions it still keeps (they stay ``late_horizon_s``
  after their windows close), and ``impression_record_bytes`` the mean
  request-log record for comparison.
* **label delay** (live): requests at a steady rate with event time = wall
  time, clicks ``0..CLICK_DELAY_S`` later, a ``LIVE_WINDOW_S`` window. Per
  emitted candidate: the output record's timestamp (the joiner's send)
  minus when its label could first be known (the click, or the window's
  close). ``label_delay_p50_s`` / ``label_delay_p99_s`` over all, and
  per kind.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

import msgpack
import numpy as np
import orjson
from kafka import KafkaConsumer, KafkaProducer

from kelp.bench.runner import progress
from kelp.bench.synth import CriteoSynth
from kelp.config import KelpConfig, parse_config
from kelp.consumers.codec import encode_request_record
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES
from kelp.harness import RedisServer, make_broker
from kelp.harness.topic_reader import assign_from_beginning, read_topic
from kelp.join import JoinProcess, RedisWaitingStore

__all__ = ["run"]

CANDIDATES = 100
CLICK_SHARE = 0.2
ITEM_FEATURE = "C2"
WINDOW_S = 60.0
LIVE_WINDOW_S = 2.0
CLICK_DELAY_S = 1.5
REPS = 3
T0 = 1_700_000_000.0
RAW_FETCH_MAX_BYTES = 52_428_800
RAW_PARTITION_FETCH_BYTES = 8_388_608
"""The fetch sizes of both the raw consume and the joiner's consumer, so both read alike."""


class _Requests:
    """criteo-synth requests as the request log writes them, with the clicks each one gets."""

    def __init__(self, seed: int) -> None:
        self._synth = CriteoSynth(seed=seed)
        self._rng = np.random.default_rng(seed + 1)
        self._item = SPARSE_NAMES.index(ITEM_FEATURE)
        self._ones = np.ones(CANDIDATES, dtype=np.int32)

    def make(self, rid: str, ts: float) -> tuple[bytes, list[tuple[int, float]]]:
        """The record of request ``rid`` at ``ts``, and its clicks as ``(item, click ts)``."""
        cols = self._synth.batch(CANDIDATES)
        record = encode_request_record(
            request_id=rid,
            model_version=1,
            ts=ts,
            dense=cols.dense.astype(np.float32),
            sparse={name: (cols.sparse[:, j], self._ones) for j, name in enumerate(SPARSE_NAMES)},
            scores={"label": self._rng.random(CANDIDATES).astype(np.float32)},
        )
        clicked = np.flatnonzero((cols.label > 0) & (self._rng.random(CANDIDATES) < CLICK_SHARE))
        delays = self._rng.uniform(0.1, CLICK_DELAY_S, size=len(clicked))
        return record, [
            (int(cols.sparse[r, self._item]), ts + float(d)) for r, d in zip(clicked, delays, strict=True)
        ]


def _requests(
    n: int, seed: int, t0: float, spacing_s: float
) -> list[tuple[str, float, bytes, list[tuple[int, float]]]]:
    """``(request id, ts, record, clicks)`` for ``n`` requests ``spacing_s`` apart in event time."""
    maker = _Requests(seed)
    out = []
    for i in range(n):
        rid, ts = f"q{seed}-{i}", t0 + i * spacing_s
        record, clicks = maker.make(rid, ts)
        out.append((rid, ts, record, clicks))
    return out


def _config(bootstrap: str, redis_url: str, topics: dict[str, str], **join: Any) -> KelpConfig:
    return parse_config(
        {
            "deployment": topics["deployment"],
            "features": {
                "dense": [{"name": n} for n in DENSE_NAMES],
                "sparse": [{"name": n} for n in SPARSE_NAMES],
            },
            "source": {
                "kind": "kafka",
                "bootstrap_servers": [bootstrap],
                "topics": [topics["out"]],
                # The raw consume's fetch sizes: a request-log record is tens of KB, so the default
                # 1 MB per partition would cut the joiner's steps to a few dozen requests each.
                "fetch_max_bytes": RAW_FETCH_MAX_BYTES,
                "max_partition_fetch_bytes": RAW_PARTITION_FETCH_BYTES,
            },
            "store": {"backend": "redis", "urls": [redis_url]},
            "publisher": {"enabled": False},
            "join": {
                "impressions_topic": topics["imp"],
                "actions": [
                    {"topic": topics["clicks"], "task": "label", "window_s": WINDOW_S, "item_field": "item"}
                ],
                "item_feature": ITEM_FEATURE,
                "group_id": topics["group"],
                "dead_letter_topic": None,
                **join,
            },
        },
        origin="bench join",
    )


def _produce(bootstrap: str, imp_topic: str, click_topic: str, requests: list[Any]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_request_size=8 << 20)
    try:
        for rid, _ts, record, clicks in requests:
            producer.send(imp_topic, key=rid.encode(), value=record)
            for item, cts in clicks:
                producer.send(
                    click_topic,
                    key=rid.encode(),
                    value=orjson.dumps({"request_id": rid, "item": item, "ts": cts}),
                )
        producer.flush(120)
    finally:
        producer.close()


RAW_READS = 3
"""Raw reads per run, their median taken: one read is a fraction of a second here, and a pause
of the client or the broker inside it (seen in about one read of four) would set the floor alone."""


def _raw_consume(bootstrap: str, topics: list[str], records: int) -> float:
    """Seconds for a plain consumer to read ``records`` records of ``topics``, from its first record.

    It is assigned every partition itself, with no group to form or rebalance, and its broker
    answers every fetch at once (below): a read is a fraction of a second here, and either
    pause inside it set the floor by itself, several times lower in some runs than in others.
    """
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_bytes=RAW_FETCH_MAX_BYTES,
        max_partition_fetch_bytes=RAW_PARTITION_FETCH_BYTES,
        # The client has one fetch in flight per broker, covering the partitions it has nothing
        # buffered for; once the small clicks topic is read up, that fetch would wait at the broker
        # (500 ms by default) while the impressions' backlog queues behind it, a pause longer than
        # the whole read. The floor is how fast the records can come, so the broker never waits.
        fetch_max_wait_ms=0,
    )
    got, start = 0, None
    try:
        assign_from_beginning(consumer, topics)
        while got < records:
            polled = consumer.poll(timeout_ms=1000, max_records=2000)
            n = sum(len(v) for v in polled.values())
            if n and start is None:
                start = time.perf_counter()
            got += n
        return time.perf_counter() - start if start is not None else float("nan")
    finally:
        consumer.close()


def _kelp_join(cfg: KelpConfig, samples: int) -> tuple[float, JoinProcess]:
    """Seconds from the joiner's first step with records until it emitted ``samples`` candidates."""
    process = JoinProcess(cfg)
    started: list[float] = []
    stop = threading.Event()

    def done() -> bool:
        step = process.last_step
        if step is not None and (step.outputs or step.impressions) and not started:
            started.append(time.perf_counter())
        return process.samples_emitted >= samples

    process.run(stop, until=done)
    return time.perf_counter() - started[0], process


def _topics(service: Any, label: str) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    topics = {
        "imp": f"join-imp-{label}-{tag}",
        "clicks": f"join-clicks-{label}-{tag}",
        "out": f"join-out-{label}-{tag}",
    }
    for name in topics.values():
        service.create_topic(name)
    topics["group"] = f"bench-join-{tag}"
    topics["deployment"] = f"bench-{tag}"
    return topics


def _throughput(service: Any, redis: RedisServer, quick: bool) -> dict[str, Any]:
    n = 1000 if quick else 4000
    requests = _requests(n, seed=0, t0=T0, spacing_s=0.5)
    clicks = sum(len(c) for *_, c in requests)
    topics = _topics(service, "replay")
    progress(f"producing {n:,} requests of {CANDIDATES} candidates and {clicks:,} clicks")
    _produce(service.bootstrap, topics["imp"], topics["clicks"], requests)
    heartbeat = T0 + n * 0.5 + 10 * WINDOW_S
    hb = _requests(1, seed=99, t0=heartbeat, spacing_s=0)
    _produce(
        service.bootstrap,
        topics["imp"],
        topics["clicks"],
        [(hb[0][0], heartbeat, hb[0][2], [(1, heartbeat)])],
    )
    samples = n * CANDIDATES
    records = n + clicks + 2
    raw_s, kelp_s = [], []
    client = redis.client()
    process = None
    for rep in range(REPS):
        progress(f"run {rep + 1}/{REPS}: raw consume of {records:,} records")
        raw_s.append(
            statistics.median(
                _raw_consume(service.bootstrap, [topics["imp"], topics["clicks"]], records)
                for _ in range(RAW_READS)
            )
        )
        client.flushall()
        used_before = int(client.info("memory")["used_memory"])
        cfg = _config(
            service.bootstrap,
            redis.url,
            {**topics, "group": f"{topics['group']}-{rep}"},
            advance_when_idle=False,
            allowed_lateness_s=0,
        )
        progress(f"run {rep + 1}/{REPS}: kelp join")
        seconds, process = _kelp_join(cfg, samples)
        kelp_s.append(seconds)
    assert process is not None
    waiting, stored, _early = RedisWaitingStore(client, process.cfg.deployment).counts()
    used_after = int(client.info("memory")["used_memory"])
    raw_rates = [samples / s for s in raw_s]
    kelp_rates = [samples / s for s in kelp_s]
    return {
        "requests": n,
        "candidates_per_request": CANDIDATES,
        "clicks": clicks,
        "joined_samples_per_s": round(statistics.median(kelp_rates), 1),
        "raw_consume_samples_per_s": round(statistics.median(raw_rates), 1),
        "ratio": round(statistics.median(k / r for k, r in zip(kelp_rates, raw_rates, strict=True)), 3),
        "redis_bytes_per_waiting_impression": round((used_after - used_before) / max(waiting, 1)),
        "packed_bytes_per_waiting_impression": round(stored / max(waiting, 1)),
        "impression_record_bytes": round(statistics.mean(len(r[2]) for r in requests)),
        "waiting_impressions": waiting,
        "runs": [[round(r, 1), round(k, 1)] for r, k in zip(raw_rates, kelp_rates, strict=True)],
    }


def _live_delay(service: Any, redis: RedisServer, quick: bool) -> dict[str, Any]:
    seconds = 10.0 if quick else 60.0
    rate = 20.0  # requests per second
    topics = _topics(service, "live")
    cfg = _config(
        service.bootstrap,
        redis.url,
        topics,
        advance_when_idle=True,
        allowed_lateness_s=0.5,
        idle_partition_s=1.0,
        actions=[
            {"topic": topics["clicks"], "task": "label", "window_s": LIVE_WINDOW_S, "item_field": "item"}
        ],
    )
    process = JoinProcess(cfg)
    stop = threading.Event()
    joiner = threading.Thread(target=process.run, args=(stop,), daemon=True)
    joiner.start()
    producer = KafkaProducer(bootstrap_servers=service.bootstrap, linger_ms=0, max_request_size=8 << 20)
    known: dict[str, float] = {}
    progress(f"live: {rate:g} requests/s for {seconds:g}s, window {LIVE_WINDOW_S:g}s")
    try:
        time.sleep(3.0)  # the joiner's group join
        pending: list[tuple[float, str, int]] = []
        maker = _Requests(seed=1000)
        start = time.time()
        i = 0
        while time.time() - start < seconds:
            now = time.time()
            while i < (now - start) * rate:
                rid, ts = f"live-{i}", time.time()
                record, clicks = maker.make(rid, ts)
                producer.send(topics["imp"], key=rid.encode(), value=record)
                for item, cts in clicks:
                    pending.append((cts, rid, item))
                known[rid] = ts + LIVE_WINDOW_S
                i += 1
            pending.sort()
            while pending and pending[0][0] <= time.time():
                cts, rid, item = pending.pop(0)
                producer.send(
                    topics["clicks"],
                    key=rid.encode(),
                    value=orjson.dumps({"request_id": rid, "item": item, "ts": cts}),
                )
                known[f"{rid}#{item}"] = cts
            time.sleep(0.005)
        producer.flush(30)
        time.sleep(LIVE_WINDOW_S + 3.0)  # the last windows close
    finally:
        producer.close()
        stop.set()
        joiner.join(30)
    delays: dict[str, list[float]] = {"positive": [], "negative": []}
    for message in read_topic(service.bootstrap, topics["out"]):  # the joiner stopped: the topic is whole
        msg = msgpack.unpackb(message.value)
        sent = message.timestamp / 1000.0
        labels = np.frombuffer(msg["labels"]["label"], "<f4")
        items = (
            np.frombuffer(msg["sparse"][ITEM_FEATURE], "<u8")
            if isinstance(msg["sparse"][ITEM_FEATURE], bytes)
            else np.frombuffer(msg["sparse"][ITEM_FEATURE]["values"], "<u8")
        )
        rid = msg["request"]["id"]
        for label, item in zip(labels, items, strict=True):
            if label > 0:
                delays["positive"].append(sent - known[f"{rid}#{int(item)}"])
            else:
                delays["negative"].append(sent - known[rid])
    every = delays["positive"] + delays["negative"]
    out: dict[str, Any] = {"live_requests": i, "live_window_s": LIVE_WINDOW_S}
    out["label_delay_p50_s"] = round(float(np.percentile(every, 50)), 3) if every else float("nan")
    out["label_delay_p99_s"] = round(float(np.percentile(every, 99)), 3) if every else float("nan")
    for kind, values in delays.items():
        if values:
            out[f"label_delay_{kind}_p50_s"] = round(float(np.percentile(values, 50)), 3)
            out[f"label_delay_{kind}_p99_s"] = round(float(np.percentile(values, 99)), 3)
    return out


def run(quick: bool, broker: str | None = None) -> dict[str, Any]:
    service = make_broker(broker)
    progress(f"starting {service.label} and redis-server")
    out: dict[str, Any] = {
        "workload": "criteo-synth requests (synthetic)",
        "broker": service.label,
        "reps": REPS,
    }
    with service, RedisServer() as redis:
        out.update(_throughput(service, redis, quick))
        out.update(_live_delay(service, redis, quick))
    return out
