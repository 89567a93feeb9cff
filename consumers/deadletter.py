"""Where rejected records go: a Kafka dead-letter topic, or a log line (file sources).

Every sink increments ``kelp_records_rejected_total{reason}`` by the number of
rejected samples. The Kafka sink sends the *original record bytes* with these
headers (all values UTF-8):

* ``reason``: one of :data:`kelp.consumers.codec.REASONS`;
* ``error``: a human-readable detail (at most 1000 characters);
* ``source_topic``, ``source_partition``, ``source_offset``: where it came from;
* ``rows``: samples rejected (a columnar message may lose only some rows);
* ``schema``: ``kelp-event-v1``;
* for a sample the trainer's model raised on (``model_error``), ``source_offsets``
  (the batch's record ranges, ``topic:partition:first-last``, comma-separated)
  instead of ``source_offset`` (and of ``source_topic``/``source_partition`` when
  the batch spans several partitions); the value is that sample as a
  single-sample message;
* only on a record cut short to fit the producer's ``max_request_size``:
  ``truncated`` (``true``) and ``original_size`` (the record's length in bytes).

Sends are asynchronous; :meth:`flush` must succeed before the offsets that
cover the rejected records are committed. A send the producer or the broker
refuses (a record still too big, an illegal or missing topic) is counted in
``kelp_consumer_dead_letters_total{result="failed"}`` and logged, never
raised: one hostile record must not stop the trainer, and a restart would
only meet it again. Such a record is then skipped without a dead-letter copy.

Every sink also logs rejections as they happen: the first few of each reason
at once, then at most one line per reason per interval with how many more
came (:class:`RejectLog`), so a topic of the wrong format shows in the log at
once rather than only in the run's summary.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kelp.config import KafkaSourceConfig
from kelp.consumers.decode import Rejection
from kelp.consumers.errors import translate_kafka_error
from kelp.consumers.kafka_client import client_settings
from kelp.consumers.metrics import ConsumerMetrics

__all__ = ["DeadLetterSink", "KafkaDeadLetter", "LogDeadLetter", "RejectLog", "producer_settings"]

log = logging.getLogger(__name__)

# Bytes a record batch of one record adds around its key, value and headers (batch header,
# record framing, varints), rounded up generously: a truncated value plus this always fits.
_RECORD_OVERHEAD = 1024


class RejectLog:
    """Logs rejections without flooding: the first ``first`` of each key at once, then one line
    per key per ``every_s`` saying how many more came since the last line.

    ``clock`` is injectable so tests can move time without sleeping.
    """

    def __init__(
        self,
        first: int = 5,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self.first = first
        self.every_s = every_s
        self.clock = clock
        self.level = level
        self._seen: dict[str, int] = {}
        self._quiet: dict[str, int] = {}  # key -> not logged since the last line
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()  # the Kafka sink's send failures arrive on the producer's thread

    def note(self, key: str, message: str, extra: dict[str, Any]) -> bool:
        """Log ``message`` for ``key`` if its budget allows; True when a line was written."""
        with self._lock:
            n = self._seen.get(key, 0) + 1
            self._seen[key] = n
            now = self.clock()
            if n <= self.first:
                self._last[key] = now
            elif now - self._last.get(key, float("-inf")) < self.every_s:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return False
            else:
                extra = {**extra, "total": n, "not_logged_since_last": self._quiet.pop(key, 0)}
                self._last[key] = now
        log.log(self.level, message, extra=extra)
        return True

    def seen(self, key: str) -> int:
        """How many times ``key`` was noted, logged or not."""
        return self._seen.get(key, 0)


class DeadLetterSink:
    """Counts rejections and logs them (rate-limited); subclasses also keep the record somewhere."""

    def __init__(self, metrics: ConsumerMetrics, log_first: int = 5, log_every_s: float = 60.0) -> None:
        self.metrics = metrics
        self.count = 0
        self.reject_log = RejectLog(log_first, log_every_s)

    def reject(self, rejection: Rejection) -> None:
        self.metrics.rejected.labels(reason=rejection.reason).inc(rejection.rows)
        self.metrics.rejected_records.labels(topic=rejection.topic, reason=rejection.reason).inc()
        self.count += 1
        self.reject_log.note(
            rejection.reason,
            "rejected record",
            {"reason": rejection.reason, "error": rejection.detail, "source": self.where(rejection)},
        )
        self._keep(rejection)

    def where(self, rejection: Rejection) -> str:
        """Where the record came from, for the log: ``topic:partition:offset`` (file sources: their line).

        A sample the trainer rejected names its batch's ranges: no single record is known.
        """
        if rejection.ranges is not None:
            return rejection.ranges
        return f"{rejection.topic}:{rejection.partition}:{rejection.offset}"

    def _keep(self, rejection: Rejection) -> None:
        raise NotImplementedError

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until kept records are durable (no-op for sinks that keep nothing)."""

    def close(self) -> None:
        """Flush and release resources."""


