"""Where rejected records go: a Kafka dead-letter topic, or a log line (file sources).

Every sink increments ``kelp_records_rejected_total{reason}`` by the number of
rejected samples. The Kafka sink sends the *original record bytes* with these
headers (all values UTF-8):

* ``reason``: one of :data:`kelp.consumers.codec.REASONS`;
* ``error``: a human-readable detail (at most 1000 characters);
* ``source_topic``, ``source_partition``, ``source_offset``: where it came from;
* ``rows``: samples rejected (a columnar message may lose only some rows);
* ``schema``: ``kelp-event-v1``.

Sends are asynchronous; :meth:`flush` must succeed before the offsets that
cover the rejected records are committed, so a record is never both skipped
and missing from the dead-letter topic.
"""

from __future__ import annotations

import logging
from typing import Any

from kelp.consumers.decode import Rejection
from kelp.consumers.errors import translate_kafka_error
from kelp.consumers.metrics import ConsumerMetrics

__all__ = ["DeadLetterSink", "KafkaDeadLetter", "LogDeadLetter"]

log = logging.getLogger(__name__)


class DeadLetterSink:
    """Counts rejections; subclasses also keep the record somewhere."""

    def __init__(self, metrics: ConsumerMetrics) -> None:
        self.metrics = metrics
        self.count = 0

    def reject(self, rejection: Rejection) -> None:
        self.metrics.rejected.labels(reason=rejection.reason).inc(rejection.rows)
        self.count += 1
        self._keep(rejection)

    def _keep(self, rejection: Rejection) -> None:
        raise NotImplementedError

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until kept records are durable (no-op for sinks that keep nothing)."""

    def close(self) -> None:
        """Flush and release resources."""


class LogDeadLetter(DeadLetterSink):
    """File sources and ``dead_letter_topic: null``: count, and log the first few of each reason."""

    def __init__(self, metrics: ConsumerMetrics, log_first: int = 5) -> None:
        super().__init__(metrics)
        self.log_first = log_first
        self._seen: dict[str, int] = {}

    def _keep(self, rejection: Rejection) -> None:
        n = self._seen.get(rejection.reason, 0) + 1
        self._seen[rejection.reason] = n
        if n <= self.log_first:
            log.warning(
                "rejected record",
                extra={
                    "reason": rejection.reason,
                    "error": rejection.detail,
                    "source": self.where(rejection),
                },
            )

    def where(self, rejection: Rejection) -> str:
        """Where the record came from, for the log: ``topic:partition:offset`` (file sources: their line)."""
        return f"{rejection.topic}:{rejection.partition}:{rejection.offset}"


def headers_of(rejection: Rejection) -> list[tuple[str, bytes]]:
    return [
        ("reason", rejection.reason.encode()),
        ("error", rejection.detail[:1000].encode("utf-8", "replace")),
        ("source_topic", rejection.topic.encode()),
        ("source_partition", str(rejection.partition).encode()),
        ("source_offset", str(rejection.offset).encode()),
        ("rows", str(rejection.rows).encode()),
        ("schema", b"kelp-event-v1"),
    ]


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
        self._unflushed = 0

    def _keep(self, rejection: Rejection) -> None:
        fut = self._producer.send(self.topic, value=rejection.value, headers=headers_of(rejection))
        fut.add_callback(lambda _md: self.metrics.dead_letters.labels(result="ok").inc())
        fut.add_errback(self._failed, rejection)
        self._unflushed += 1

    def _failed(self, exc: BaseException, rejection: Rejection) -> None:
        self.metrics.dead_letters.labels(result="failed").inc()
        log.error(
            "dead-letter send failed",
            extra={"reason": rejection.reason, "source_offset": rejection.offset, "error": str(exc)},
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
