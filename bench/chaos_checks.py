"""The chaos bench's invariants that read Kafka: committed offsets never go backwards, no record is lost.

:class:`OffsetWatcher` polls the trainer group's committed offsets (kafka-python's
admin ``OffsetFetch``, what ``kafka-consumer-groups --describe`` shows) every
``interval_s`` through every fault, and counts each read lower than the highest
offset that partition had shown: a *regression* means a restarted trainer would
re-read records that were already acknowledged as trained.

:func:`account_records` settles the books at the end: of the records the broker
acknowledged to the producer, which ones the broker no longer has (read back
from the topic) and which ones the group never committed past. Kelp commits an
offset only after the batch holding it was trained and its rows pushed
(acknowledged by the store), so a record below the committed offset was trained
at least once, by one incarnation of the trainer or another.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OffsetWatcher", "RecordBooks", "account_records", "committed_offsets", "regressions_in"]


def regressions_in(history: list[tuple[float, int, int]]) -> list[tuple[float, int, int, int]]:
    """``(t, partition, offset, highest before)`` for each move of a partition's committed offset backwards.

    ``history``: ``(t, partition, committed offset)`` in read order; -1 (nothing
    committed) after a real offset counts too: the group forgot its position.
    One backwards move is one regression however often the watcher reads it
    before the offset moves again (a poll faster than the commits must not count it twice).

    >>> regressions_in([(0, 0, 5), (1, 0, 9), (2, 1, 3), (3, 0, 7), (3.5, 0, 7), (4, 0, 9), (5, 1, -1)])
    [(3, 0, 7, 9), (5, 1, -1, 3)]
    """
    best: dict[int, int] = {}
    last: dict[int, int] = {}
    out = []
    for t, partition, offset in history:
        previous = last.get(partition)
        if previous is not None and offset < previous:
            out.append((t, partition, offset, best[partition]))
        best[partition] = max(best.get(partition, offset), offset)
        last[partition] = offset
    return out


def committed_offsets(admin: Any, group: str, topic: str, partitions: int) -> list[int]:
    """The group's committed offset per partition, -1 where none; raises on a broker error.

    ``admin``: a kafka-python (3.x) ``KafkaAdminClient``.
    """
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    got = admin.list_group_offsets({group: tps}).get(group, {})
    out = [-1] * partitions
    for tp, meta in got.items():
        if tp.topic == topic and tp.partition < partitions and meta is not None:
            out[tp.partition] = int(meta.offset)
    return out


class OffsetWatcher(threading.Thread):
    """Reads the group's committed offsets every ``interval_s`` until :meth:`finish`; see the module doc."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int, interval_s: float = 0.5):
        super().__init__(name="chaos-offset-watcher", daemon=True)
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        self.history: list[tuple[float, int, int]] = []
        self.reads = 0
        self.failed_reads = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        from kafka import KafkaAdminClient

        admin = None
        while not self._halt.wait(self.interval_s):
            try:
                if admin is None:
                    # kafka-python backs off up to 30 s between reconnects; a restarted broker would
                    # look unread that long (the Java client's 1 s is what the trainer uses too).
                    admin = KafkaAdminClient(
                        bootstrap_servers=self.bootstrap,
                        request_timeout_ms=3000,
                        reconnect_backoff_max_ms=1000,
                    )
                offsets = committed_offsets(admin, self.group, self.topic, self.partitions)
            except Exception:  # the broker is down or restarting: that read did not happen
                self.failed_reads += 1
                if admin is not None:
                    admin.close()
                    admin = None
                continue
            now = time.monotonic()
            with self._lock:
                self.reads += 1
                seen = {p for _, p, _ in self.history}
                for p, off in enumerate(offsets):
                    if off >= 0 or p in seen:  # before the first commit, "none" is no news
                        self.history.append((now, p, off))
        if admin is not None:
            admin.close()

    def regressions(self) -> list[tuple[float, int, int, int]]:
        with self._lock:
            return regressions_in(list(self.history))

    def latest(self) -> list[int]:
        with self._lock:
            last = [-1] * self.partitions
            for _, p, off in self.history:
                last[p] = off
            return last

    def finish(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class RecordBooks:
    """The end-of-run accounting; ``lost`` must be 0."""

    acked: int
    committed: list[int]
    acked_end: list[int]
    missing_from_broker: int
    not_committed: int
    uncommitted_by_partition: list[int] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.missing_from_broker + self.not_committed


def _offsets_on_broker(bootstrap: str, topic: str, partitions: int, ends: list[int]) -> list[set[int]]:
    """Every offset below ``ends[p]`` that the broker still serves, per partition (read from the start)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=16 << 20,
    )
    tps = [TopicPartition(topic, p) for p in range(partitions) if ends[p] > 0]
    found: list[set[int]] = [set() for _ in range(partitions)]
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            (max(found[tp.partition]) + 1 if found[tp.partition] else 0) < ends[tp.partition] for tp in tps
        ):
            for tp, records in consumer.poll(timeout_ms=500, max_records=10_000).items():
                found[tp.partition].update(r.offset for r in records if r.offset < ends[tp.partition])
    finally:
        consumer.close()
    return found


def account_records(bootstrap: str, topic: str, acked: list[set[int]], committed: list[int]) -> RecordBooks:
    """Which acknowledged records the broker lost, and which the group never committed past."""
    partitions = len(acked)
    ends = [max(s) + 1 if s else 0 for s in acked]
    on_broker = _offsets_on_broker(bootstrap, topic, partitions, ends)
    missing = sum(len(acked[p] - on_broker[p]) for p in range(partitions))
    uncommitted = [sum(1 for o in acked[p] if o >= max(committed[p], 0)) for p in range(partitions)]
    return RecordBooks(
        acked=sum(len(s) for s in acked),
        committed=committed,
        acked_end=ends,
        missing_from_broker=missing,
        not_committed=sum(uncommitted),
        uncommitted_by_partition=uncommitted,
    )
