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
"""

from __future__ import annotations

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
from kelp.consumers.decode import Decoder
from kelp.consumers.errors import SourceClosedError, translate_kafka_error
from kelp.consumers.metrics import ConsumerMetrics
from kelp.consumers.offsets import OffsetTracker

__all__ = ["KafkaSource", "client_settings", "consumer_settings"]

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.1
_PAUSED_POLL_S = 0.05
_COMMIT_INTERVAL_S = 0.1  # reported durable offsets are committed at most this often (_drain_commits)


def client_settings(kafka: KafkaSourceConfig) -> dict[str, Any]:
    """kafka-python settings shared by consumers, producers and admin clients (security included)."""
    sec = kafka.security
    out: dict[str, Any] = {
        "bootstrap_servers": list(kafka.bootstrap_servers),
        "client_id": kafka.client_id,
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


def consumer_settings(kafka: KafkaSourceConfig) -> dict[str, Any]:
    """KafkaConsumer settings from the config (auto-commit always off)."""
    return {
        **client_settings(kafka),
        "group_id": kafka.group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": kafka.auto_offset_reset,
        "max_poll_records": kafka.max_poll_records,
        "fetch_max_bytes": kafka.fetch_max_bytes,
        "max_partition_fetch_bytes": kafka.max_partition_fetch_bytes,
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        "max_poll_interval_ms": kafka.max_poll_interval_ms,
        "enable_incremental_fetch_sessions": kafka.incremental_fetch_sessions,
    }


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
        from kafka import KafkaConsumer  # noqa: F401  (fail early if kafka-python is missing)

        self.kafka = kafka
        self.spec = spec
        self.batching = batching or BatchingConfig()
        self.metrics = ConsumerMetrics(registry)
        self._settings = {**consumer_settings(kafka), **(consumer_overrides or {})}
        self._decoder = Decoder(spec, kafka.max_message_bytes)
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
        self._last_commit = float("-inf")  # monotonic time of the last commit sent
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._consumer: Any = None
        self._dead_letter: DeadLetterSink | None = None
        self._assignment: set[tuple[str, int]] = set()
        self._seen: dict[tuple[str, int], int] = {}
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
        """(topic, partition) pairs this member owns now."""
        return set(self._assignment)

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
        except BaseException as exc:
            self._error = translate_kafka_error(exc, "polling") if _is_kafka_error(exc) else exc
            log.error("kafka poll thread failed", exc_info=True)
        finally:
            self._shutdown()

    def _open(self) -> None:
        from kafka import KafkaConsumer

        try:
            self._consumer = KafkaConsumer(**self._settings)
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
        polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        for tp, records in polled.items():
            if not records or (tp.topic, tp.partition) not in self._assignment:
                continue
            t0 = time.perf_counter()
            chunk = self._decoder.decode(records)
            self.metrics.decode_seconds.observe(time.perf_counter() - t0)
            self.metrics.records.labels(topic=tp.topic).inc(len(records))
            self.metrics.bytes.labels(topic=tp.topic).inc(chunk.nbytes)
            self.metrics.samples.labels(topic=tp.topic).inc(chunk.size)
            assert self._dead_letter is not None
            for rejection in chunk.rejections:
                self._dead_letter.reject(rejection)
            self._batcher.add(chunk)
            key = (tp.topic, tp.partition)
            self._seen[key] = chunk.last_offset + 1
            highwater = self._consumer.highwater(tp)
            if highwater is not None:
                self.metrics.lag.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    max(0, highwater - self._seen[key])
                )

    def _offer(self, batch: MicroBatch, wait: bool) -> bool:
        """Queue ``batch``; ``wait``: for up to ``_PAUSED_POLL_S`` until the trainer makes room.

        While paused the thread waits on the queue itself, not in a paused
        ``poll``: a poll cannot end early when the trainer takes a batch, so
        the trainer used to sit idle for the rest of it (up to 50 ms per
        pause, docs/performance.md).
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
        and still costs a round trip to kafka-python's IO thread (1-5 ms each,
        docs/performance.md), so all due batches go out before the next poll.
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
        took 11% of its time, while records waited to be decoded (issue 14,
        docs/performance.md). Reports are therefore gathered and committed at
        most every ``_COMMIT_INTERVAL_S`` (the old per-report commit gathered
        only what came in between two polls), except when a caller waits
        (``commit(..., wait=True)``) and at shutdown (``final``); revocations
        commit on their own. What is committed is unchanged: only what the
        trainer reported durable. A commit that fails is retried after the
        interval even if nothing else is reported.
        """
        futures: list[Future[None]] = []
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
            for fut in futures:
                fut.set_exception(exc)
            if not futures:
                log.warning("offset commit failed; will retry with the next commit", exc_info=True)
            return
        for fut in futures:
            fut.set_result(None)

    def _commit_now(self, only: set[tuple[str, int]] | None = None) -> None:
        positions, offsets = self._committable(only)
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets)
        except Exception as exc:
            self._commit_failed(positions)
            raise translate_kafka_error(exc, "committing offsets") from exc
        self._committed(offsets)

    def _committable(self, only: set[tuple[str, int]] | None) -> tuple[dict[Any, int], dict[Any, Any]]:
        """Positions to commit and their kafka-python offsets; flushes the dead letters first."""
        from kafka.structs import OffsetAndMetadata, TopicPartition

        positions = self._tracker.committable(None if only is None else lambda k: (k[0], k[1]) in only)
        offsets = {TopicPartition(k[0], k[1]): OffsetAndMetadata(pos, "", -1) for k, pos in positions.items()}
        if offsets and self._dead_letter is not None:
            self._dead_letter.flush(30.0)
        return positions, offsets

    def _commit_failed(self, positions: dict[Any, int]) -> None:
        self.metrics.commits.labels(result="failed").inc()
        self._tracker.forget_reported(positions)  # let the next commit retry these partitions

    def _committed(self, offsets: dict[Any, Any]) -> None:
        self.metrics.commits.labels(result="ok").inc()
        for tp, om in offsets.items():
            self.metrics.committed.labels(topic=tp.topic, partition=str(tp.partition)).set(om.offset)
            highwater = self._consumer.highwater(tp)
            if highwater is not None:
                lag = max(0, highwater - om.offset)
                self.metrics.committed_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(lag)

    def _assigned(self, assigned: list[Any]) -> None:
        for tp in assigned:
            key = (tp.topic, tp.partition)
            self._epochs[key] = self._next_epoch
            self._next_epoch += 1
            self._assignment.add(key)
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

    def _forget_partitions(self, keys: set[tuple[str, int]]) -> None:
        self._tracker.forget((t, p, self._epochs.get((t, p), 0)) for t, p in keys)
        self._batcher.drop_partitions(lambda t, p: (t, p) not in keys)
        for key in keys:
            self._epochs.pop(key, None)
            self._assignment.discard(key)
            self._seen.pop(key, None)

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
            if self._consumer is not None:
                try:
                    self._consumer.close(autocommit=False)
                except Exception:
                    log.warning("closing the kafka consumer failed", exc_info=True)


def _is_kafka_error(exc: BaseException) -> bool:
    from kafka.errors import KafkaError

    return isinstance(exc, KafkaError)
