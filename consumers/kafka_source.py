"""Kafka source: a consumer group read by one background thread into a bounded batch queue.

Threads: kafka-python's ``KafkaConsumer`` is not thread-safe, so *every*
consumer call (poll, pause, resume, commit, close) happens in the poll
thread. The trainer's thread only takes batches from a bounded queue and puts
commit requests on another queue.

Back-pressure: when the batch queue (``batching.queue_depth``) is full, the
poll thread pauses every assigned partition and keeps calling ``poll`` (which
returns nothing for paused partitions) so the group sees it alive; it resumes
when there is room. Memory is bounded by queue_depth batches plus one poll.

Commits: no auto-commit. Each emitted batch is registered in an
:class:`~kelp.consumers.offsets.OffsetTracker`; ``commit(batch)`` marks it
durable, and the poll thread commits the highest contiguous durable offset of
each partition (after flushing the dead-letter producer), at most every 100 ms
unless the caller waits for the commit.

Rebalances: each assignment of a partition gets a new *epoch*, carried by the
batch's :class:`~kelp.consumers.batch.SourceRange`. On revocation the poll
thread commits what is already durable (quick, no waiting on the trainer,
since blocking there stops the group from progressing), then forgets the
partition: later ``commit`` calls for batches of the old epoch are ignored,
and the new owner re-reads them (at least once).

Cooperative rebalancing (``source.partition_assignment: cooperative-sticky``,
KIP-429): kafka-python revokes only the partitions that move and hands the
listener only the new ones, so a partition that stays keeps its epoch, its
buffered records and its place in the offset tracker. A revoked partition is
already out of the consumer's assignment when the listener runs.

Static membership (``source.group_instance_id``, KIP-345): kafka-python sends
no LeaveGroup for a static member on ``close`` (it checks
``is_dynamic_member``), so a member restarted under the same id within the
session timeout takes its old place and no partition moves. The listener still
sees its own partitions revoked on close, which only commits and forgets them
locally.

Start position (``source.start_from`` other than ``committed``): the first
time this process is assigned a partition, the poll thread seeks it (to its
beginning, its end, or the first record at or after a time) right after the
``poll`` that assigned it, and drops whatever that ``poll`` fetched for it from
the old position, so no record before the start is handed out.

Topics that change (:mod:`~kelp.consumers.topic_watch` follows them in the
consumer's metadata): a topic gone from the cluster makes the source not ready
(:meth:`KafkaSource.not_ready_reason`) and drops what was read from it and not
yet committed; nothing is committed on a topic absent from the latest refresh,
nor on a topic whose id is no longer the one its partition was assigned
under. A recreated topic's owned partitions start a new epoch at
``auto_offset_reset``, and so does a partition whose committed offset lies
beyond its end or was committed for another incarnation of the topic (each
commit records the topic id in its metadata). Partitions added to a topic are
read after the next metadata refresh (``metadata_max_age_ms``) rebalances the
group. The consumer never creates the topic it reads.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig
from kelp.consumers.base import Source, ranges_of
from kelp.consumers.batch import MicroBatch, SourceRange
from kelp.consumers.batcher import Batcher, Emitted
from kelp.consumers.deadletter import DeadLetterSink, KafkaDeadLetter, LogDeadLetter
from kelp.consumers.decode import Chunk
from kelp.consumers.errors import SourceClosedError, translate_kafka_error
from kelp.consumers.formats import expected_records, topic_decoders
from kelp.consumers.initial_check import InitialCheck
from kelp.consumers.kafka_client import client_settings, consumer_settings, keep_rejoin_going
from kelp.consumers.metrics import ConsumerMetrics
from kelp.consumers.offsets import OffsetTracker
from kelp.consumers.topic_watch import TopicChange, TopicWatch, commit_metadata, committed_topic_id
from kelp.errors import UserError
from kelp.retry import RetryPolicy

__all__ = ["KafkaSource"]

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.1
_PAUSED_POLL_S = 0.05
_COMMIT_INTERVAL_S = 0.1  # reported durable offsets are committed at most this often (_drain_commits)
_COMMIT_ATTEMPT_MS = 500  # one commit attempt, kafka-python's own retries included (_commit_now)


def _listener(source: KafkaSource) -> Any:
    """A rebalance listener for the installed kafka-python.

    kafka-python 2 calls listeners inside ``consumer.poll``, on the poll thread.
    kafka-python 3 calls them on its own IO thread, where a blocking
    ``commit`` raises ("Cannot block on net.run() from the IO thread
    itself"): the commit on revocation always failed there, so the new owner
    re-read everything since the last commit. With 3 the listener is async
    and awaits ``commit_async`` instead. Either way the poll thread is blocked
    in ``poll`` or ``close`` while a listener runs, so the source's state has
    one user at a time. They never wait on the trainer: blocking here would
    stall the whole group's rebalance.
    """
    import kafka

    async_listener = getattr(kafka, "AsyncConsumerRebalanceListener", None)
    if async_listener is None:

        class _Listener(kafka.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
                source._revoked(list(revoked))

            def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
                source._assigned(list(assigned))

        return _Listener()

    class _AsyncListener(async_listener):
        async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
            await source._revoked_async(list(revoked))

        async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
            source._assigned(list(assigned))

        async def on_partitions_lost(self, lost: Iterable[Any]) -> None:
            source._lost(list(lost))

    return _AsyncListener()


class KafkaSource(Source):
    """Micro-batches from a Kafka consumer group (see the module docstring for the threading model).

    ``consumer_overrides`` are extra KafkaConsumer settings (tests, benchmarks).
    """

    def __init__(
        self,
        kafka: KafkaSourceConfig,
        spec: FeatureSpec,
        batching: BatchingConfig | None = None,
        registry: CollectorRegistry | None = None,
        *,
        consumer_overrides: dict[str, Any] | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        from kafka import KafkaConsumer  # fails early if kafka-python is missing

        self.kafka = kafka
        self.spec = spec
        self.batching = batching or BatchingConfig()
        self.metrics = ConsumerMetrics(registry)
        self._settings = {**consumer_settings(kafka), **(consumer_overrides or {})}
        # Each topic is decoded, and judged by the initial check, in its own format (topic_formats).
        self._decoders = topic_decoders(kafka, spec)
        self._checks = {
            topic: InitialCheck(
                kafka.initial_check_records, kafka.max_initial_reject_fraction, expected_records(kafka, topic)
            )
            for topic in kafka.topics
        }
        self._epochs: dict[tuple[str, int], int] = {}
        self._next_epoch = 1
        self._batcher = Batcher(
            spec,
            self.batching.batch_size,
            self.batching.max_batch_delay_ms / 1000.0,
            epoch_of=lambda t, p: self._epochs.get((t, p), 0),
        )
        self._tracker = OffsetTracker()
        self._out: queue.Queue[MicroBatch] = queue.Queue(maxsize=self.batching.queue_depth)
        self._commits: queue.Queue[tuple[list[SourceRange], Future[None] | None]] = queue.Queue()
        self._commit_due = False  # durable reports not committed yet
        self._held: list[Future[None]] = []  # waited commits put off by a rebalance in progress
        self._last_commit = float("-inf")  # monotonic time of the last commit sent
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._consumer: Any = None
        self._dead_letter: DeadLetterSink | None = None
        self._assignment: set[tuple[str, int]] = set()
        self._seen: dict[tuple[str, int], int] = {}
        # start_from: partitions assigned but not yet moved to the start, and those already moved once
        self._start_pending: set[tuple[str, int]] = set()
        self._started: set[tuple[str, int]] = set()
        # Topics that change under the source: their metadata, the topic id each partition was assigned
        # under, and the partitions whose committed offset is still to be checked against the topic.
        self._topics = TopicWatch(kafka.topics)
        self._cluster: Any = None
        self._assigned_ids: dict[tuple[str, int], str | None] = {}
        self._unchecked: set[tuple[str, int]] = set()
        # Assigned partitions whose lag gauge is not set yet: set from the first fetch answer after the
        # assignment, with records or without, so a quiet topic's lag is there from the first scrape.
        self._lag_unknown: set[tuple[str, int]] = set()
        self._commit_failures = 0  # failed commits in a row: logged on the first, and on recovery
        request_timeout_ms = self._settings.get(
            "request_timeout_ms", KafkaConsumer.DEFAULT_CONFIG["request_timeout_ms"]
        )
        self._commit_retry = RetryPolicy(
            attempts=None,
            deadline_s=request_timeout_ms / 1000,
            base_delay_s=0.05,
            max_delay_s=0.5,
            retry_on=lambda exc: bool(getattr(exc, "retriable", False)),
        )
        self._thread = threading.Thread(target=self._run, name="kelp-kafka-poll", daemon=True)
        self._thread.start()
        self._ready.wait(start_timeout_s)
        if self._error is not None:
            self._thread.join(5)
            raise self._error

    # ------------------------------------------------------------------ trainer side

    def poll(self, timeout_s: float | None = None) -> MicroBatch | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            try:
                batch = self._out.get(timeout=wait)
            except queue.Empty:
                if not self._thread.is_alive():
                    if self._error is not None:
                        raise self._error from None
                    raise SourceClosedError("kafka source is closed") from None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            self.metrics.queue.set(self._out.qsize())
            return batch

    def commit(self, batch_or_sources: MicroBatch | Iterable[SourceRange], wait: bool = False) -> None:
        fut: Future[None] | None = Future() if wait else None
        self._commits.put((ranges_of(batch_or_sources), fut))
        if fut is not None:
            if not self._thread.is_alive():
                raise SourceClosedError("kafka source is closed; commit not sent")
            fut.result(timeout=max(30.0, self.kafka.session_timeout_ms / 1000 * 3))

    def committed_positions(self) -> dict[tuple[str, int], int]:
        """Next offset to commit per owned partition, as last computed by the poll thread."""
        return {(k[0], k[1]): v for k, v in self._tracker.positions().items()}

    def assignment(self) -> set[tuple[str, int]]:
        """(topic, partition) pairs this member owns now and reads from a settled position.

        With ``start_from`` other than committed, a newly assigned partition
        appears here once it has been moved to its start.
        """
        return set(self._assignment)

    def not_ready_reason(self) -> str | None:
        """Why no samples can come now: a subscribed topic is gone from the cluster; None otherwise."""
        return self._topics.not_ready_reason()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    # ------------------------------------------------------------------ poll thread

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        pending: MicroBatch | None = None
        paused = False
        try:
            while not self._stop.is_set():
                self._drain_commits()
                if pending is not None:
                    if not self._offer(pending, wait=paused):
                        assigned = self._consumer.assignment()
                        if assigned:
                            self._consumer.pause(*assigned)  # also pauses partitions assigned meanwhile
                        if not paused:
                            paused = True
                            self.metrics.paused.set(1)
                        # Paused: keeps the membership and serves rebalances. Not poll(0): kafka-python 3
                        # gives up a group rejoin at once with no time, so a paused member never rejoined.
                        self._poll_once(_PAUSED_POLL_S)
                        continue
                    pending = self._emit_due()  # batches cut from records already here need no poll
                    if pending is not None:
                        continue
                if paused:
                    self._consumer.resume(*self._consumer.paused())
                    paused = False
                    self.metrics.paused.set(0)
                timeout = self._batcher.time_left() if len(self._batcher) else _IDLE_POLL_S
                self._poll_once(min(timeout, _IDLE_POLL_S))
                pending = self._emit_due()
        except UserError as exc:
            self._error = exc  # one line the caller prints (kelp train: exit 2); a traceback would bury it
        except BaseException as exc:
            self._error = translate_kafka_error(exc, "polling") if _is_kafka_error(exc) else exc
            log.error("kafka poll thread failed", exc_info=True)
        finally:
            self._shutdown()

    def _open(self) -> None:
        from kafka import KafkaConsumer

        try:
            self._consumer = KafkaConsumer(**self._settings)
            self._watch_topics()
            self._consumer.subscribe(topics=list(self.kafka.topics), listener=_listener(self))
        except Exception as exc:
            raise translate_kafka_error(
                exc, f"connecting to {','.join(self.kafka.bootstrap_servers)}"
            ) from exc
        if self.kafka.dead_letter_topic:
            producer_cfg = client_settings(self.kafka)
            producer_cfg["max_request_size"] = max(self.kafka.max_message_bytes * 2, 1_048_576) + 65_536
            self._dead_letter = KafkaDeadLetter(self.metrics, self.kafka.dead_letter_topic, producer_cfg)
        else:
            self._dead_letter = LogDeadLetter(self.metrics)

    def _poll_once(self, timeout_s: float) -> None:
        self._apply_topic_changes()
        polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        keep_rejoin_going(self._consumer)  # a join this poll's timeout cut short
        moved = self._seek_to_start() if self._start_pending else set()
        if self._unchecked:
            moved = moved | self._check_committed()
        if self._lag_unknown:
            self._first_lag(moved)
        for tp, records in polled.items():
            key = (tp.topic, tp.partition)
            if not records or key not in self._assignment or key in moved:
                continue
            if key in self._seen and records[0].offset < self._seen[key]:
                self._fell_back(key, records[0].offset)
            t0 = time.perf_counter()
            chunk = self._decoders[tp.topic].decode(records)
            self.metrics.decode_seconds.observe(time.perf_counter() - t0)
            self.metrics.records.labels(topic=tp.topic).inc(len(records))
            self.metrics.bytes.labels(topic=tp.topic).inc(chunk.nbytes)
            self.metrics.samples.labels(topic=tp.topic).inc(chunk.size)
            self._seen[key] = chunk.last_offset + 1
            highwater = self._consumer.highwater(tp)
            if highwater is not None:
                self.metrics.lag.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    max(0, highwater - self._seen[key])
                )
            # A partition's first records wait for the initial check (a topic of the wrong format
            # stops the source here, before any of it is dead-lettered or committed).
            check = self._checks[tp.topic]
            caught_up = check.pending(key) and self._caught_up(tp, highwater)
            for ready in check.offer(key, chunk, len(records), caught_up):
                self._hand_on(ready)

    def _first_lag(self, moved: set[tuple[str, int]]) -> None:
        """Set the lag gauge of newly assigned partitions once a fetch has told their high watermark.

        A record sets it too, but a partition that gets none (a quiet topic, or
        a restart that had committed everything) would otherwise have no lag
        series at all, and an alert on the lag would see nothing.
        """
        from kafka.structs import TopicPartition

        for key in sorted(self._lag_unknown - moved):  # moved just now: its position is not settled
            if key not in self._assignment:
                continue  # still waiting for its move to start_from
            tp = TopicPartition(*key)
            highwater = self._consumer.highwater(tp)
            try:
                position = self._consumer.position(tp) if highwater is not None else None
            except Exception:  # revoked meanwhile: forgotten with its partition
                continue
            if highwater is not None and position is not None:
                self.metrics.lag.labels(topic=key[0], partition=str(key[1])).set(max(0, highwater - position))
                self._lag_unknown.discard(key)

    def _caught_up(self, tp: Any, highwater: int | None) -> bool:
        """Nothing more to read from ``tp`` now: its position has reached the high watermark.

        The position, not the last record's offset: a transaction's commit
        marker takes the last offset of a partition and is never returned as a
        record, so a partition ending in one would never look caught up.
        """
        if highwater is None:
            return True
        try:
            position = self._consumer.position(tp)
        except Exception:  # unassigned meanwhile; then the check's held records are dropped anyway
            return True
        return position is None or position >= highwater

    def _hand_on(self, chunk: Chunk) -> None:
        """Dead-letter ``chunk``'s rejections and give its samples to the batcher."""
        assert self._dead_letter is not None
        for rejection in chunk.rejections:
            self._dead_letter.reject(rejection)
        self._batcher.add(chunk)

    def _seek_to_start(self) -> set[tuple[str, int]]:
        """Move the partitions assigned for the first time to ``start_from``; the keys moved.

        Runs on the poll thread right after the ``poll`` that assigned them
        (``offsets_for_times`` blocks, which the listener on kafka-python 3's
        IO thread must not). Records that ``poll`` returned for them were read
        from the committed position: the caller drops them. A partition whose
        last record is older than the time goes to its end, where the next
        record will be.
        """
        from kafka.structs import TopicPartition

        keys = set(self._start_pending)
        self._start_pending.clear()
        owned = self._consumer.assignment()
        tps = [tp for tp in (TopicPartition(t, p) for t, p in sorted(keys)) if tp in owned]
        if tps:
            # Exact offsets, not seek_to_beginning/seek_to_end: those resolve at a later poll, so a
            # record written in between would land on either side of the start by chance.
            mode = self.kafka.start_from
            if mode == "earliest":
                starts = self._consumer.beginning_offsets(tps)
            elif mode == "latest":
                starts = self._consumer.end_offsets(tps)
            else:
                at = self.kafka.start_timestamp_ms
                found = self._consumer.offsets_for_times({tp: at for tp in tps})
                past = [tp for tp in tps if found.get(tp) is None]
                starts = self._consumer.end_offsets(past) if past else {}
                starts.update({tp: hit.offset for tp, hit in found.items() if hit is not None})
            for tp in tps:
                self._consumer.seek(tp, starts[tp])
                self._assignment.add((tp.topic, tp.partition))
            log.info(
                "partitions moved to source.start_from=%s",
                mode,
                extra={"partitions": {f"{tp.topic}:{tp.partition}": starts[tp] for tp in tps}},
            )
        self._started |= keys
        return keys

    def _offer(self, batch: MicroBatch, wait: bool) -> bool:
        """Queue ``batch``; ``wait``: for up to ``_PAUSED_POLL_S`` until the trainer makes room.

        While paused the thread waits on the queue itself, not in a paused
        ``poll``: a poll cannot end early when the trainer takes a batch, so
        the trainer would sit idle for the rest of it (docs/performance.md).
        """
        try:
            if wait:
                self._out.put(batch, timeout=_PAUSED_POLL_S)
            else:
                self._out.put_nowait(batch)
        except queue.Full:
            return False
        self.metrics.queue.set(self._out.qsize())
        return True

    def _emit_due(self) -> MicroBatch | None:
        """Queue every batch that is due now; return the one that found the queue full, if any.

        One poll brings many batches' worth of records (a fetch is up to
        ``max_partition_fetch_bytes`` per partition). Cutting only one batch per
        ``poll`` made every other batch wait for a poll that returns nothing
        and still costs a round trip to kafka-python's IO thread
        (docs/performance.md), so all due batches go out before the next poll.
        """
        while True:
            emitted = self._batcher.take()
            if emitted is None:
                return None
            batch = self._emit(emitted)
            if batch is not None and not self._offer(batch, wait=False):
                return batch

    def _emit(self, emitted: Emitted) -> MicroBatch | None:
        ranges = emitted.batch.sources if emitted.batch is not None else emitted.handled
        for r in ranges:
            self._tracker.register((r.topic, r.partition, r.epoch), r.last_offset)
        if emitted.batch is None:
            self._mark(ranges)
            self._commit_now()
            return None
        self.metrics.batches.inc()
        return emitted.batch

    def _mark(self, ranges: list[SourceRange]) -> None:
        for r in ranges:
            if self._epochs.get((r.topic, r.partition)) == r.epoch:
                self._tracker.mark_durable((r.topic, r.partition, r.epoch), r.last_offset)

    def _drain_commits(self, final: bool = False) -> None:
        """Commit what the trainer reported durable, at most every ``_COMMIT_INTERVAL_S``.

        A commit is a broker round trip on this thread, and the trainer reports
        every batch: in a profile of the poll thread the synchronous commits
        took a large share of its time while records waited to be decoded
        (docs/performance.md). Reports are therefore gathered and committed at
        most every ``_COMMIT_INTERVAL_S``, except when a caller waits
        (``commit(..., wait=True)``) and at shutdown (``final``); revocations
        commit on their own. What is committed is unchanged: only what the
        trainer reported durable. A commit that fails is retried after the
        interval even if nothing else is reported.
        """
        futures, self._held = self._held, []
        while True:
            try:
                ranges, fut = self._commits.get_nowait()
            except queue.Empty:
                break
            self._mark(ranges)
            self._commit_due = True
            if fut is not None:
                futures.append(fut)
        if not self._commit_due:
            return
        if not (futures or final) and time.monotonic() - self._last_commit < _COMMIT_INTERVAL_S:
            return
        self._commit_due = False
        self._last_commit = time.monotonic()
        try:
            self._commit_now()
        except BaseException as exc:
            self._commit_due = True
            if _rebalancing(exc) and not final:
                # The group is mid-rebalance, so there is no generation to commit under yet; under
                # cooperative-sticky the member keeps reading (and the trainer reporting) through it.
                # The next poll completes the rebalance; retry then, and let waiting callers wait.
                self._held = futures
                return
            self._commit_failures += 1
            for fut in futures:
                fut.set_exception(exc)
            if not futures and self._commit_failures == 1:  # one line per streak, not one per retry
                log.warning(
                    "offset commit failed; retrying with each commit until one succeeds", exc_info=True
                )
            return
        if self._commit_failures:
            log.info("offset commits succeed again after %d failed attempts", self._commit_failures)
            self._commit_failures = 0
        for fut in futures:
            fut.set_result(None)

    def _commit_now(self, only: set[tuple[str, int]] | None = None) -> None:
        """Commit what is committable, retrying retriable failures for up to the request timeout.

        kafka-python's own ``commit`` retries a retriable failure (an unknown
        topic among them) until its request timeout, with the offsets it was
        given: a topic deleted and made again meanwhile would receive the old
        topic's offsets, and the poll thread would stand still. So each
        attempt is short, and before each one the offsets are checked again:
        partitions whose topic is gone or has a new id leave the commit.
        """
        positions, offsets = self._committable(only)
        if not offsets:
            return
        sent: dict[Any, Any] = {}

        def attempt() -> None:
            nonlocal sent
            sent = {tp: om for tp, om in offsets.items() if self._may_commit(tp.topic, tp.partition)}
            if sent:
                self._consumer.commit(offsets=sent, timeout_ms=_COMMIT_ATTEMPT_MS)

        try:
            self._commit_retry.call(attempt)
        except Exception as exc:
            self._commit_failed(positions)
            raise translate_kafka_error(exc, "committing offsets") from exc
        if sent:
            self._committed(sent)

    def _committable(self, only: set[tuple[str, int]] | None) -> tuple[dict[Any, int], dict[Any, Any]]:
        """Positions to commit and their kafka-python offsets; flushes the dead letters first."""
        from kafka.structs import OffsetAndMetadata, TopicPartition

        positions = self._tracker.committable(
            lambda k: self._may_commit(k[0], k[1]) and (only is None or (k[0], k[1]) in only)
        )
        offsets = {
            TopicPartition(k[0], k[1]): OffsetAndMetadata(
                pos, commit_metadata(self._assigned_ids.get((k[0], k[1]))), -1
            )
            for k, pos in positions.items()
        }
        if offsets and self._dead_letter is not None:
            self._dead_letter.flush(30.0)
        return positions, offsets

    def _commit_failed(self, positions: dict[Any, int]) -> None:
        self.metrics.commits.labels(result="failed").inc()
        self._tracker.forget_reported(positions)  # let the next commit retry these partitions

    def _committed(self, offsets: dict[Any, Any]) -> None:
        self.metrics.commits.labels(result="ok").inc()
        owned = self._consumer.assignment()
        for tp, om in offsets.items():
            self.metrics.committed.labels(topic=tp.topic, partition=str(tp.partition)).set(om.offset)
            if tp not in owned:
                continue  # revoked under the cooperative protocol: highwater() refuses unassigned partitions
            highwater = self._consumer.highwater(tp)
            if highwater is not None:
                lag = max(0, highwater - om.offset)
                self.metrics.committed_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(lag)

    def _assigned(self, assigned: list[Any]) -> None:
        """New partitions: all under an eager assignor, only the added ones under a cooperative one."""
        for tp in assigned:
            key = (tp.topic, tp.partition)
            self._epochs[key] = self._next_epoch
            self._next_epoch += 1
            self.metrics.assigned.labels(topic=tp.topic, partition=str(tp.partition)).inc()
            self._lag_unknown.add(key)
            self._assigned_ids[key] = self._topic_id(tp.topic)
            if self.kafka.start_from != "committed" and key not in self._started:
                self._start_pending.add(key)  # joins the assignment once _seek_to_start has moved it
            else:
                self._assignment.add(key)
                self._unchecked.add(key)  # its committed offset is checked after this poll
        log.info("partitions assigned", extra={"partitions": sorted(f"{t}:{p}" for t, p in self._assignment)})

    def _revoked(self, revoked: list[Any]) -> None:
        """kafka-python 2: commit what is already durable (quick, no waiting on the trainer), forget."""
        keys = {(tp.topic, tp.partition) for tp in revoked}
        try:
            self._commit_now(only=keys)
        except Exception:
            log.warning(
                "commit on revocation failed; the new owner re-reads from the last commit", exc_info=True
            )
        self._forget_partitions(keys)

    async def _revoked_async(self, revoked: list[Any]) -> None:
        """kafka-python 3 (on its IO thread): the same, awaiting the commit instead of blocking."""
        keys = {(tp.topic, tp.partition) for tp in revoked}
        positions: dict[Any, int] = {}
        try:
            positions, offsets = self._committable(keys)
            if offsets:
                await self._consumer.commit_async(offsets=offsets)
                self._committed(offsets)
        except Exception:
            self._commit_failed(positions)
            log.warning(
                "commit on revocation failed; the new owner re-reads from the last commit", exc_info=True
            )
        self._forget_partitions(keys)

    def _lost(self, lost: list[Any]) -> None:
        """The group evicted this member: the partitions may have an owner already, so no commit."""
        log.warning("consumer group membership lost; the new owners re-read from the last commit")
        self._forget_partitions({(tp.topic, tp.partition) for tp in lost})

    def _forget_partitions(self, keys: set[tuple[str, int]]) -> None:
        for topic, partition in keys:
            self.metrics.revoked.labels(topic=topic, partition=str(partition)).inc()
        self._start_pending -= keys
        self._tracker.forget((t, p, self._epochs.get((t, p), 0)) for t, p in keys)
        self._batcher.drop_partitions(lambda t, p: (t, p) not in keys)
        for key in keys:
            self._epochs.pop(key, None)
            self._assignment.discard(key)
            self._seen.pop(key, None)
            self._checks[key[0]].forget(key)
            self._assigned_ids.pop(key, None)
            self._unchecked.discard(key)
            self._lag_unknown.discard(key)

    # ------------------------------------------------------------------ topics that change

    def _watch_topics(self) -> None:
        """Follow the subscribed topics through the consumer's metadata refreshes (before subscribing).

        kafka-python has no public handle on the consumer's cluster metadata,
        and 3.0 does not pass the consumer's ``allow_auto_create_topics`` on to
        its metadata requests, so both are set here.
        """
        self._cluster = self._consumer._client.cluster
        self._cluster.config["allow_auto_create_topics"] = False
        self._cluster.add_listener(self._topics.on_metadata)
        self._topics.quiet()

    def _topic_id(self, topic: str) -> str | None:
        """``topic``'s id in the consumer's metadata now (None: unknown, or a broker without ids)."""
        topic_id = self._cluster.topic_id(topic) if hasattr(self._cluster, "topic_id") else None
        return str(topic_id) if topic_id else None

    def _may_commit(self, topic: str, partition: int) -> bool:
        """Whether a position of this partition still belongs to the topic that is there now.

        Not while the topic is absent (the commit would fail, and if the topic
        is made again before the commit lands, it would put the old topic's
        offsets on the new one), nor once its id differs from the one the
        partition was assigned under.
        """
        if topic in self._topics.absent:
            return False
        assigned = self._assigned_ids.get((topic, partition))
        now = self._topic_id(topic)
        return assigned is None or now is None or assigned == now

    def _apply_topic_changes(self) -> None:
        """Act on what the metadata refreshes showed since the last poll (see :class:`TopicWatch`)."""
        for change in self._topics.changes():
            self._topic_changed(change)

    def _topic_changed(self, change: TopicChange) -> None:
        topic = change.topic
        owned = {k for k in self._assignment | self._start_pending if k[0] == topic}
        if change.kind == "missing":
            self.metrics.topic_missing.labels(topic=topic).set(1)
            log.warning(
                "source topic %s is gone from the cluster (deleted?): not ready until it is back; "
                "what was read from it and not yet committed is dropped",
                topic,
            )
            self._new_epochs(owned)
            for _, partition in owned:
                for gauge in (self.metrics.lag, self.metrics.committed_lag, self.metrics.committed):
                    with contextlib.suppress(KeyError):
                        gauge.remove(topic, str(partition))
        elif change.kind == "back":
            self.metrics.topic_missing.labels(topic=topic).set(0)
            log.info("source topic %s is back with %d partitions", topic, change.partitions)
        elif change.kind == "recreated":
            stale = {k for k in owned if self._assigned_ids.get(k) not in (None, change.new_id)}
            if not stale:  # it was gone long enough to be revoked: the new partitions start afresh
                log.info(
                    "source topic %s was recreated (topic id %s -> %s)", topic, change.old_id, change.new_id
                )
                return
            log.warning(
                "source topic %s was recreated (topic id %s -> %s): %d owned partitions restart at "
                "source.auto_offset_reset=%s; nothing read from the old topic is committed on the new one",
                topic,
                change.old_id,
                change.new_id,
                len(stale),
                self.kafka.auto_offset_reset,
            )
            self._reset_offsets(stale, "topic_recreated")
        else:
            log.info(
                "source topic %s grew from %d to %d partitions; the group rebalances to read the new ones",
                topic,
                change.before,
                change.partitions,
            )

    def _new_epochs(self, keys: set[tuple[str, int]]) -> None:
        """Start ``keys`` over, still owned: forget what was read under the old epoch.

        Batches of the old epoch that the trainer still holds are then ignored
        when it reports them durable, so their positions are never committed.
        """
        if not keys:
            return
        self._tracker.forget((t, p, self._epochs.get((t, p), 0)) for t, p in keys)
        self._batcher.drop_partitions(lambda t, p: (t, p) not in keys)
        for key in keys:
            self._epochs[key] = self._next_epoch
            self._next_epoch += 1
            self._seen.pop(key, None)
            self._checks[key[0]].forget(key)

    def _reset_offsets(self, keys: set[tuple[str, int]], reason: str) -> None:
        """Move owned partitions to ``auto_offset_reset`` under a new epoch, and count why."""
        from kafka.structs import TopicPartition

        owned = self._consumer.assignment()
        tps = [tp for tp in (TopicPartition(t, p) for t, p in sorted(keys)) if tp in owned]
        if not tps:
            return
        self._new_epochs({(tp.topic, tp.partition) for tp in tps})
        # seek_to_* resolve at the next poll, exactly as kafka-python's own auto_offset_reset does.
        if self.kafka.auto_offset_reset == "earliest":
            self._consumer.seek_to_beginning(*tps)
        else:
            self._consumer.seek_to_end(*tps)
        for tp in tps:
            self._assigned_ids[(tp.topic, tp.partition)] = self._topic_id(tp.topic)
        self.metrics.offset_resets.labels(reason=reason).inc(len(tps))

    def _check_committed(self) -> set[tuple[str, int]]:
        """Check the committed offsets of newly assigned partitions; the keys moved.

        An offset committed for another incarnation of the topic (its
        metadata names another topic id), or beyond the partition's end
        (brokers that keep a deleted topic's offsets), is no place to read
        from: those partitions go to ``auto_offset_reset``. Runs on the poll
        thread after the ``poll`` that assigned them (both lookups block); the
        caller drops what that ``poll`` read from the old position.
        """
        from kafka.errors import KafkaError
        from kafka.structs import TopicPartition

        unchecked, self._unchecked = self._unchecked, set()
        keys = {k for k in unchecked if k in self._assignment}
        tps = [TopicPartition(t, p) for t, p in sorted(keys)]
        if not tps:
            return set()
        try:
            ends = self._consumer.end_offsets(tps)
            committed = {tp: self._consumer.committed(tp, metadata=True) for tp in tps}
        except KafkaError as exc:
            # kafka-python's own reset still moves an offset beyond the end, only without a count.
            log.warning("could not check the committed offsets of %d partitions: %s", len(tps), exc)
            return set()
        stale: dict[str, dict[tuple[str, int], str]] = {"topic_recreated": {}, "offset_beyond_end": {}}
        for tp in tps:
            om = committed.get(tp)
            if om is None:
                continue
            key = (tp.topic, tp.partition)
            was, now = committed_topic_id(om.metadata), self._assigned_ids.get(key)
            end = ends.get(tp)
            if was is not None and now is not None and was != now:
                stale["topic_recreated"][key] = f"{tp.topic}:{tp.partition} committed {om.offset} under {was}"
            elif end is not None and om.offset > end:
                stale["offset_beyond_end"][key] = (
                    f"{tp.topic}:{tp.partition} committed {om.offset}, end {end}"
                )
        moved: set[tuple[str, int]] = set()
        for reason, found in stale.items():
            if found:
                log.warning(
                    "committed offsets not valid on the topic (%s): %s; they restart at "
                    "source.auto_offset_reset=%s",
                    reason,
                    ", ".join(found.values()),
                    self.kafka.auto_offset_reset,
                )
                self._reset_offsets(set(found), reason)
                moved |= set(found)
        return moved

    def _fell_back(self, key: tuple[str, int], offset: int) -> None:
        """kafka-python moved a position back by itself: it was out of range, beyond the partition's end.

        That happens when a topic is truncated or made again without a new
        topic id. The partition starts a new epoch, so the records before the
        jump are never committed over the ones after it.
        """
        log.warning(
            "source partition %s:%d was read up to offset %d and now returns %d: the position was beyond "
            "its end and kafka-python moved it to source.auto_offset_reset=%s",
            key[0],
            key[1],
            self._seen[key],
            offset,
            self.kafka.auto_offset_reset,
        )
        self._new_epochs({key})
        self.metrics.offset_resets.labels(reason="offset_beyond_end").inc()

    def _shutdown(self) -> None:
        try:
            if self._consumer is not None:
                try:
                    self._drain_commits(final=True)
                except Exception:
                    log.warning("final commit failed", exc_info=True)
        finally:
            if self._dead_letter is not None:
                try:
                    self._dead_letter.close()
                except Exception:
                    log.warning("closing the dead-letter producer failed", exc_info=True)
            self._topics.unquiet()
            if self._cluster is not None:
                self._cluster.remove_listener(self._topics.on_metadata)
            if self._consumer is not None:
                try:
                    self._consumer.close(autocommit=False)
                except Exception:
                    log.warning("closing the kafka consumer failed", exc_info=True)


def _rebalancing(exc: BaseException) -> bool:
    """Whether a commit failed only because this member's group is rebalancing (retry after a poll)."""
    from kafka.errors import RebalanceInProgressError

    return isinstance(exc, RebalanceInProgressError) or isinstance(exc.__cause__, RebalanceInProgressError)


def _is_kafka_error(exc: BaseException) -> bool:
    from kafka.errors import KafkaError

    return isinstance(exc, KafkaError)
