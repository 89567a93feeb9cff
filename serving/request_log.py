"""The request log: each scored request to a Kafka topic, off the request path, never blocking it.

The online-learning loop needs a record of what was served (the features as
scored, the scores, the model version) to join with the clicks that come
later. :meth:`RequestLog.record` runs on the scoring thread: it encodes the
record (:func:`~kelp.consumers.codec.encode_request_record`) and queues the
bytes. A sender thread hands them to kafka-python's producer, which batches
(``linger_ms``) and retries. What the log holds, from ``record`` until Kafka
acknowledges a record or the producer gives up on it, is bounded twice: in
records (``queue_requests``) and in bytes (``queue_bytes``). The producer's
batches count too: kafka-python bounds them by time only
(``delivery_timeout_ms``), so a broker lost after start would otherwise move
the whole queue into it.

Why encode before queueing: the queue then holds exactly the bytes it counts.
A queued batch and its result hold more than the record (the Python floats of
the scores, the decoded msgpack columns the batch's arrays may be views of),
and no count bound fits both a 1-sample and a 1,000-candidate request: with
Kafka down, a count bound alone lets a replica grow until it is killed.

Pressure never reaches a request:

* a full log (Kafka slow or down) drops the new record and counts it
  (``kelp_serving_request_log_records_total{result="dropped"}``, and
  ``kelp_serving_request_log_dropped_total{reason}`` naming the bound);
* the producer is built on the sender thread, retried with backoff while the
  brokers do not answer, so a replica starts and scores with Kafka down;
* ``max_block_ms`` is short, so a broker that vanishes stalls the sender
  thread for at most that long per record, and then the queue, not a request, waits;
* a record the producer gives up on is counted as ``failed``, an acknowledged
  one as ``sent``.

Every request is logged under an id of its own (:func:`new_request_id`): a
client's ``X-Request-Id`` (or OIP ``id``) may be reused, and the join keeps one
impression per id. A valid client id travels beside it in the record, as
``request.client_id``, and so on into the joined training events.

The Kafka message: key the request id, value the record, headers
``schema=kelp-request-v1`` and ``model_version``.

Synthetic traffic stays out: a request marked ``X-Kelp-Synthetic: 1`` (gRPC:
``x-kelp-synthetic`` metadata) is scored as any other but never recorded, and
counted as ``result="synthetic"``. ``kelp probe``, the Helm test hook and load
tests send it: the join would turn their impressions, which nobody saw, into
negatives. The replica's own warm-up scores through the scorer, not the routes,
so it never reaches the log either.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kelp.config import KafkaSourceConfig, RequestLogConfig
from kelp.consumers.batch import MicroBatch
from kelp.consumers.codec import MAX_REQUEST_ID_BYTES, encode_request_record, is_valid_request_id
from kelp.consumers.kafka_client import RECORD_BATCH_BYTES, client_settings
from kelp.serving.errors import BadRequestError
from kelp.serving.features import RequestBatch
from kelp.serving.metrics import ServingMetrics
from kelp.serving.scorer import ScoreResult

__all__ = [
    "DROP_REASONS",
    "MAX_REQUEST_ID_BYTES",
    "REQUEST_ID_HEADER",
    "SCHEMA_HEADER",
    "SYNTHETIC_HEADER",
    "RequestLog",
    "client_request_id",
    "is_synthetic",
    "is_valid_request_id",
    "new_request_id",
]

log = logging.getLogger("kelp.serving")

SCHEMA_HEADER = ("schema", b"kelp-request-v1")
DROP_REASONS = ("queue_requests", "queue_bytes")
"""The ``reason`` of ``kelp_serving_request_log_dropped_total``: the bound that was full."""
_MAX_BLOCK_MS = 1_000
_RETRY_S = (0.5, 1.0, 2.0, 5.0)
_CLOSE_FLUSH_S = 5.0
_CLOSE_UNCONNECTED_S = 0.5


REQUEST_ID_HEADER = "kelp-request-id"
"""The response header with the id a request was logged under (with ``serving.request_log`` on)."""


SYNTHETIC_HEADER = "x-kelp-synthetic"
"""The request header (gRPC: metadata key) that marks a request as synthetic: scored, never logged."""
_SYNTHETIC_VALUES = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def is_synthetic(value: bytes | str | None) -> bool:
    """Whether a request's ``X-Kelp-Synthetic`` value marks it synthetic (None: no header, not synthetic).

    A value that is neither yes nor no is refused (422 ``bad_header``) rather than read as either: a
    typo must not quietly log test traffic, nor drop real traffic from training.
    """
    if value is None:
        return False
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    marked = _SYNTHETIC_VALUES.get(text.strip().lower())
    if marked is None:
        shown = text[:40] + ("..." if len(text) > 40 else "")
        raise BadRequestError(
            "bad_header", f"X-Kelp-Synthetic must be 1/true/yes or 0/false/no, not {shown!r}"
        )
    return marked


def client_request_id(given: bytes | str | None) -> str | None:
    """The client's own id (``X-Request-Id``, or the OIP request's ``id``) when it is a valid request id
    (:func:`is_valid_request_id`), else None: it is kept beside the record, never as its key."""
    if is_valid_request_id(given):
        return given.decode("ascii") if isinstance(given, bytes) else str(given)
    return None


def new_request_id() -> str:
    """A fresh id for one logged request. Never the client's: clients reuse ids (retries, a constant
    header), and the join keeps one impression per id, so a reused one would lose the later request's
    clicks."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class _Record:
    """One encoded record waiting for the sender: what the Kafka message needs, and nothing else."""

    request_id: str
    model_version: int
    value: bytes