class LogDeadLetter(DeadLetterSink):
    """File sources and ``dead_letter_topic: null``: count and log (see :class:`RejectLog`), keep nothing."""

    def _keep(self, rejection: Rejection) -> None:
        pass


def headers_of(rejection: Rejection) -> list[tuple[str, bytes]]:
    where = [
        ("source_topic", rejection.topic.encode()),
        ("source_partition", str(rejection.partition).encode()),
        ("source_offset", str(rejection.offset).encode()),
    ]
    if rejection.ranges is not None:  # no single record: the batch's ranges (topic and partition if one)
        where = [("source_offsets", rejection.ranges.encode())] + (
            where[:2] if "," not in rejection.ranges else []
        )
    return [
        ("reason", rejection.reason.encode()),
        ("error", rejection.detail[:1000].encode("utf-8", "replace")),
        *where,
        ("rows", str(rejection.rows).encode()),
        ("schema", b"kelp-event-v1"),
    ]


def producer_settings(kafka: KafkaSourceConfig) -> dict[str, Any]:
    """The dead-letter producer's settings: the source's connection, and room for any record it read.

    ``max_request_size``: twice ``max_message_bytes`` (at least 1 MiB) plus 64 KiB
    of headers, so an ``oversize`` record is sent whole or cut by :meth:`KafkaDeadLetter.fitted`.
    """
    settings = client_settings(kafka)
    settings["max_request_size"] = max(kafka.max_message_bytes * 2, 1_048_576) + 65_536
    return settings


class KafkaDeadLetter(DeadLetterSink):
    """Sends rejected records to ``topic`` with reason and source coordinates in headers."""

    def __init__(self, metrics: ConsumerMetrics, topic: str, producer_config: dict[str, Any]) -> None:
        super().__init__(metrics)
        from kafka import KafkaProducer

        self.topic = topic
        try:
            self._producer = KafkaProducer(acks="all", linger_ms=5, **producer_config)
        except Exception as exc:
            raise translate_kafka_error(exc, "creating the dead-letter producer") from exc
        self.max_request_size = int(self._producer.config["max_request_size"])
        self._unflushed = 0
        self._fail_log = RejectLog(self.reject_log.first, self.reject_log.every_s, level=logging.ERROR)

    def _keep(self, rejection: Rejection) -> None:
        value, headers = self.fitted(rejection)
        try:
            fut = self._producer.send(self.topic, value=value, headers=headers)
        except Exception as exc:  # refused before sending: too big, illegal topic, no metadata in time
            self._failed(exc, rejection)
            return
        fut.add_callback(lambda _md: self.metrics.dead_letters.labels(result="ok").inc())
        # Not add_errback(self._failed, rejection): kafka-python passes bound arguments first.
        fut.add_errback(lambda exc: self._failed(exc, rejection))
        self._unflushed += 1

    def fitted(self, rejection: Rejection) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The value and headers to send: the record whole, or cut to fit ``max_request_size``.

        The producer refuses (synchronously) a record larger than its
        ``max_request_size``; a hostile record can be any size the broker
        accepted, so the body is truncated to what fits, and two headers say
        so. The cut-off bytes are counted, not kept.
        """
        headers = headers_of(rejection)
        value = rejection.value
        overhead = _RECORD_OVERHEAD + sum(len(k) + len(v) for k, v in headers)
        if len(value) + overhead <= self.max_request_size:
            return value, headers
        headers += [("truncated", b"true"), ("original_size", str(len(value)).encode())]
        keep = max(0, self.max_request_size - overhead - 64)  # 64: the two headers just added
        self.metrics.dead_letter_truncated.inc()
        self.metrics.dead_letter_dropped_bytes.inc(len(value) - keep)
        return value[:keep], headers

    def _failed(self, exc: BaseException, rejection: Rejection) -> None:
        self.metrics.dead_letters.labels(result="failed").inc()
        self._fail_log.note(
            type(exc).__name__,
            "dead-letter send failed; the record is skipped without a dead-letter copy",
            {
                "reason": rejection.reason,
                "source": self.where(rejection),
                "dead_letter_topic": self.topic,
                "error": f"{type(exc).__name__}: {exc}",
            },
        )

    def flush(self, timeout_s: float | None = None) -> None:
        if self._unflushed:
            try:
                self._producer.flush(timeout=timeout_s)
            except Exception as exc:
                raise translate_kafka_error(exc, "flushing the dead-letter topic") from exc
            self._unflushed = 0

    def close(self) -> None:
        try:
            self.flush(10.0)
        finally:
            self._producer.close(timeout=5)
