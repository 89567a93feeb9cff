"""``kelp join`` as a process: Kafka in, decisions, Kafka out, state, commit, in that order.

Each step of the loop:

1. polls up to ``join.max_poll_records`` input records (impressions and actions);
2. asks the :class:`~kelp.join.joiner.Joiner` what they and the watermark decide;
3. sends the labelled events and dead letters, and waits until Kafka acknowledged
   every one of them (a send refused for a passing reason is retried, never
   skipped; an event Kafka refuses for good, too large for the topic, is replaced
   by a dead letter of its impression, so one record cannot hold the join);
4. applies the step's state changes to the waiting store in one transaction;
5. commits the input offsets the step covered, without waiting for the answer: the
   next step goes on meanwhile, and the join waits for a last commit of every
   applied step when it stops. A commit that fails, or is still on the way at a
   crash, only means its records are read again.

A crash after 3 sends the step's events again when the records are read again,
with the same sample ids; after 4 the state already says what was emitted.
Either way nothing acknowledged is lost, and what repeats is limited to the
records after the last commit. SIGTERM finishes the step under way, then stops.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.consumers.deadletter import RejectLog
from kelp.consumers.kafka_client import (
    RECORD_BATCH_BYTES,
    client_settings,
    consumer_settings,
    keep_rejoin_going,
)
from kelp.errors import StoreUnavailableError
from kelp.join.joiner import InputRecord, Joiner, Output, Rejected, Step
from kelp.join.metrics import JoinMetrics
from kelp.join.pending import PendingState
from kelp.join.records import load_action_decoders
from kelp.join.state import RedisWaitingStore, WaitingStore
from kelp.redaction import redact_url

__all__ = ["JoinProcess", "join_redis_url", "shared_redis_note"]

log = logging.getLogger("kelp.join")

_POLL_MS = 200
_RETRY_S = 1.0
_STATS_EVERY_S = 2.0


_SIZE_ERRORS = frozenset({"MessageSizeTooLargeError", "RecordListTooLargeError"})
"""Kafka's refusals of a record (or its batch of one) as larger than the topic or producer allows."""


def join_redis_url(cfg: KelpConfig) -> str:
    """The Redis of the waiting impressions: ``join.redis_url``, else the store's first url."""
    return cfg.join.redis_url or cfg.store.urls[0]


def shared_redis_note(cfg: KelpConfig) -> str | None:
    """One line when the waiting state shares the embedding store's Redis (``join.redis_url`` unset)."""
    if cfg.join.redis_url is not None or not cfg.store.urls:
        return None
    return (
        f"join.redis_url is not set: the waiting state uses the embedding store's Redis "
        f"({redact_url(cfg.store.urls[0])}), sharing its memory and its maxmemory-policy (an evicting "
        "policy may drop waiting impressions and their labels); set join.redis_url to a standalone Redis"
    )


@dataclass(frozen=True, slots=True)
class _Send:
    """One message of a step: a labelled event (``output``) or a dead letter (``rejected``)."""

    topic: str
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    output: Output | None = None
    rejected: Rejected | None = None


@dataclass
class _InFlight:
    """A decided step whose events are on their way: applied and committed once all are acknowledged."""

    step: Step
    last: dict[Any, int]
    now: float
    started: float
    sends: list[_Send]
    futures: list[Any]