class _Held:
    """The records the request log holds, from :meth:`put` until :meth:`release`: queued for the sender,
    or handed to the producer and not yet acknowledged (kafka-python's producer has no memory bound of its
    own: with a broker gone after start, its batches wait for ``delivery_timeout_ms``). Bounded in count
    and in bytes; :meth:`put` refuses rather than waits. :meth:`get` hands out the queued ones in order."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._queued: deque[_Record] = deque()
        self._count = 0
        self._bytes = 0
        self._ready = threading.Condition(threading.Lock())

    def put(self, record: _Record) -> str | None:
        """Hold ``record``; when it does not fit, the name of the full bound (in :data:`DROP_REASONS`)."""
        with self._ready:
            if self._count >= self.max_records:
                return "queue_requests"
            if self._bytes + len(record.value) > self.max_bytes:
                return "queue_bytes"
            self._queued.append(record)
            self._count += 1
            self._bytes += len(record.value)
            self._ready.notify()
        return None

    def get(self, timeout: float) -> _Record | None:
        """The oldest queued record, waiting up to ``timeout``; None when there is none. It stays held."""
        with self._ready:
            if not self._queued:
                self._ready.wait(timeout)
            return self._queued.popleft() if self._queued else None

    def release(self, record: _Record) -> None:
        """``record`` is acknowledged, or given up on: it no longer counts against the bounds."""
        with self._ready:
            self._count -= 1
            self._bytes -= len(record.value)

    def count(self) -> int:
        return self._count

    def nbytes(self) -> int:
        return self._bytes


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
            # Every in-sync replica before "sent": a leader that dies right after answering loses nothing
            # (with the topic's min.insync.replicas at 2, see docs/deploy.md).
            "acks": "all",
            "linger_ms": cfg.linger_ms,
            "batch_size": RECORD_BATCH_BYTES,
            "max_block_ms": _MAX_BLOCK_MS,
            "retries": 3,
            # Not idempotent: an idempotent producer takes a refusal that is not retriable as fatal and
            # fails every later send; a repeated record is harmless (the join keeps one impression per id).
            "enable_idempotence": False,
        }
        self._make_producer = make_producer
        self._held = _Held(cfg.queue_requests, cfg.queue_bytes)
        self._records = metrics.request_log_records
        self._sent = self._records.labels(result="sent")
        self._dropped = self._records.labels(result="dropped")
        self._failed = self._records.labels(result="failed")
        self._synthetic = self._records.labels(result="synthetic")
        self._dropped_by = {r: metrics.request_log_dropped.labels(reason=r) for r in DROP_REASONS}
        metrics.request_log_queue.set_function(self._held.count)
        metrics.request_log_queue_bytes.set_function(self._held.nbytes)
        self._stop = threading.Event()
        self._producer: Any = None
        self._thread = threading.Thread(target=self._run, name="kelp-request-log", daemon=True)
        self._thread.start()

    def record(
        self, logged_as: str, batch: MicroBatch, result: ScoreResult, client_id: str | None = None
    ) -> None:
        """Encode one scored request and queue it; never blocks (when a bound is full it drops it, counted).

        Runs on the scoring thread: the encode (a copy of the request's columns) is the price of a queue
        that holds only what it counts.
        """
        try:
            value = self._encode(logged_as, time.time(), batch, result, client_id)
        except Exception as exc:  # the request was answered; its record must never turn that into a 500
            self._failed.inc()
            log.warning("request log: record %s not encoded: %s", logged_as, exc)
            return
        full = self._held.put(_Record(logged_as, result.model_version, value))
        if full is not None:
            self._dropped.inc()
            self._dropped_by[full].inc()

    def skip_synthetic(self) -> None:
        """Count a scored request marked synthetic: it is never recorded (see the module docstring)."""
        self._synthetic.inc()

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
                    if attempt == 0 and not self._stop.is_set():  # a closed log has no one to warn
                        log.warning("request log: Kafka unavailable (%s); retrying, records queue", exc)
                    attempt += 1
                    self._stop.wait(delay)
                    continue
            record = self._held.get(timeout=0.1)
            if record is not None:
                self._send(record)
        self._drain()

    def _connect(self) -> Any:
        if self._make_producer is None:
            from kafka import KafkaProducer

            return KafkaProducer(**self._settings)
        return self._make_producer(**self._settings)

    def _send(self, record: _Record) -> None:
        headers = [SCHEMA_HEADER, ("model_version", b"%d" % record.model_version)]
        try:
            future = self._producer.send(
                self.topic, value=record.value, key=record.request_id.encode(), headers=headers
            )
        except Exception as exc:  # a full buffer past max_block_ms, metadata that never came
            self._done(record, self._failed)
            log.debug("request log: record %s not sent: %s", record.request_id, exc)
            return
        future.add_callback(lambda _meta: self._done(record, self._sent))
        future.add_errback(lambda _exc: self._done(record, self._failed))

    def _done(self, record: _Record, outcome: Any) -> None:
        """``record`` left the request log's hands (``outcome``: the sent or failed counter)."""
        self._held.release(record)
        outcome.inc()

    def _encode(
        self, request_id: str, ts: float, batch: MicroBatch, result: ScoreResult, client_id: str | None
    ) -> bytes:
        by_task = result.scores_of(self.tasks)
        raw = (
            batch.raw_dense
            if isinstance(batch, RequestBatch) and batch.raw_dense is not None
            else batch.dense
        )
        return encode_request_record(
            request_id=request_id,
            model_version=result.model_version,
            ts=ts,
            dense=raw,
            sparse={name: (ids.values, np.diff(ids.offsets)) for name, ids in batch.sparse.items()},
            scores={task: np.asarray(by_task[task], np.float32) for task in self.tasks},
            client_id=client_id,
        )

    def _drain(self) -> None:
        """At close: send what is queued while the producer is there, then flush once, bounded."""
        if self._producer is None:
            return
        deadline = time.monotonic() + _CLOSE_FLUSH_S
        while time.monotonic() < deadline:
            record = self._held.get(timeout=0)
            if record is None:
                break
            self._send(record)
        try:
            self._producer.flush(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:  # a flush that timed out: those records count as failed by their futures
            log.warning("request log: flush at close did not complete: %s", exc)
        try:
            self._producer.close(timeout=1.0)
        except Exception as exc:  # kafka-python's close flushes first, and raises when that times out
            log.info("request log: records left unsent at close: %s", exc)
            sender = getattr(self._producer, "_sender", None)  # then it never stops its I/O thread
            if sender is not None:
                sender.force_close()  # which fails what is pending: counted as failed

    def close(self) -> None:
        """Stop the sender after it sent what it can within a few seconds.

        When Kafka was never reached there is no producer to flush, and kafka-python's constructor may
        still be waiting on an unreachable broker: shutdown does not wait for it (the daemon thread still
        sends what is queued if the broker answers before the process ends).
        """
        self._stop.set()
        connected = self._producer is not None
        self._thread.join(_CLOSE_FLUSH_S + 2.0 if connected else _CLOSE_UNCONNECTED_S)
