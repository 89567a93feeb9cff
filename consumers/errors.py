"""Errors raised by ``kelp.consumers`` (Kafka errors are translated here, in one place)."""

from __future__ import annotations

from kelp.errors import KelpError, UserError

__all__ = [
    "ConsumerError",
    "SourceClosedError",
    "SourceUnavailableError",
    "SourceUserError",
    "translate_kafka_error",
]


class ConsumerError(KelpError):
    """A source failed; records already handed out are still valid."""


class SourceUnavailableError(ConsumerError):
    """The broker could not be reached or did not answer in time. Retriable."""

    retriable = True


class SourceClosedError(ConsumerError):
    """The source was closed (or its poll thread died); no more batches will come."""


class SourceUserError(UserError):
    """Bad source settings: unknown topic, unreadable file, bad credentials."""


def translate_kafka_error(exc: BaseException, what: str) -> KelpError:
    """Map a kafka-python exception onto the Kelp error tree (``what`` says what we were doing)."""
    from kafka import errors as kerr

    detail = f"{what}: {type(exc).__name__}: {exc}"
    if isinstance(exc, kerr.KafkaTimeoutError | kerr.KafkaConnectionError | kerr.BrokerNotAvailableError):
        return SourceUnavailableError(detail)
    if isinstance(
        exc, kerr.SaslAuthenticationFailedError | kerr.AuthorizationError | kerr.UnrecognizedBrokerVersion
    ):
        return SourceUserError(detail)
    if isinstance(exc, kerr.KafkaError) and getattr(exc, "retriable", False):
        return SourceUnavailableError(detail)
    return ConsumerError(detail)
