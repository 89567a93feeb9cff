"""The pipeline's two worker stages: prefetch in front of the step, write-behind after it.

:class:`~kelp.daemon.pipeline.TrainPipeline` owns one of each and runs the
step between them; nothing else builds them outside tests.

* :class:`Prefetcher` polls the next micro-batch and pulls its unique ids'
  rows while the current batch trains. ``depth=0`` does the same work inline
  in :meth:`Prefetcher.next` (strictly sequential training).
* :class:`PushWriter` pushes a trained batch's updates and acknowledges steps
  in order to the :class:`~kelp.daemon.ledger.UpdateLedger`, which keeps the
  prefetched rows exact. A push returns a ticket, and the writer commits a
  batch's offsets once ``store.durable_through()`` covers its ticket.
  Durability is the store's rule, not this module's: write-through backends
  are durable at once, the hot tier names the pushes its write-back schedule
  has covered. Draining forces the write-back, then commits everything.

Both run store calls through an :class:`~kelp.daemon.outage.OutageGuard`.
A worker thread that fails hands its exception to the main thread, which
stops the process with it: no thread dies silently and nothing hangs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass

import numpy as np

from kelp.consumers.base import Source
from kelp.consumers.batch import MicroBatch
from kelp.consumers.errors import SourceClosedError
from kelp.daemon.ledger import UpdateLedger
from kelp.daemon.outage import OutageGuard
from kelp.store.base import EmbeddingStore, PullResult
from kelp.store.hot.working_copy import Reservation, WorkingCopy
from kelp.store.policy.fallback import PullPlan
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.optim import RowWiseAdagrad, SparseUpdate

__all__ = ["END", "Prefetcher", "Prepared", "PushWriter", "training_occurrences", "training_pull"]

log = logging.getLogger("kelp.train")
_POLL_S = 0.2


@dataclass
class Prepared:
    """A micro-batch with its rows pulled, waiting to train; ``plan``: what was pulled, and why.

    The plan is computed once, here, and the step trains on the same one
    (``TrainStep(..., plan=)``), so the fallback buckets are not worked out twice.
    """

    batch: MicroBatch
    pulled: dict[str, PullResult]
    watermark: int
    pull_s: float
    plan: PullPlan
    reservation: Reservation | None = None
    """Set when the rows were reserved in a working copy: ``pulled`` is empty, the step gathers them."""

    @property
    def ids(self) -> dict[str, np.ndarray]:
        """What was pulled, per table."""
        return self.plan.ids


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()
"""The source is exhausted (file sources): train what is queued, then drain."""


@dataclass
class _Failed:
    error: BaseException


@dataclass(eq=False)
class _Stage:
    """What both pipeline stages work with: the source, the store (through the outage guard), the ledger.

    ``depth``: batches the stage may hold in its queue.
    """

    source: Source
    store: EmbeddingStore
    ledger: UpdateLedger
    _: KW_ONLY
    guard: OutageGuard
    metrics: TrainerMetrics
    depth: int


@dataclass(eq=False)
class Prefetcher(_Stage):
    """Polls micro-batches and pulls their rows ahead of training (``depth`` batches, 0 = inline).

    ``plan`` says what a batch needs pulled (``TrainStep.pull_plan``: its
    tables' unique ids plus their fallback buckets); by default the unique ids.
    """

    plan: Callable[[MicroBatch], PullPlan] | None = None
    working: WorkingCopy | None = None
    """Reserve each batch's rows in this working copy instead of pulling copies of them."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._queue: queue.Queue[Prepared | _End | _Failed] = queue.Queue(maxsize=max(1, self.depth))
        self._thread: threading.Thread | None = None
        self._exhausted = False

    def start(self) -> None:
        if self.depth > 0:
            self._thread = threading.Thread(target=self._run, name="kelp-prefetch", daemon=True)
            self._thread.start()

    def next(self, timeout_s: float) -> Prepared | _End | None:
        """The next prepared batch, :data:`END`, or None after ``timeout_s``. Re-raises a worker failure."""
        if self._thread is None:
            if self._exhausted:
                return END
            got = self._prepare(timeout_s)
            if got is END:
                self._exhausted = True
            return got
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        self.metrics.queue_depth.labels(queue="prefetch").set(self._queue.qsize())
        if isinstance(item, _Failed):
            raise item.error
        if isinstance(item, _End):
            self._queue.put(item)  # stays at the end for any later call
        return item

    def stop(self, wait: bool = True) -> None:
        """Stop fetching; batches already prepared are dropped (not committed, so read again later).

        ``wait=False`` only asks: the thread may still finish a poll (up to its 0.2 s timeout) or a
        pull, which the drain's push and flush need not wait for; call again to join it."""
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(timeout=10)
        if wait and self.working is not None:  # dropped batches: their rows need not stay pinned
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Prepared) and item.reservation is not None:
                    self.working.release(item.reservation)

    def _prepare(self, timeout_s: float) -> Prepared | _End | None:
        try:
            batch = self.source.poll(timeout_s=timeout_s)
        except SourceClosedError:
            return END
        if batch is None or self._stop.is_set():  # stopping: a batch polled now would be dropped unpulled
            return None
        started = time.perf_counter()
        if self.plan is not None:
            plan = self.plan(batch)
        else:
            plan = PullPlan({table: t.unique_ids for table, t in batch.tables.items()}, {})
        working = self.working
        reservation, pulled, watermark = None, {}, 0
        if working is not None:
            occurrences = training_occurrences(batch)
            reservation = self.guard.call("pull", lambda: working.reserve(plan.ids, occurrences=occurrences))
        else:
            watermark = self.ledger.begin_pull()
            pulled = self.guard.call("pull", lambda: training_pull(self.store, batch, plan.ids))
        pull_s = time.perf_counter() - started
        self.metrics.stage_seconds.labels(stage="pull").observe(pull_s)
        return Prepared(batch, pulled, watermark, pull_s, plan, reservation)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._prepare(_POLL_S)
                if item is None:
                    continue
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=_POLL_S)
                        break
                    except queue.Full:
                        continue
                if item is END:
                    return
        except BaseException as exc:
            self._queue.put(_Failed(exc))


