"""Which subscribed topics exist, and under which topic id: deletions, recreations, added partitions.

kafka-python refreshes a consumer's cluster metadata at least every
``source.metadata_max_age_ms``, sooner after a fetch error, and calls its
listeners on its IO thread after each refresh. :class:`TopicWatch` is such a
listener. It turns the successive views into :class:`TopicChange` s that the
poll thread acts on:

* ``missing``: a subscribed topic was absent from two refreshes in a row (one
  absence alone can be the answer to a request sent before the subscription);
* ``back``: a missing topic is there again;
* ``recreated``: its topic id (KIP-516; brokers from 2.8 send one) is not the
  one seen before: the topic was deleted and made again, so any offset held
  for the old one means nothing on the new one;
* ``grew``: it has more partitions than before (CreatePartitions). The group
  rebalances by itself to read them; the change is only worth a log line.

Example (a view maps each topic to its id and partition count, or None when absent)::

    >>> w = TopicWatch(["ev"])
    >>> w.observe({"ev": ("id-1", 2)})
    >>> w.observe({}); w.missing
    frozenset()
    >>> w.observe({}); w.missing, [c.kind for c in w.changes()]
    (frozenset({'ev'}), ['missing'])
    >>> w.not_ready_reason()
    'source topic missing from the cluster: ev'
    >>> w.observe({"ev": ("id-2", 4)}); [(c.kind, c.old_id, c.new_id) for c in w.changes()]
    [('back', None, None), ('recreated', 'id-1', 'id-2')]
    >>> w.observe({"ev": ("id-2", 6)}); [(c.kind, c.before, c.partitions) for c in w.changes()]
    [('grew', 4, 6)]
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["TopicChange", "TopicWatch", "commit_metadata", "committed_topic_id"]

log = logging.getLogger(__name__)

_ABSENT_REFRESHES = 2  # refreshes in a row a topic must be absent from to count as missing

# kafka-python's own lines for a topic that is gone: one per metadata retry and one per commit
# attempt, repeated for as long as the topic is gone. The watch's one line replaces them.
_KAFKA_NOT_FOUND = ("kafka.cluster", "Topic %s not found in cluster metadata")
_KAFKA_COMMIT_FAILED = (
    "kafka.coordinator.consumer",
    "Group %s failed to commit partition %s at offset %s: %s",
)

_COMMIT_PREFIX = "topic_id="

TopicView = Mapping[str, tuple[str | None, int] | None]
"""topic -> (topic id or None when the broker sends none, partition count), or None when absent."""


@dataclass(frozen=True)
class TopicChange:
    """One change of a subscribed topic, in the order the refreshes showed them."""

    topic: str
    kind: Literal["missing", "back", "recreated", "grew"]
    old_id: str | None = None  # recreated: the id before
    new_id: str | None = None  # recreated: the id now
    partitions: int = 0  # back, recreated, grew: partitions now
    before: int = 0  # grew: partitions before


def commit_metadata(topic_id: str | None) -> str:
    """The metadata string committed with an offset: which incarnation of the topic it belongs to.

    Brokers that keep a group's offsets when a topic is deleted would
    otherwise hand the old topic's offsets to the new one with nothing to tell
    them apart.
    """
    return f"{_COMMIT_PREFIX}{topic_id}" if topic_id else ""


def committed_topic_id(metadata: str | None) -> str | None:
    """The topic id recorded by :func:`commit_metadata`, or None (another committer, or no id).

    >>> committed_topic_id(commit_metadata("abc")), committed_topic_id("")
    ('abc', None)
    """
    if metadata and metadata.startswith(_COMMIT_PREFIX):
        return metadata[len(_COMMIT_PREFIX) :] or None
    return None


class TopicWatch:
    """Follows the subscribed topics through metadata refreshes (see the module docstring).

    Threads: :meth:`on_metadata` / :meth:`observe` run on kafka-python's IO
    thread only; :meth:`changes` on the poll thread. :attr:`missing` and
    :attr:`absent` are replaced whole, never mutated, so the poll thread and
    the health endpoint may read them.
    """

    def __init__(self, topics: Iterable[str]) -> None:
        self.topics = tuple(dict.fromkeys(topics))
        self.missing: frozenset[str] = frozenset()
        self.absent: frozenset[str] = frozenset()  # absent from the latest refresh (not yet missing, maybe)
        self._absent: dict[str, int] = {}
        self._ids: dict[str, str] = {}
        self._partitions: dict[str, int] = {}
        self._changes: queue.SimpleQueue[TopicChange] = queue.SimpleQueue()
        self._quiet = _QuietNotFound(self)

    def on_metadata(self, cluster: Any) -> None:
        """kafka-python cluster listener: read this refresh's view of the subscribed topics.

        Never raises: it runs inside kafka-python's metadata update, which an
        exception would break for every other listener (the group's included).
        """
        try:
            view: dict[str, tuple[str | None, int] | None] = {}
            for topic in self.topics:
                parts = cluster.partitions_for_topic(topic)
                topic_id = cluster.topic_id(topic) if hasattr(cluster, "topic_id") else None
                view[topic] = None if parts is None else (str(topic_id) if topic_id else None, len(parts))
            self.observe(view)
        except Exception:
            log.warning("reading the topics' metadata failed", exc_info=True)

    def observe(self, view: TopicView) -> None:
        """Compare one refresh's view with the ones before; queue what changed."""
        self.absent = frozenset(t for t in self.topics if view.get(t) is None)
        for topic in self.topics:
            seen = view.get(topic)
            if seen is None:
                self._absent[topic] = self._absent.get(topic, 0) + 1
                if self._absent[topic] >= _ABSENT_REFRESHES and topic not in self.missing:
                    self.missing = self.missing | {topic}
                    self._partitions.pop(topic, None)
                    self._changes.put(TopicChange(topic, "missing"))
                continue
            self._absent[topic] = 0
            topic_id, count = seen
            if topic in self.missing:
                self.missing = self.missing - {topic}
                self._changes.put(TopicChange(topic, "back", partitions=count))
            old = self._ids.get(topic)
            recreated = topic_id is not None and old is not None and topic_id != old
            if recreated:
                self._changes.put(TopicChange(topic, "recreated", old, topic_id, partitions=count))
            if topic_id is not None:
                self._ids[topic] = topic_id
            before = self._partitions.get(topic)
            if before is not None and count > before and not recreated:
                self._changes.put(TopicChange(topic, "grew", partitions=count, before=before))
            self._partitions[topic] = count

    def changes(self) -> list[TopicChange]:
        """Every change queued since the last call, oldest first."""
        out: list[TopicChange] = []
        while True:
            try:
                out.append(self._changes.get_nowait())
            except queue.Empty:
                return out

    def topic_id(self, topic: str) -> str | None:
        """The id of ``topic`` in the latest refresh that had one (None: not seen, or no ids)."""
        return self._ids.get(topic)

    def not_ready_reason(self) -> str | None:
        """What ``/readyz`` says while a subscribed topic is missing; None when all are there."""
        missing = self.missing
        if not missing:
            return None
        plural = "s" if len(missing) > 1 else ""
        return f"source topic{plural} missing from the cluster: {', '.join(sorted(missing))}"

    def quiet(self) -> None:
        """Hide kafka-python's repeated lines about these topics being gone (the watch logs once)."""
        for name in (_KAFKA_NOT_FOUND[0], _KAFKA_COMMIT_FAILED[0]):
            logging.getLogger(name).addFilter(self._quiet)

    def unquiet(self) -> None:
        for name in (_KAFKA_NOT_FOUND[0], _KAFKA_COMMIT_FAILED[0]):
            logging.getLogger(name).removeFilter(self._quiet)


class _QuietNotFound(logging.Filter):
    """Drops kafka-python's "not found" and "unknown topic" commit lines for the watched topics only."""

    def __init__(self, watch: TopicWatch) -> None:
        super().__init__()
        self._topics = frozenset(watch.topics)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == _KAFKA_NOT_FOUND[1] and len(args) == 1:
            return args[0] not in self._topics
        if record.msg == _KAFKA_COMMIT_FAILED[1] and len(args) == 4:
            gone = args[3] == "UnknownTopicOrPartitionError"
            return not (gone and getattr(args[1], "topic", None) in self._topics)
        return True
