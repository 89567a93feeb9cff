"""The chaos bench's steady load: a criteo-synth producer into Kafka and a scoring client on the replica.

:class:`SteadyProducer` sends columnar criteo-synth messages (as ``kelp
produce --synth criteo`` writes them) at a fixed rate, round robin over the
partitions, and remembers the offset of every record the broker
acknowledged: "produced" means acknowledged, the set the lost-record check
accounts for. A send that fails after the producer's retries (the broker was
down too long) was never acknowledged and is counted apart.

:class:`ScoreClient` sends ``POST /v1/score/candidates`` at a fixed rate with a
client timeout and counts every answer by status; a timeout is a *hang*, a
refused or reset connection a *transport error*. Latencies are kept with
their send time, so windows (the soak's start and end) can be cut afterwards.

:class:`ClickLoad` is the joiner's load: impressions (request-log records of
``CANDIDATES`` candidates, event time = wall time) to the joiner's
impressions topic at a steady rate, and for about half of them one click on
one candidate, a few seconds later (event time = the wall clock when it is
sent, well inside the window). A click is sent only once its impression was
acknowledged, and it becomes a *true click* once the click itself was
acknowledged: the set the joiner must label positive, whatever the faults
did. The impressions can be paused (:meth:`ClickLoad.paused`), which lets the
impressions partition go idle while clicks go on.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from kelp.bench.synth import CriteoSynth
from kelp.consumers.codec import encode_columns, encode_request_record
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES
from kelp.join.records import sample_id

__all__ = [
    "CANDIDATES",
    "CLICK_DELAY_S",
    "ClickLoad",
    "ScoreClient",
    "SteadyProducer",
    "click_record",
    "impression_record",
    "score_request",
    "send_now",
]

PER_MESSAGE = 64


class SteadyProducer(threading.Thread):
    """``rate`` samples/s into ``topic`` until :meth:`finish`; ``acked[p]``: partition p's acked offsets.

    ``acks``: the producer's ``acks`` (``"all"`` on a replicated cluster: acknowledged means in
    every in-sync replica, so a leader's death loses nothing acknowledged).
    """

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, rate: float, seed: int = 7, *, acks: int | str = 1
    ) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.acks = acks
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.seed = seed
        self.acked: list[set[int]] = [set() for _ in range(partitions)]
        self.failed = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaProducer

        try:
            producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks=self.acks,
                linger_ms=5,
                retries=1_000,
                retry_backoff_ms=200,
                request_timeout_ms=5_000,
                reconnect_backoff_max_ms=1_000,  # as a Java producer: back within a second of the broker
                delivery_timeout_ms=120_000,
                max_block_ms=60_000,
            )
        except BaseException as exc:  # reported by the bench, which then stops
            self.error = exc
            return
        synth = CriteoSynth(seed=self.seed)
        period = PER_MESSAGE / self.rate
        next_at = time.monotonic()
        try:
            while not self._halt.is_set():
                cols = synth.batch(PER_MESSAGE)
                value = encode_columns(
                    cols.label,
                    cols.dense,
                    {name: cols.sparse[:, i] for i, name in enumerate(SPARSE_NAMES)},
                    cols.ts,
                )
                partition = self.sent % self.partitions
                future = producer.send(self.topic, value, partition=partition)
                future.add_callback(self._acked)
                future.add_errback(self._failed)
                self.sent += 1
                next_at += period
                time.sleep(max(0.0, next_at - time.monotonic()))
            producer.flush(timeout=120)
        except BaseException as exc:
            self.error = exc
        finally:
            producer.close(timeout=10)

    def _acked(self, metadata: Any) -> None:
        with self._lock:
            self.acked[metadata.partition].add(int(metadata.offset))

    def _failed(self, _exc: BaseException) -> None:
        with self._lock:
            self.failed += 1

    def acked_records(self) -> int:
        with self._lock:
            return sum(len(s) for s in self.acked)

    def acked_end(self) -> list[int]:
        """Per partition: one past the highest acknowledged offset (0: nothing acknowledged)."""
        with self._lock:
            return [max(s) + 1 if s else 0 for s in self.acked]

    def finish(self, timeout_s: float = 150.0) -> None:
        """Stop sending, wait for the outstanding acknowledgements."""
        self._halt.set()
        self.join(timeout_s)


def score_request(candidates: int = 20, seed: int = 3) -> bytes:
    """One ``/v1/score/candidates`` body on criteo-synth features: a user (C1..C13, I1..I13) and items."""
    synth = CriteoSynth(seed=seed)
    user, items = synth.batch(1), synth.batch(candidates)
    body = {
        "user": {
            "dense": dict(zip(DENSE_NAMES, user.dense[0].tolist(), strict=True)),
            "sparse": {f: int(user.sparse[0, i]) for i, f in enumerate(SPARSE_NAMES[:13])},
        },
        "candidates": [
            {"sparse": {f: int(items.sparse[k, 13 + i]) for i, f in enumerate(SPARSE_NAMES[13:])}}
            for k in range(candidates)
        ],
    }
    return json.dumps(body).encode()


def _all_scores_finite(answer: bytes) -> bool:
    """Every score of a ``/v1/score`` answer is a number (JSON has no NaN: a non-finite one reads as null)."""
    try:
        scores = json.loads(answer).get("scores")
    except ValueError:
        return False
    flat = [x for row in scores for x in (row if isinstance(row, list) else [row])] if scores else []
    return bool(flat) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in flat)


class ScoreClient(threading.Thread):
    """``rate`` requests/s to ``host:port`` until :meth:`finish`; a reply later than ``timeout_s`` hangs.

    ``statuses`` counts answers by HTTP status (0: transport error, -1: hang);
    ``samples`` holds ``(sent at, status, seconds)`` for every request;
    ``nonfinite_scores`` counts answers 200 holding a null (JSON's non-finite) or missing score.
    """

    HANG = -1
    TRANSPORT = 0

    def __init__(self, port: int, rate: float, timeout_s: float, host: str = "127.0.0.1") -> None:
        super().__init__(name="chaos-score-client", daemon=True)
        self.host = host
        self.port = port
        self.rate = rate
        self.timeout_s = timeout_s
        self.body = score_request()
        self.statuses: Counter[int] = Counter()
        self.nonfinite_scores = 0
        self.samples: list[tuple[float, int, float]] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        period = 1.0 / self.rate
        next_at = time.monotonic()
        headers = {"Content-Type": "application/json"}
        while not self._halt.is_set():
            started = time.monotonic()
            status = self.TRANSPORT
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                conn.request("POST", "/v1/score/candidates", body=self.body, headers=headers)
                resp = conn.getresponse()
                answer = resp.read()
                status = resp.status
                if status == 200 and not _all_scores_finite(answer):
                    with self._lock:
                        self.nonfinite_scores += 1
            except TimeoutError:
                status = self.HANG
            except (OSError, http.client.HTTPException):
                status = self.TRANSPORT
            if status <= 0 and conn is not None:
                conn.close()
                conn = None
            with self._lock:
                self.statuses[status] += 1
                self.samples.append((started, status, time.monotonic() - started))
            next_at = max(next_at + period, time.monotonic())
            self._halt.wait(max(0.0, next_at - time.monotonic()))
        if conn is not None:
            conn.close()

    def counts(self) -> Counter[int]:
        with self._lock:
            return Counter(self.statuses)

    def p99_ms(self, since: float, until: float) -> float | None:
        """p99 latency (ms) of the answered-200 requests sent in [since, until)."""
        with self._lock:
            lat = [s for t, st, s in self.samples if since <= t < until and st == 200]
        return round(float(np.percentile(lat, 99)) * 1e3, 2) if lat else None

    def finish(self) -> None:
        self._halt.set()
        self.join(self.timeout_s + 5)


CANDIDATES = 8
CLICK_SHARE = 0.5
CLICK_DELAY_S = (1.0, 3.0)
"""A click comes this long (uniform) after its impression: well inside the window, yet a few steps later."""


def impression_record(request_id: str, ts: float, items: np.ndarray) -> bytes:
    """A request-log record of ``items`` (one candidate each) at event time ``ts``, as a replica writes it.

    ``ts`` is packed as given, so a NaN or an infinity is what a hostile producer would send.
    """
    n = len(items)
    return encode_request_record(
        request_id=request_id,
        model_version=1,
        ts=ts,
        dense=np.full((n, 1), 2.5, dtype=np.float32),
        sparse={
            "user": (np.full(n, 7, dtype=np.uint64), np.ones(n, dtype=np.int32)),
            "item": (items.astype(np.uint64), np.ones(n, dtype=np.int32)),
        },
        scores={"click": np.full(n, 0.5, dtype=np.float32)},
    )


def click_record(request_id: str, item: int, ts: float) -> bytes:
    """One click action, as the app would send it (JSON, the request id, the item, event time)."""
    return orjson.dumps({"request_id": request_id, "item": item, "ts": ts})


def _producer(bootstrap: str) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=5,
        retries=1_000,
        retry_backoff_ms=200,
        request_timeout_ms=5_000,
        reconnect_backoff_max_ms=1_000,  # back within a second of a restarted broker
        delivery_timeout_ms=120_000,
        max_block_ms=60_000,
    )


def send_now(bootstrap: str, topic: str, key: str, value: bytes, timeout_s: float = 60.0) -> None:
    """Send one record and wait for its acknowledgement (a fault's hostile record)."""
    producer = _producer(bootstrap)
    try:
        producer.send(topic, key=key.encode(), value=value).get(timeout=timeout_s)
    finally:
        producer.close(timeout=10)


@dataclass(order=True)
class _PendingClick:
    due: float
    request_id: str = field(compare=False)
    row: int = field(compare=False)
    item: int = field(compare=False)
    impression: Any = field(compare=False)
    """The impression's send future: its click goes out only once the impression was acknowledged."""


class ClickLoad(threading.Thread):
    """``rate`` impressions/s and their clicks until :meth:`finish`; see the module docstring.

    ``true_clicks``: sample id -> wall time the click was acknowledged.
    """

    def __init__(
        self, bootstrap: str, impressions_topic: str, clicks_topic: str, rate: float, seed: int = 5
    ) -> None:
        super().__init__(name="chaos-click-load", daemon=True)
        self.bootstrap = bootstrap
        self.impressions_topic = impressions_topic
        self.clicks_topic = clicks_topic
        self.rate = rate
        self.true_clicks: dict[str, float] = {}
        self.impressions_sent = 0
        self.impressions_acked = 0
        self.impressions_failed = 0
        self.clicks_failed = 0
        self.error: BaseException | None = None
        self._rng = random.Random(seed)
        self._tag = f"{seed}-{int(time.time())}"
        self._pending: list[_PendingClick] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._pause = threading.Event()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No impression inside the block (the clicks already owed still go out)."""
        self._pause.set()
        try:
            yield
        finally:
            self._pause.clear()

    def run(self) -> None:
        try:
            producer = _producer(self.bootstrap)
        except BaseException as exc:  # reported by the bench
            self.error = exc
            return
        try:
            self._loop(producer)
            producer.flush(timeout=120)
            self._send_due(producer, everything=True)  # impressions acked by the flush still owe clicks
            producer.flush(timeout=120)
        except BaseException as exc:
            self.error = exc
        finally:
            producer.close(timeout=10)

    def _loop(self, producer: Any) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._halt.is_set():
            now = time.monotonic()
            if self._pause.is_set():
                next_at = now + period
            elif now >= next_at:
                self._impression(producer)
                next_at += period
            self._send_due(producer)
            wake = min([next_at, *(p.due for p in self._pending[:1])])
            self._halt.wait(min(0.05, max(0.0, wake - time.monotonic())))

    def _impression(self, producer: Any) -> None:
        rid = f"imp-{self._tag}-{self.impressions_sent}"
        items = np.arange(CANDIDATES, dtype=np.uint64) + np.uint64(1_000 + self.impressions_sent * CANDIDATES)
        future = producer.send(
            self.impressions_topic, key=rid.encode(), value=impression_record(rid, time.time(), items)
        )
        future.add_callback(self._impression_acked)
        self.impressions_sent += 1
        if self._rng.random() < CLICK_SHARE:
            row = self._rng.randrange(CANDIDATES)
            due = time.monotonic() + self._rng.uniform(*CLICK_DELAY_S)
            heapq.heappush(self._pending, _PendingClick(due, rid, row, int(items[row]), future))

    def _send_due(self, producer: Any, everything: bool = False) -> None:
        """Send the clicks that are due (all of them: ``everything``) whose impression was acknowledged."""
        now = time.monotonic()
        later: list[_PendingClick] = []
        while self._pending and (everything or self._pending[0].due <= now):
            click = heapq.heappop(self._pending)
            if not click.impression.is_done:
                later.append(click)  # the broker has not answered for the impression yet
                continue
            if click.impression.failed():
                with self._lock:
                    self.impressions_failed += 1
                continue
            sid = sample_id(click.request_id, click.row)
            future = producer.send(
                self.clicks_topic,
                key=click.request_id.encode(),
                value=click_record(click.request_id, click.item, time.time()),
            )
            future.add_callback(lambda _meta, sid=sid: self._click_acked(sid))
            future.add_errback(self._click_failed)
        for click in later:
            click.due = now + 0.2
            heapq.heappush(self._pending, click)

    def _impression_acked(self, _meta: Any) -> None:
        with self._lock:
            self.impressions_acked += 1

    def _click_acked(self, sid: str) -> None:
        with self._lock:
            self.true_clicks[sid] = time.time()

    def _click_failed(self, _exc: BaseException) -> None:
        with self._lock:
            self.clicks_failed += 1

    def clicks_since(self, wall_ts: float) -> set[str]:
        """The true clicks acknowledged at or after ``wall_ts``."""
        with self._lock:
            return {sid for sid, at in self.true_clicks.items() if at >= wall_ts}

    def snapshot(self) -> dict[str, float]:
        """The true clicks so far (sample id -> acknowledged at)."""
        with self._lock:
            return dict(self.true_clicks)

    def finish(self, timeout_s: float = 150.0) -> None:
        """Stop making impressions; send the clicks still owed and wait for their acknowledgements."""
        self._halt.set()
        if self.ident is not None:  # started: a rig that failed to start stops it unstarted
            self.join(timeout_s)
