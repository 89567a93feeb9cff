"""The trainer group's committed Kafka offsets: read for a row snapshot, set back by a restore.

A row snapshot records where the consumer group stood when its scan began, and
a restore puts the group back there, so that training replays every record the
restored rows may lack (at-least-once). Offsets follow Kafka's commit meaning:
the *next* offset to consume.

Committing for a group from outside it only works while the group has no
members (the coordinator refuses a commit from a non-member of a live group,
and a live member would commit over it anyway), so a restore asks
:func:`active_members` first and refuses with one line naming the group.

kafka-python 2.x and 3.x name the admin calls differently; both are handled
here, in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kelp.config import KafkaSourceConfig
from kelp.consumers.errors import translate_kafka_error
from kelp.consumers.kafka_client import client_settings

__all__ = ["active_members", "commit_offsets", "committed_offsets", "offsets_by_partition"]

_REQUEST_TIMEOUT_MS = 15_000


@contextmanager
def _admin(source: KafkaSourceConfig) -> Iterator[Any]:
    from kafka import KafkaAdminClient

    try:
        admin = KafkaAdminClient(**client_settings(source), request_timeout_ms=_REQUEST_TIMEOUT_MS)
    except Exception as exc:
        raise translate_kafka_error(exc, "connecting an admin client") from exc
    try:
        yield admin
    finally:
        admin.close()


@contextmanager
def _group_consumer(source: KafkaSourceConfig) -> Iterator[Any]:
    """A consumer carrying the group's id that never joins it (assign, not subscribe)."""
    from kafka import KafkaConsumer

    try:
        consumer = KafkaConsumer(
            **client_settings(source),
            group_id=source.group_id,
            enable_auto_commit=False,
            request_timeout_ms=_REQUEST_TIMEOUT_MS,
        )
    except Exception as exc:
        raise translate_kafka_error(exc, "connecting a consumer") from exc
    try:
        yield consumer
    finally:
        consumer.close(autocommit=False)


def committed_offsets(source: KafkaSourceConfig) -> list[dict[str, Any]]:
    """The group's committed offsets on the source's topics, sorted: ``[{topic, partition, offset}]``.

    A partition the group never committed is left out; :func:`commit_offsets`
    treats a partition a snapshot does not name as "start from its beginning".
    """
    with _admin(source) as admin:
        try:
            if hasattr(admin, "list_group_offsets"):  # kafka-python 3
                got = admin.list_group_offsets({source.group_id: None}).get(source.group_id, {})
            else:
                got = admin.list_consumer_group_offsets(source.group_id)
        except Exception as exc:
            raise translate_kafka_error(exc, f"reading group {source.group_id}'s offsets") from exc
    topics = set(source.topics)
    out = [
        {"topic": tp.topic, "partition": int(tp.partition), "offset": int(meta.offset)}
        for tp, meta in got.items()
        if tp.topic in topics and meta is not None and meta.offset is not None and meta.offset >= 0
    ]
    return sorted(out, key=lambda o: (o["topic"], o["partition"]))


def active_members(source: KafkaSourceConfig) -> int:
    """How many consumers are members of the group now (0: empty or unknown group)."""
    with _admin(source) as admin:
        try:
            if hasattr(admin, "describe_groups"):  # kafka-python 3: {group: dict}
                info = admin.describe_groups([source.group_id]).get(source.group_id) or {}
                return len(info.get("members") or [])
            described = admin.describe_consumer_groups([source.group_id])
            return sum(len(g.members or []) for g in described if g.group == source.group_id)
        except Exception as exc:
            raise translate_kafka_error(exc, f"describing group {source.group_id}") from exc


def offsets_by_partition(offsets: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    """``[{topic, partition, offset}]`` as ``{(topic, partition): offset}``."""
    return {(str(o["topic"]), int(o["partition"])): int(o["offset"]) for o in offsets}


def commit_offsets(
    source: KafkaSourceConfig, offsets: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, int], int]:
    """Commit ``offsets`` for the group on every partition of the source's topics; returns what was committed.

    A partition the snapshot does not name (the group had not committed it yet,
    or it was added since) gets its beginning offset: the restored rows hold
    nothing of it, so it is read again from its start rather than skipped.
    The caller checks :func:`active_members` first.
    """
    from kafka.structs import OffsetAndMetadata, TopicPartition

    wanted = offsets_by_partition(offsets)
    with _group_consumer(source) as consumer:
        try:
            partitions = [
                TopicPartition(topic, p)
                for topic in source.topics
                for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            missing = [tp for tp in partitions if (tp.topic, tp.partition) not in wanted]
            starts = consumer.beginning_offsets(missing) if missing else {}
            target = {
                tp: int(wanted[(tp.topic, tp.partition)]) if tp not in starts else int(starts[tp])
                for tp in partitions
            }
            if not target:
                return {}
            consumer.assign(list(target))
            consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in target.items()})
        except Exception as exc:
            raise translate_kafka_error(exc, f"committing group {source.group_id}'s offsets") from exc
    return {(tp.topic, tp.partition): off for tp, off in target.items()}