class JoinProcess:
    """The joiner's loop over one consumer, one producer and one waiting store.

    ``consumer``, ``producer`` and ``store`` may be given (tests); otherwise they
    are built from ``cfg`` when :meth:`run` starts.
    """

    def __init__(
        self,
        cfg: KelpConfig,
        *,
        store: WaitingStore | None = None,
        consumer: Any = None,
        producer: Any = None,
        metrics: JoinMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(cfg.source, KafkaSourceConfig):
            raise ValueError("kelp join needs a kafka source")
        self.cfg = cfg
        self.join = cfg.join
        # The config model already refused an output topic this config's trainer reads as JSON.
        self.output_topic = cfg.join_output_topic or cfg.source.topics[0]
        self.metrics = metrics or JoinMetrics()
        self.clock = clock
        self._store = store
        self._consumer = consumer
        self._producer = producer
        self._last_seen: dict[tuple[str, int], float] = {}
        self._started = clock()
        self._stats_at = 0.0
        self.last_step_at = time.monotonic()
        self.ready = False
        self.last_step: Step | None = None
        self._applied: dict[Any, int] = {}  # per partition, the last offset whose step is applied
        self._in_flight: _InFlight | None = None
        self.samples_emitted = 0
        """Candidates sent in labelled events (late corrections aside) by the steps finished so far."""
        # Rejected inputs are logged as they come (the first of each reason at once, then a line per
        # interval), so a stream of unreadable actions is seen in the log, not only as a counter.
        self.reject_log = RejectLog()

    # -- wiring ------------------------------------------------------------------------------------

    def _open(self) -> None:
        source = self.cfg.source
        assert isinstance(source, KafkaSourceConfig)
        if self._store is None:
            from kelp.store.redis.connection import connect_node, connection_options

            client = connect_node(join_redis_url(self.cfg), connection_options(self.cfg.store))
            self._store = RedisWaitingStore(client, self.cfg.deployment)
        if self._producer is None:
            from kafka import KafkaProducer

            # Not idempotent: an idempotent producer takes any refusal that is not retriable (one event
            # over the topic's max.message.bytes) as fatal and fails every later send, stopping the join
            # for good; the joiner's repeats already carry stable sample ids.
            self._producer = KafkaProducer(
                **client_settings(source),
                acks="all",
                linger_ms=5,
                batch_size=RECORD_BATCH_BYTES,
                retries=5,
                max_request_size=16 << 20,
                enable_idempotence=False,
            )
        if self._consumer is None:
            from kafka import KafkaConsumer

            settings = consumer_settings(source)
            settings.update(group_id=self.join.group_id, max_poll_records=self.join.max_poll_records)
            self._consumer = KafkaConsumer(**settings)
        self._consumer.subscribe([self.join.impressions_topic, *(a.topic for a in self.join.actions)])
        load_action_decoders(self.join.actions)  # a plug-in that cannot be made stops here, reading nothing
        tasks = [t.name for t in self.cfg.features.tasks]
        self._pending = PendingState(self._store)
        self.joiner = Joiner(self.join, tasks, self._pending)
        self._warn_stored_watermark()
        self.ready = True

    def _warn_stored_watermark(self) -> None:
        """Say so when the stored watermark is past the wall clock: every window would close at once."""
        wm = self.joiner.watermark.value
        now = self.clock()
        if wm is not None and wm > now + self.join.max_future_skew_s:
            log.warning(
                "join: the stored watermark (%.3f) is %.0f s past the wall clock: every impression will "
                "close at once and every action be an orphan; see docs/join.md (repair the watermark)",
                wm,
                wm - now,
            )

    def close(self) -> None:
        self._commit_applied()
        for part in (self._consumer, self._producer, self._store):
            if part is not None:
                try:
                    part.close()
                except Exception as exc:  # closing is best effort: the offsets and state are already safe
                    log.debug("join: close: %s", exc)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, until: Callable[[], bool] | None = None) -> None:
        """Join until ``stop`` is set (or ``until()`` is true after a step).

        A waiting store that stops answering ends the run with a
        :class:`~kelp.errors.StoreUnavailableError` (exit 1): nothing after the last
        commit was lost, and a restart (the kubelet's) reads it again.
        """
        import redis

        note = shared_redis_note(self.cfg)
        if note is not None:
            log.warning("join: %s", note)
        self._open()
        try:
            while not stop.is_set():
                self.step_once(stop)
                if until is not None and until():
                    break
            self.drain(stop)
        except redis.RedisError as exc:
            raise StoreUnavailableError(
                f"join: the waiting store ({redact_url(join_redis_url(self.cfg))}) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self.close()

    def step_once(self, stop: threading.Event) -> Step | None:
        """Poll and decide a step and send its events; then finish the step before it.

        The step before was decided and sent one call earlier: its acknowledgements arrived while
        this one polled and decided (which reads its unapplied changes through
        :class:`~kelp.join.pending.PendingState`). Finishing it waits for any still missing, then
        applies its changes and commits its offsets. A step with nothing to send is finished in
        the same call, so an idle stream waits in ``poll``, not in a loop. Returns the newest step
        finished by this call; None when none was, or a delivery was cut short by ``stop``.
        """
        started = time.perf_counter()
        timeout_ms = 0 if self._in_flight is not None else _POLL_MS
        polled = self._consumer.poll(timeout_ms=timeout_ms, max_records=self.join.max_poll_records)
        keep_rejoin_going(self._consumer)  # a join this poll's timeout cut short
        now = self.clock()
        records: list[InputRecord] = []
        last: dict[Any, int] = {}
        for tp, batch in polled.items():
            self._last_seen[(tp.topic, tp.partition)] = now
            for r in batch:
                records.append(InputRecord(tp.topic, tp.partition, r.offset, r.value, r.timestamp))
            last[tp] = batch[-1].offset
        assigned = [(tp.topic, tp.partition) for tp in self._consumer.assignment()]
        step = self.joiner.step(records, now, assigned, self._idle(assigned, now))
        self._pending.stage(step.changes)
        launched = self._launch(step, last, now, started)
        earlier, self._in_flight = self._in_flight, launched
        finished = None
        if earlier is not None:
            finished = self._finish(earlier, stop)
            if finished is None:
                return None
        if not launched.futures:
            self._in_flight = None
            finished = self._finish(launched, stop)
        return finished

    def _launch(self, step: Step, last: dict[Any, int], now: float, started: float) -> _InFlight:
        """Send ``step``'s events and dead letters without waiting for Kafka's answers."""
        sends = [self._event(out) for out in step.outputs]
        if self.join.dead_letter_topic is not None:
            sends += [self._dead_letter(r) for r in step.rejected]
        return _InFlight(step, last, now, started, sends, [self._send(s) for s in sends])

    def _finish(self, flight: _InFlight, stop: threading.Event) -> Step | None:
        """Wait for ``flight``'s acknowledgements, apply its changes, commit its offsets; None (and
        nothing staged applied) when ``stop`` cut the wait short: the records are read again."""
        if not self._acknowledged(flight.step, flight.sends, flight.futures, stop):
            self._pending.discard()
            self._in_flight = None
            return None
        self._pending.apply(flight.step.changes)
        if flight.last:
            self._commit(flight.last)
        self._count(flight.step, flight.now)
        self.metrics.step_seconds.observe(time.perf_counter() - flight.started)
        self.last_step_at = time.monotonic()
        self.last_step = flight.step
        self.samples_emitted += sum(out.rows for out in flight.step.outputs if not out.late)
        return flight.step

    def drain(self, stop: threading.Event) -> None:
        """Finish the step still in flight (at the end of :meth:`run`): its events are out, so its
        state and offsets follow once they are acknowledged; ``stop`` set means no resend."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            self._finish(flight, stop)

    def _idle(self, assigned: list[tuple[str, int]], now: float) -> set[tuple[str, int]]:
        """Partitions that are caught up and gave nothing for ``idle_partition_s``."""
        from kafka.structs import TopicPartition

        idle = set()
        for topic, partition in assigned:
            seen = self._last_seen.get((topic, partition), self._started)
            if now - seen < self.join.idle_partition_s:
                continue
            tp = TopicPartition(topic, partition)
            high = self._consumer.highwater(tp)
            try:
                position = self._consumer.position(tp, timeout_ms=100)
            except Exception:  # no position yet (a fetch of its offset still under way)
                position = None
            if high is not None and position is not None and position >= high:
                idle.add((topic, partition))  # not yet fetched (no high watermark) is not caught up
        return idle

    def _deliver(self, step: Step, stop: threading.Event) -> bool:
        """Send the step's events and dead letters and wait until Kafka acknowledged every one."""
        flight = self._launch(step, {}, self.clock(), time.perf_counter())
        return self._acknowledged(step, flight.sends, flight.futures, stop)

    def _acknowledged(
        self, step: Step, sends: list[_Send], futures: list[Any], stop: threading.Event
    ) -> bool:
        """Wait for the answers to ``sends``; False when ``stop`` ended a wait to send some again.

        A send refused for a passing reason (a broker away, a leader moving) is sent again until
        acknowledged, holding the step. A refusal no retry changes (the record is larger than the
        topic allows, or otherwise invalid) is replaced: a labelled event by a dead letter of its
        impression (it leaves ``step.outputs``), a dead letter by the same without its value. With
        no ``dead_letter_topic`` the refused event is only counted and logged at ERROR, and the step
        commits past it: its labels are lost.
        """
        pending = sends
        while pending:
            _wait(futures)
            failed = [
                (s, exc) for s, f in zip(pending, futures, strict=True) if (exc := _failure(f)) is not None
            ]
            pending, held = [], []
            for send, exc in failed:
                replaced = self._replace(send, exc, step) if _permanent(exc) else None
                if replaced is None:
                    held.append((send, exc))
                else:
                    pending += replaced
            if held:
                self.metrics.send_failures.inc()
                log.warning(
                    "join: %d of %d sends failed (%s); sending them again",
                    len(held),
                    len(futures),
                    held[0][1],
                )
                if stop.wait(_RETRY_S):
                    return False
                pending += [send for send, _ in held]
            futures = [self._send(s) for s in pending]
        acked = self.clock()
        for out in step.outputs:
            self.metrics.label_delay.labels(
                kind="late" if out.late else ("positive" if _any_positive(out) else "negative")
            ).observe(max(0.0, acked - out.knowable_at))
        return True

    def _send(self, send: _Send) -> Any:
        """The send's future, or the error ``send()`` raised at once (over the producer's own limit)."""
        from kafka.errors import KafkaError

        try:
            return self._producer.send(send.topic, key=send.key, value=send.value, headers=list(send.headers))
        except KafkaError as exc:
            return exc

    def _event(self, out: Output) -> _Send:
        return _Send(self.output_topic, out.value, key=out.key, output=out)

    def _dead_letter(self, rejected: Rejected) -> _Send:
        rec = rejected.record
        headers = [
            ("reason", rejected.reason.encode()),
            ("error", rejected.detail[:1000].encode()),
            ("source_topic", rec.topic.encode()),
        ]
        if rec.partition >= 0:  # an output's impression may have been read in an earlier step
            headers += [
                ("source_partition", str(rec.partition).encode()),
                ("source_offset", str(rec.offset).encode()),
            ]
        assert self.join.dead_letter_topic is not None
        return _Send(self.join.dead_letter_topic, rec.value or b"", headers=tuple(headers), rejected=rejected)

    def _replace(self, send: _Send, exc: Exception, step: Step) -> list[_Send] | None:
        """What to send instead of ``send``, refused for good with ``exc``; None: nothing can replace it.

        A labelled event with no ``dead_letter_topic`` to take its impression is replaced by nothing:
        the step commits past it and its labels are gone, so that is an ERROR, not a WARNING.
        """
        name = type(exc).__name__
        if send.output is not None:
            out = send.output
            reason = "output_too_large" if name in _SIZE_ERRORS else "output_refused"
            rid = out.key.decode("utf-8", "replace")
            detail = (
                f"{name}: the labelled event of request {rid[:200]} ({len(out.value)} bytes, {out.rows} "
                f"samples) was refused by {self.output_topic}: {exc}"
            )
            step.outputs[:] = [o for o in step.outputs if o is not out]  # by identity: fields hold arrays
            record = InputRecord(self.join.impressions_topic, -1, -1, out.source, 0)
            rejected = Rejected(record, "impressions", reason, detail)
            step.rejected.append(rejected)  # counted with the other dead letters
            if self.join.dead_letter_topic is None:
                log.error(
                    "join: %s; no dead_letter_topic is set: the event is dropped (counted as %s)",
                    detail[:500],
                    reason,
                )
                return []
            log.warning("join: %s; its impression is dead-lettered as %s", detail[:500], reason)
            return [self._dead_letter(rejected)]
        if send.value:  # a dead letter: keep its headers (where the record is), drop its value
            log.warning(
                "join: a dead letter (%d bytes) was refused (%s); sent without its value",
                len(send.value),
                name,
            )
            omitted = (("value_omitted", f"{len(send.value)} bytes, {name}".encode()),)
            return [_Send(send.topic, b"", headers=send.headers + omitted, rejected=send.rejected)]
        return None

    def _commit(self, last: dict[Any, int]) -> None:
        """Commit the offsets of an applied step without waiting for the answer (a round trip of
        every step otherwise); a failure, reported to the callback, means those records are read again."""
        self._applied.update(last)
        try:
            self._consumer.commit_async(_offsets(last), callback=self._committed)
        except Exception as exc:  # a rebalance moved the partitions: their next owner reads these again
            self._commit_failed(exc)

    def _committed(self, _offsets: Any, result: Any) -> None:
        if isinstance(result, Exception):
            self._commit_failed(result)

    def _commit_failed(self, exc: Exception) -> None:
        self.metrics.commit_failures.inc()
        log.warning("join: offsets not committed (%s); the records will be read again", exc)

    def _commit_applied(self) -> None:
        """At the end, wait for a commit of every applied step's offsets (the async ones may still
        be on the way): a join stopped by SIGTERM restarts after the last step it finished."""
        if not self._applied or self._consumer is None:
            return
        try:
            # Only partitions still held: a moved one's new owner may be past these offsets already.
            held = set(self._consumer.assignment())
            mine = {tp: offset for tp, offset in self._applied.items() if tp in held}
            if mine:
                self._consumer.commit(_offsets(mine))
        except Exception as exc:
            self._commit_failed(exc)
        self._applied = {}

    def _count(self, step: Step, now: float) -> None:
        m = self.metrics
        for result, n in step.impressions.items():
            m.impressions.labels(result=result).inc(n)
        for (task, result), n in step.actions.items():
            m.actions.labels(task=task, result=result).inc(n)
        for rejected in step.rejected:
            m.rejected.labels(input=rejected.input, reason=rejected.reason).inc()
            self._log_rejected(rejected)
        for kind, n in self.joiner.store.take_corrupt().items():
            m.state_corrupt.labels(kind=kind).inc(n)
        for out in step.outputs:
            if out.late:
                m.late_corrections.inc(out.rows)
                continue
            for task, col in out.labels.items():
                positives = int((col > 0).sum())
                if positives:
                    m.samples.labels(task=task, label="positive").inc(positives)
                if out.rows - positives:
                    m.samples.labels(task=task, label="negative").inc(out.rows - positives)
        if step.negatives_dropped:
            m.negatives_dropped.inc(step.negatives_dropped)
        if step.watermark is not None:
            m.watermark.set(step.watermark)
            m.watermark_lag.set(now - step.watermark)
        if now - self._stats_at >= _STATS_EVERY_S:
            self._stats_at = now
            waiting, stored, early = self.joiner.store.counts()
            m.waiting.set(waiting)
            m.waiting_bytes.set(stored)
            m.early.set(early)

    def _log_rejected(self, rejected: Rejected) -> None:
        """Log an unreadable input record, within the reject log's budget per input and reason."""
        rec = rejected.record
        if rec.partition < 0:  # an output the topic refused: _replace has logged it
            return
        self.reject_log.note(
            f"{rejected.input}:{rejected.reason}",
            f"join: rejected {rejected.input} record ({rejected.reason}): {rejected.detail[:300]}",
            {
                "input": rejected.input,
                "reason": rejected.reason,
                "error": rejected.detail,
                "source": f"{rec.topic}:{rec.partition}:{rec.offset}",
            },
        )


def _offsets(last: dict[Any, int]) -> dict[Any, Any]:
    """Kafka's commit of ``last`` (per partition, the last offset handled): the next one to read."""
    from kafka.structs import OffsetAndMetadata

    return {tp: OffsetAndMetadata(offset + 1, "", -1) for tp, offset in last.items()}


def _any_positive(out: Any) -> bool:
    return any(bool((col > 0).any()) for col in out.labels.values())


def _wait(futures: list[Any]) -> None:
    """Block until every produce future has its answer (the producer's delivery timeout bounds it).

    Not ``producer.flush()``: that would also wait for the next step's events, sent meanwhile.
    """
    for future in futures:
        if isinstance(future, Exception) or future.is_done:
            continue
        with contextlib.suppress(Exception):  # its error is read back from the future by _failure
            future.get()


def _failure(future: Any) -> Exception | None:
    if isinstance(future, Exception):
        return future
    return future.exception if future.failed() else None


def _permanent(exc: Exception) -> bool:
    """A refusal of the record itself, which sending it again cannot change.

    Retriable errors are not, and neither is an authorization error: that refuses every record
    alike, and holding the step (``/healthz`` then fails) is how an operator hears of it.
    """
    from kafka.errors import AuthorizationError, BrokerResponseError

    if not isinstance(exc, BrokerResponseError) or isinstance(exc, AuthorizationError):
        return False
    return type(exc).__name__ in _SIZE_ERRORS or not exc.retriable
