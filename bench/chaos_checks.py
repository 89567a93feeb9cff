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

:class:`OutputReader` reads ``kelp join``'s output topic and its dead-letter
topic from the start, all through the run: the sample ids emitted positive
(and whether only as a late correction), the negatives, and the dead letters
by their ``reason`` header. :func:`account_true_clicks` settles the join's
books: a true click (:class:`~kelp.bench.chaos_load.ClickLoad`) whose sample
was never emitted positive is *orphaned*.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "OffsetWatcher",
    "OutputReader",
    "RecordBooks",
    "TrueClickBooks",
    "account_records",
    "account_true_clicks",
    "committed_offsets",
    "labelled_samples",
    "regressions_in",
]


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


class OutputReader(threading.Thread):
    """Reads the joiner's output and dead-letter topics from the start until :meth:`finish`.

    ``positives``: sample id -> True when it was only ever emitted positive as a
    late correction; ``dead_letters``: count by ``reason`` header.
    """

    def __init__(self, bootstrap: str, output_topic: str, dead_letter_topic: str, partitions: int = 1):
        super().__init__(name="chaos-join-reader", daemon=True)
        self.bootstrap = bootstrap
        self.output_topic = output_topic
        self.dead_letter_topic = dead_letter_topic
        self.partitions = partitions
        self.positives: dict[str, bool] = {}
        self.negatives = 0
        self.outputs = 0
        self.unreadable = 0
        self.dead_letters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            reconnect_backoff_max_ms=1_000,
        )
        tps = [
            TopicPartition(t, p)
            for t in (self.output_topic, self.dead_letter_topic)
            for p in range(self.partitions)
        ]
        try:
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            while not self._halt.is_set():
                try:
                    polled = consumer.poll(timeout_ms=300)
                except Exception:  # the broker restarting: the next poll reads on from the same position
                    self._halt.wait(0.5)
                    continue
                for tp, records in polled.items():
                    for r in records:
                        self._read(tp.topic, r)
        finally:
            consumer.close()

    def _read(self, topic: str, record: Any) -> None:
        with self._lock:
            if topic == self.dead_letter_topic:
                reason = dict(record.headers or []).get("reason", b"?")
                self.dead_letters[reason.decode(errors="replace")] += 1
                return
            self.outputs += 1
            try:
                ids, clicks, late = labelled_samples(record.value)
            except (ValueError, KeyError, TypeError, msgpack.UnpackException):
                self.unreadable += 1
                return
            for sid, label in zip(ids, clicks, strict=True):
                if label > 0:
                    self.positives[sid] = self.positives.get(sid, True) and late
                else:
                    self.negatives += 1

    def joined(self, sample_ids: Iterable[str]) -> set[str]:
        """Those of ``sample_ids`` emitted positive so far."""
        with self._lock:
            return {s for s in sample_ids if s in self.positives}

    def figures(self) -> tuple[dict[str, bool], int, int, int, dict[str, int]]:
        """``(positives, negatives, outputs, unreadable, dead letters by reason)`` so far."""
        with self._lock:
            return (
                dict(self.positives),
                self.negatives,
                self.outputs,
                self.unreadable,
                dict(self.dead_letters),
            )

    def finish(self) -> None:
        self._halt.set()
        if self.ident is not None:
            self.join(15)


def labelled_samples(value: bytes, task: str = "click") -> tuple[list[str], list[float], bool]:
    """``(sample ids, task labels, late)`` of one labelled event the joiner emitted."""
    msg = msgpack.unpackb(value, raw=False)
    ids = list(msg["join"]["sample_ids"])
    col = msg["labels"][task]
    labels = np.frombuffer(col, "<f4").tolist() if isinstance(col, bytes) else [float(col)]
    if len(labels) != len(ids):
        raise ValueError(f"{len(labels)} labels for {len(ids)} sample ids")
    return ids, labels, bool(msg["join"]["late"])


@dataclass
class TrueClickBooks:
    """The join's end-of-run accounting; ``orphaned`` must be 0."""

    true_clicks: int
    joined: int
    joined_only_late: int
    orphaned: int
    orphaned_examples: list[str]


def account_true_clicks(true_clicks: Iterable[str], positives: Mapping[str, bool]) -> TrueClickBooks:
    """Which true clicks the joiner never emitted positive (the orphans), of ``positives`` (id -> late only).

    >>> b = account_true_clicks(["r1/0", "r2/3", "r3/1"], {"r1/0": False, "r3/1": True, "r9/0": False})
    >>> b.joined, b.joined_only_late, b.orphaned, b.orphaned_examples
    (2, 1, 1, ['r2/3'])
    """
    clicks = sorted(set(true_clicks))
    orphaned = [s for s in clicks if s not in positives]
    return TrueClickBooks(
        true_clicks=len(clicks),
        joined=len(clicks) - len(orphaned),
        joined_only_late=sum(1 for s in clicks if positives.get(s) is True),
        orphaned=len(orphaned),
        orphaned_examples=orphaned[:10],
    )
