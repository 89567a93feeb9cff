"""Errors raised by ``kelp.consumers`` (Kafka errors are translated here, in one place).

Refused credentials and certificates, which kafka-python reports only as a
bootstrap timeout, are recognised by :mod:`kelp.consumers.bootstrap_check`.
"""

from __future__ import annotations

from kelp.errors import KelpError, UserError

__all__ = [
    "ConsumerError",
    "SourceAuthError",
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


class SourceAuthError(SourceUserError):
    """Kafka refused our SASL login or certificate, we refused its certificate, or our TLS files do not load.

    Never retriable: the same settings fail the same way. The message names the
    listener (``host:port (PROTOCOL)``) and the ``source.security`` settings to
    check, and never a password.
    """


def translate_kafka_error(exc: BaseException, what: str) -> KelpError:
    """Map a kafka-python exception onto the Kelp error tree (``what`` says what we were doing)."""
    from kafka import errors as kerr

    if isinstance(exc, KelpError):
        return exc  # translated already (e.g. by watch_bootstrap)
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