def training_pull(
    store: EmbeddingStore, batch: MicroBatch, ids: Mapping[str, np.ndarray]
) -> dict[str, PullResult]:
    """A trainer's pull of ``ids`` for ``batch``: admission counts each id's occurrences in the batch."""
    return store.pull_many(ids, occurrences=training_occurrences(batch))


def training_occurrences(batch: MicroBatch) -> dict[str, np.ndarray]:
    """Per table, how often each of ``batch``'s unique ids occurs in it (what admission counts)."""
    return {table: np.bincount(t.inverse, minlength=len(t.unique_ids)) for table, t in batch.tables.items()}


@dataclass
class _Pending:
    step: int
    batch: MicroBatch | None
    """None: a group step this rank trained no batch in, pushing rows it owns (no offsets to commit)."""
    updates: Mapping[str, SparseUpdate]
    grads: Mapping[str, np.ndarray]
    ticket: int = 0
    """The store's ticket for this step's push; a step with nothing to push takes the last one issued
    (it is durable once every earlier push is)."""
    refresh: Mapping[str, SparseUpdate] | None = None
    """Rows other ranks own, as their owners stepped them: the store's copies take them (row owners)."""
    applied: bool = False
    """The step's rows were already written in place (a working copy): ``ticket`` is theirs, nothing
    is pushed here."""


