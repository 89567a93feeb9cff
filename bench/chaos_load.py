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
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from kelp.bench.synth import CriteoSynth
from kelp.consumers.codec import encode_columns
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES

__all__ = ["ScoreClient", "SteadyProducer", "score_request"]

PER_MESSAGE = 64


class SteadyProducer(threading.Thread):
    """``rate`` samples/s into ``topic`` until :meth:`finish`; ``acked[p]``: partition p's acked offsets."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float, seed: int = 7) -> None:
        super().__init__(name="chaos-producer", daemon=True)
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
                acks=1,
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
    """``rate`` requests/s to ``127.0.0.1:port`` until :meth:`finish`; a reply later than ``timeout_s`` hangs.

    ``statuses`` counts answers by HTTP status (0: transport error, -1: hang);
    ``samples`` holds ``(sent at, status, seconds)`` for every request;
    ``nonfinite_scores`` counts answers 200 holding a null (JSON's non-finite) or missing score.
    """

    HANG = -1
    TRANSPORT = 0

    def __init__(self, port: int, rate: float, timeout_s: float) -> None:
        super().__init__(name="chaos-score-client", daemon=True)
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
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
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
