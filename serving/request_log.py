"""The request log: each scored request to a Kafka topic, off the request path, never blocking it.

The online-learning loop needs a record of what was served (the features as
scored, the scores, the model version) to join with the clicks that come
later. :meth:`RequestLog.record` runs on the scoring thread and only puts a
reference on a bounded queue (the request's batch and result, already built);
a sender thread encodes each record
(:func:`~kelp.consumers.codec.encode_request_record`) and hands it to
kafka-python's producer, which batches (``linger_ms``) and retries.

Pressure never reaches a request:

* a full queue (Kafka slow or down) drops the new record and counts it
  (``kelp_serving_request_log_records_total{result="dropped"}``);
* the producer is built on the sender thread, retried with backoff while the
  brokers do not answer, so a replica starts and scores with Kafka down;
* ``max_block_ms`` is short, so a broker that vanishes stalls the sender
  thread for at most that long per record, and then the queue, not a request, waits;
* a record the producer gives up on is counted as ``failed``, an acknowledged
  one as ``sent``.

The Kafka message: key the request id, value the record, headers
``schema=kelp-request-v1`` and ``model_version``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kelp.config import KafkaSourceConfig, RequestLogConfig
from kelp.consumers.batch import MicroBatch
from kelp.consumers.codec import encode_request_record
from kelp.consumers.kafka_client import client_settings
from kelp.serving.features import RequestBatch
from kelp.serving.metrics import ServingMetrics
from kelp.serving.scorer import ScoreResult

__all__ = [
    "MAX_REQUEST_ID_BYTES",
    "REQUEST_ID_HEADER",
    "SCHEMA_HEADER",
    "RequestLog",
    "is_valid_request_id",
    "request_id",
]

log = logging.getLogger("kelp.serving")

SCHEMA_HEADER = ("schema", b"kelp-request-v1")
_MAX_BLOCK_MS = 1_000
_RETRY_S = (0.5, 1.0, 2.0, 5.0)
_CLOSE_FLUSH_S = 5.0


REQUEST_ID_HEADER = "kelp-request-id"
"""The response header with the id a request was logged under (with ``serving.request_log`` on)."""
MAX_REQUEST_ID_BYTES = 128
"""The longest request id Kelp logs or joins on: one rule for the request log and ``kelp join``, so an
id is never accepted by one and refused (or stored at any size) by the other."""


def is_valid_request_id(given: bytes | str | None) -> bool:
    """True for 1 to :data:`MAX_REQUEST_ID_BYTES` printable ASCII characters (no spaces)."""
    if isinstance(given, str):
        given = given.encode("utf-8", "replace")
    return bool(given) and len(given) <= MAX_REQUEST_ID_BYTES and all(0x21 <= b <= 0x7E for b in given)


def request_id(given: bytes | str | None) -> str:
    """The client's own id (``X-Request-Id``, or the OIP request's ``id``) when it is a valid request id
    (:func:`is_valid_request_id`), else a new random one: the join matches clicks to requests by it."""
    if is_valid_request_id(given):
        return given.decode("ascii") if isinstance(given, bytes) else str(given)
    return uuid.uuid4().hex


@dataclass(frozen=True)
class _Entry:
    request_id: str
    ts: float
    batch: MicroBatch
    result: ScoreResult


class RequestLog:
    """See the module docstring. ``make_producer`` is kafka-python's ``KafkaProducer`` unless given."""

    def __init__(
        self,
        cfg: RequestLogConfig,
        kafka: KafkaSourceConfig,
        tasks: tuple[str, ...],
        metrics: ServingMetrics,
        make_producer: Callable[..., Any] | None = None,
    ) -> None:
        self.topic = cfg.topic
        self.tasks = tasks
        self._settings = {
            **client_settings(kafka),
            "acks": 1,
            "linger_ms": cfg.linger_ms,
            "max_block_ms": _MAX_BLOCK_MS,
            "retries": 3,
        }
        self._make_producer = make_producer
        self._queue: queue.Queue[_Entry] = queue.Queue(cfg.queue_requests)
        self._records = metrics.request_log_records
        self._sent = self._records.labels(result="sent")
        self._dropped = self._records.labels(result="dropped")
        self._failed = self._records.labels(result="failed")
        metrics.request_log_queue.set_function(self._queue.qsize)
        self._stop = threading.Event()
        self._producer: Any = None
        self._thread = threading.Thread(target=self._run, name="kelp-request-log", daemon=True)
        self._thread.start()

    def record(self, logged_as: str, batch: MicroBatch, result: ScoreResult) -> None:
        """Queue one scored request; never blocks (a full queue drops it, counted)."""
        try:
            self._queue.put_nowait(_Entry(logged_as, time.time(), batch, result))
        except queue.Full:
            self._dropped.inc()

    # ------------------------------------------------------------------ the sender thread

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            if self._producer is None:
                try:
                    self._producer = self._connect()
                    attempt = 0
                except Exception as exc:  # kafka-python raises several types for an unreachable broker
                    delay = _RETRY_S[min(attempt, len(_RETRY_S) - 1)]
                    if attempt == 0:
                        log.warning("request log: Kafka unavailable (%s); retrying, records queue", exc)
                    attempt += 1
                    self._stop.wait(delay)
                    continue
            try:
                entry = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self._send(entry)
        self._drain()

    def _connect(self) -> Any:
        if self._make_producer is None:
            from kafka import KafkaProducer

            return KafkaProducer(**self._settings)
        return self._make_producer(**self._settings)

    def _send(self, entry: _Entry) -> None:
        try:
            value = self._encode(entry)
            future = self._producer.send(
                self.topic,
                value=value,
                key=entry.request_id.encode(),
                headers=[SCHEMA_HEADER, ("model_version", b"%d" % entry.result.model_version)],
            )
        except Exception as exc:  # a full buffer past max_block_ms, metadata that never came
            self._failed.inc()
            log.debug("request log: record %s not sent: %s", entry.request_id, exc)
            return
        future.add_callback(lambda _meta: self._sent.inc())
        future.add_errback(lambda _exc: self._failed.inc())

    def _encode(self, entry: _Entry) -> bytes:
        batch, result = entry.batch, entry.result
        by_task = result.scores_of(self.tasks)
        raw = (
            batch.raw_dense
            if isinstance(batch, RequestBatch) and batch.raw_dense is not None
            else batch.dense
        )
        return encode_request_record(
            request_id=entry.request_id,
            model_version=result.model_version,
            ts=entry.ts,
            dense=raw,
            sparse={name: (ids.values, np.diff(ids.offsets)) for name, ids in batch.sparse.items()},
            scores={task: np.asarray(by_task[task], np.float32) for task in self.tasks},
        )

    def _drain(self) -> None:
        """At close: send what is queued while the producer is there, then flush once, bounded."""
        if self._producer is None:
            return
        deadline = time.monotonic() + _CLOSE_FLUSH_S
        while time.monotonic() < deadline:
            try:
                self._send(self._queue.get_nowait())
            except queue.Empty:
                break
        try:
            self._producer.flush(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:  # a flush that timed out: those records count as failed by their futures
            log.warning("request log: flush at close did not complete: %s", exc)
        self._producer.close(timeout=1.0)

    def close(self) -> None:
        """Stop the sender after it sent what it can within a few seconds."""
        self._stop.set()
        self._thread.join(_CLOSE_FLUSH_S + 2.0)