@dataclass(eq=False)
class PushWriter(_Stage):
    """Pushes, acknowledges, commits once durable; in order, on its own thread (``depth`` batches).

    Each push returns a ticket; after each push it asks the store which tickets
    are durable (``durable_through()``): a write-through store's at once, so every
    batch pushed so far is committed; a store that writes back on its own
    schedule (the hot tier) names the highest durable ticket, and only the
    batches up to it are committed. This writer never reads that schedule, so
    there is one copy of it. While no batch arrives it still asks every ``idle_flush_s``, so a
    time-bounded write-back happens and its offsets are committed on an idle
    stream too. ``threaded=False`` does the work inline in :meth:`submit`.
    """

    threaded: bool = True
    idle_flush_s: float = 1.0
    adagrad: RowWiseAdagrad | None = None
    """Set (``store.sparse_updates: compose``): send gradients and let the store apply this optimizer."""
    gated: bool = False
    """Commit a step's offsets only once :meth:`open_gate` reached it, not as soon as this rank's own
    pushes are durable: in a trainer group with row owners, other ranks push some of this rank's
    updates, so its offsets wait until every rank's pushes of that step are durable."""

    def __post_init__(self) -> None:
        self._queue: queue.Queue[_Pending | None] = queue.Queue(maxsize=self.depth)
        self._error: BaseException | None = None
        self._not_durable: list[_Pending] = []
        self._durable: list[_Pending] = []  # durable here, offsets waiting for the gate
        self._last_ticket = 0
        self._thread: threading.Thread | None = None
        self.committed_step = self.ledger.acked
        self.durable_step = self.ledger.acked
        """Every step up to this one that this writer pushed is durable (read by the training thread)."""
        self._gate: int | None = self.ledger.acked if self.gated else None

    def start(self) -> None:
        if self.threaded:
            self._thread = threading.Thread(target=self._run, name="kelp-push", daemon=True)
            self._thread.start()

    def check(self) -> None:
        """Re-raise a failure of the writer thread on the caller's thread."""
        if self._error is not None:
            raise self._error

    def submit(
        self,
        step: int,
        batch: MicroBatch | None,
        updates: Mapping[str, SparseUpdate],
        grads: Mapping[str, np.ndarray] | None = None,
        *,
        refresh: Mapping[str, SparseUpdate] | None = None,
        ticket: int | None = None,
    ) -> None:
        """Queue a trained step (its row grads too, for ``adagrad``); blocks while ``depth`` are in flight.

        ``refresh``: rows other ranks own as they stepped them, for the store's copies
        (:meth:`~kelp.store.base.EmbeddingStore.refresh`), before the step is acknowledged.
        ``ticket``: the step's rows were written in place already (a working copy's
        :meth:`~kelp.store.hot.working_copy.WorkingCopy.apply`), under this ticket; nothing is pushed.
        """
        item = _Pending(step, batch, updates, grads or {}, refresh=refresh)
        if ticket is not None:
            item.ticket, item.applied = ticket, True
        if self._thread is None:
            self._write(item)
            return
        while True:
            self.check()
            try:
                self._queue.put(item, timeout=_POLL_S)
                break
            except queue.Full:
                continue
        self.metrics.queue_depth.labels(queue="push").set(self._queue.qsize())

    def open_gate(self, step: int) -> None:
        """Offsets of steps up to ``step`` may be committed once durable here (``gated`` writers).

        The writer thread commits them at its next push or idle flush; once it has stopped
        (after :meth:`drain`) the caller's thread commits them at once.
        """
        self._gate = step if self._gate is None else max(self._gate, step)
        if self._thread is None or not self._thread.is_alive():
            self._commit_ready()

    def drain(self, timeout_s: float) -> bool:
        """Push, flush and commit everything submitted; False if that did not finish in ``timeout_s``.

        A ``gated`` writer commits only up to its gate; :meth:`open_gate` commits the rest."""
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            while True:
                self.check()
                try:
                    self._queue.put(None, timeout=max(0.01, min(_POLL_S, deadline - time.monotonic())))
                    break
                except queue.Full:
                    if time.monotonic() >= deadline:
                        return False
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                return False
            self.check()
        self._commit_durable(force=True)
        return True

    # ------------------------------------------------------------------ the writer's work

    def _run(self) -> None:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=self.idle_flush_s)
                except queue.Empty:
                    self._commit_durable(force=False)
                    continue
                if item is None:
                    return
                self._write(item)
                self.metrics.queue_depth.labels(queue="push").set(self._queue.qsize())
        except BaseException as exc:
            self._error = exc

    def _write(self, item: _Pending) -> None:
        started = time.perf_counter()
        if item.applied:
            ticket: int | None = item.ticket
        else:
            ticket = self._push({t: u for t, u in item.updates.items() if len(u.ids)}, item.grads)
        if ticket is not None:
            self._last_ticket = max(self._last_ticket, ticket)
        item.ticket = self._last_ticket
        if item.refresh:
            self.store.refresh({t: (u.ids, u.rows, u.state) for t, u in item.refresh.items()})
        self.metrics.stage_seconds.labels(stage="push").observe(time.perf_counter() - started)
        self.ledger.acknowledge(item.step)  # readable by any pull that begins from now on
        self.metrics.inflight_rows.set(self.ledger.rows())
        self._not_durable.append(item)
        self._commit_durable(force=False)

    def _push(self, updates: Mapping[str, SparseUpdate], grads: Mapping[str, np.ndarray]) -> int | None:
        """The push's ticket; None when there is nothing to push."""
        if not updates:
            return None
        adagrad = self.adagrad
        if adagrad is None:
            rows = {t: (u.ids, u.rows, u.state) for t, u in updates.items()}
            return self.guard.call("push", lambda: self.store.push_many(rows))
        payload = {t: (u.ids, u.rows, u.state, grads[t]) for t, u in updates.items()}
        lr, eps = adagrad.lr, adagrad.eps
        return self.guard.call("push", lambda: self.store.apply_adagrad_many(payload, lr, eps))

    def _commit_durable(self, force: bool) -> None:
        """Commit every batch pushed so far whose push the store says is durable (and, ``gated``,
        whose step the gate has reached).

        The only place offsets are committed. ``force`` (the drain) makes the
        store write everything buffered first.
        """
        if self._not_durable:
            through = self.guard.call("push", lambda: self.store.durable_through(force=force))
            done = 0  # a prefix: tickets rise in the order batches were pushed
            while done < len(self._not_durable) and self._not_durable[done].ticket <= through:
                done += 1
            if done:
                self._durable.extend(self._not_durable[:done])
                del self._not_durable[:done]
                self.durable_step = self._durable[-1].step
        self._commit_ready()

    def _commit_ready(self) -> None:
        gate = self._gate
        ready = len(self._durable)
        if gate is not None:
            ready = 0
            while ready < len(self._durable) and self._durable[ready].step <= gate:
                ready += 1
        if not ready:
            return
        started = time.perf_counter()
        durable, self._durable = self._durable[:ready], self._durable[ready:]
        ranges = [r for item in durable if item.batch is not None for r in item.batch.sources]
        if ranges:
            self.source.commit(ranges)
        self.committed_step = durable[-1].step
        self.metrics.stage_seconds.labels(stage="commit").observe(time.perf_counter() - started)
