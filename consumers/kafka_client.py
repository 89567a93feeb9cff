"""Kafka clients from ``source`` (a :class:`~kelp.config.KafkaSourceConfig`): settings and a probe.

The consumers' counterpart of :mod:`kelp.store.redis.connection`. Every Kafka
client Kelp opens (the trainer's consumer, the dead-letter producer, ``kelp
produce``, admin clients in tools and benchmarks) takes its settings from
here, so security, reconnect and group options cannot drift between them; and
the start-up check asks :func:`bootstrap_probe` rather than building a client
of its own.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from kelp.config import KafkaSourceConfig
from kelp.errors import ConfigError, KelpError

__all__ = [
    "RECORD_BATCH_BYTES",
    "BootstrapTimeoutError",
    "assignor_class",
    "bootstrap_probe",
    "client_settings",
    "consumer_settings",
    "keep_rejoin_going",
]


log = logging.getLogger(__name__)

RECORD_BATCH_BYTES = 1 << 20
"""Batch size of Kelp's producers: their records (columnar messages, labelled and logged requests
holding every candidate's features) run to tens of KB, so with kafka-python's 16 KB default each
record would be a batch, and at ``acks=all`` a produce request, of its own."""


class BootstrapTimeoutError(KelpError):
    """No bootstrap server answered within the start-up budget (not retriable: the budget is spent)."""


def client_settings(kafka: KafkaSourceConfig) -> dict[str, Any]:
    """kafka-python settings shared by consumers, producers and admin clients (security included)."""
    sec = kafka.security
    out: dict[str, Any] = {
        "bootstrap_servers": list(kafka.bootstrap_servers),
        "client_id": kafka.client_id,
        "reconnect_backoff_max_ms": kafka.reconnect_backoff_max_ms,
        "security_protocol": sec.protocol,
    }
    if sec.sasl_mechanism is not None:
        out["sasl_mechanism"] = sec.sasl_mechanism
    if sec.sasl_username is not None:
        out["sasl_plain_username"] = sec.sasl_username
    if sec.sasl_password is not None:
        out["sasl_plain_password"] = sec.sasl_password.get_secret_value()
    if sec.protocol in {"SSL", "SASL_SSL"}:
        out["ssl_check_hostname"] = sec.ssl_check_hostname
        for key, value in (
            ("ssl_cafile", sec.ssl_cafile),
            ("ssl_certfile", sec.ssl_certfile),
            ("ssl_keyfile", sec.ssl_keyfile),
        ):
            if value is not None:
                out[key] = str(value)
        if sec.ssl_password is not None:
            out["ssl_password"] = sec.ssl_password.get_secret_value()
    return out


_ASSIGNORS: dict[str, tuple[str, str]] = {
    "cooperative-sticky": ("kafka.coordinator.assignors.cooperative_sticky", "CooperativeStickyAssignor"),
    "sticky": ("kafka.coordinator.assignors.sticky.sticky_assignor", "StickyPartitionAssignor"),
    "range": ("kafka.coordinator.assignors.range", "RangePartitionAssignor"),
    "roundrobin": ("kafka.coordinator.assignors.roundrobin", "RoundRobinPartitionAssignor"),
}


def assignor_class(name: str) -> type:
    """kafka-python's assignor for ``source.partition_assignment``.

    One assignor only: kafka-python refuses to mix eager and cooperative ones in
    one consumer, so the upgrade path Java offers (both listed) is not there.
    """
    module, cls = _ASSIGNORS[name]
    try:
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        raise ConfigError(
            f"source.partition_assignment: {name} needs kafka-python 3 or later (an older one is installed)"
        ) from None


def consumer_settings(kafka: KafkaSourceConfig) -> dict[str, Any]:
    """KafkaConsumer settings from the config (auto-commit always off)."""
    static = {"group_instance_id": kafka.group_instance_id} if kafka.group_instance_id else {}
    return {
        **client_settings(kafka),
        **static,
        "partition_assignment_strategy": (assignor_class(kafka.partition_assignment),),
        "group_id": kafka.group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": kafka.auto_offset_reset,
        "max_poll_records": kafka.max_poll_records,
        "fetch_max_bytes": kafka.fetch_max_bytes,
        "max_partition_fetch_bytes": kafka.max_partition_fetch_bytes,
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        "max_poll_interval_ms": kafka.max_poll_interval_ms,
        "metadata_max_age_ms": kafka.metadata_max_age_ms,
        # A trainer must never create the topic it reads: the broker would make a deleted topic
        # again, with its default partition count, the moment the consumer asks for its metadata.
        "allow_auto_create_topics": False,
        "enable_incremental_fetch_sessions": kafka.incremental_fetch_sessions,
    }


def bootstrap_probe(source: KafkaSourceConfig, budget_s: float, budget_setting: str) -> Callable[[], None]:
    """A check that a throw-away consumer bootstraps (metadata from any one broker) within ``budget_s``.

    kafka-python retries the bootstrap on its own until ``bootstrap_timeout_ms``,
    so one attempt covers the budget; its per-attempt error logs are kept off the
    output (the one line raised says it all). An attempt refused for credentials
    or TLS trust raises a :class:`~kelp.consumers.errors.SourceUserError` (exit 2)
    rather than "no broker answered": waiting cannot fix those. Anything else is a
    :class:`BootstrapTimeoutError` naming the servers, the budget and ``budget_setting``.
    """
    from kafka import KafkaConsumer

    from kelp.consumers.bootstrap_check import watch_bootstrap
    from kelp.consumers.errors import SourceUserError, translate_kafka_error

    def probe() -> None:
        settings = client_settings(source)
        try:
            with watch_bootstrap(settings):
                consumer = KafkaConsumer(**settings, bootstrap_timeout_ms=int(budget_s * 1000))
                consumer.close()
        except Exception as exc:
            err = translate_kafka_error(exc, "bootstrap")
            if isinstance(err, SourceUserError):
                raise err from None
            raise BootstrapTimeoutError(
                f"source.bootstrap_servers: no broker of {', '.join(source.bootstrap_servers)} answered "
                f"within {budget_s:g}s ({budget_setting}): {_type_and_message(exc)}"
            ) from None

    return probe


def _type_and_message(exc: BaseException) -> str:
    """``Type: message``, once (kafka-python's messages often start with their type already)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def keep_rejoin_going(consumer: Any) -> None:
    """Ask again for a group rejoin that kafka-python 3 left pending (it would never finish by itself).

    A rebalance that the group leader starts because the metadata changed (a topic
    came back, was made again or grew, or its partitions became known just after
    the group formed) does not set kafka-python's rejoin flag. If ``poll`` times out
    while that join is in flight, the leader's own assignment meanwhile makes
    kafka-python see no need to rejoin, so the next ``poll`` never completes the
    join: heartbeats stay off, no partition is assigned, every commit is refused,
    and the coordinator soon drops the member. A join still pending while no rejoin
    is wanted is that state; asking for a rejoin lets the next ``poll`` finish it
    (tests/consumers/test_rejoin_cut_short.py). Call it around each ``poll``; a
    no-op between rebalances and on clients without these attributes.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if getattr(coordinator, "_join_task", None) is not None and not coordinator.need_rejoin():
        log.debug("a group join was left pending by kafka-python; requesting a rejoin")
        coordinator.request_rejoin()
