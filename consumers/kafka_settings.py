"""kafka-python settings from ``source`` (a :class:`~kelp.config.KafkaSourceConfig`), in one place.

Every Kafka client Kelp opens (the trainer's consumer, the dead-letter
producer, ``kelp produce``, the start-up check, admin clients in tools and
benchmarks) takes its settings from here, so security, reconnect and group
options cannot drift between them.
"""

from __future__ import annotations

import importlib
from typing import Any

from kelp.config import KafkaSourceConfig
from kelp.errors import ConfigError

__all__ = ["assignor_class", "client_settings", "consumer_settings"]


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
