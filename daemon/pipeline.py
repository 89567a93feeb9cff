"""One object runs the trainer's steps: the pull plan, the prefetcher, the in-flight ledger, the push writer.

Modelled on TorchRec's ``TrainPipeline.progress()``: the daemon's loop calls
one verb, :meth:`TrainPipeline.progress`, and gets back what was trained.
Everything a micro-batch meets between the source and the committed offset
sits behind it, in this order::

    source ──poll──> [Prefetcher thread: plan, pull] ──queue──> progress(): ledger.apply,
    TrainStep, ledger.record ──queue──> [PushWriter thread: push, acknowledge, commit once durable]

With a working copy (:mod:`kelp.store.hot.working_copy`, the hot tier of one
trainer) the prefetcher reserves the rows instead of pulling copies, the step
gathers them as they are when it runs and applies its update in place, and
the writer only writes back what is due and commits; no overlay is needed,
because no update is ever in flight::

    source ──poll──> [Prefetcher: plan, reserve] ──queue──> progress(): gather, TrainStep, apply
    ──queue──> [PushWriter: write back what is due, commit once durable]

* The plan (each table's unique ids plus fallback buckets) is made once, by
  the prefetcher, and the step trains on that same plan.
* The ledger (:mod:`kelp.daemon.ledger`) makes a prefetched batch see every
  update trained but not yet pushed, so prefetching never trains on stale rows.
* The writer commits offsets only once the store's ``durable_through()``
  covers the batch's push (:mod:`kelp.daemon.stages`).
* Samples the model raised on are handed to :class:`~kelp.daemon.model_errors.ModelErrors`
  before the batch goes to the writer: dead-lettered (and flushed) before its
  offsets can be committed, or, when every sample failed, the batch is held
  back uncommitted until a later batch trains.
* In a trainer group (``owners``) each row has one writer
  (:mod:`kelp.daemon.row_owners`): the step leaves its rows as they were and
  keeps their gradients, every rank sends them to the rows' owners, and this
  rank steps the rows it owns by every rank's gradient in turn and pushes only
  those; the stepped rows go back to the ranks that trained them, into their
  ledgers.

What stays with the daemon (:mod:`kelp.daemon.train`): when to stop, the
group's agreement (``dense_sync``), checkpoints, publishing and reporting.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from kelp.config import TrainerConfig
from kelp.consumers.base import Source
from kelp.consumers.batch import MicroBatch
from kelp.consumers.deadletter import DeadLetterSink, LogDeadLetter
from kelp.consumers.metrics import ConsumerMetrics
from kelp.daemon.ledger import UpdateLedger
from kelp.daemon.model_errors import ModelErrors
from kelp.daemon.outage import OutageGuard
from kelp.daemon.row_owners import Contributions, RowOwners, SentRows
from kelp.daemon.stages import END, Prefetcher, Prepared, PushWriter
from kelp.daemon.written_rows import WrittenRows
from kelp.store.base import EmbeddingStore
from kelp.store.hot.working_copy import WorkingCopy
from kelp.store.rows.id_sets import shared
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.optim import RowWiseAdagrad, SparseUpdate
from kelp.trainer.step import DenseSync, StepResult, TrainStep

__all__ = ["Progress", "TrainPipeline", "Trained"]


@dataclass(frozen=True)
class Trained:
    """A step this pipeline trained: its number, the batch and what the step returned."""

    step: int
    batch: MicroBatch
    result: StepResult


@dataclass(frozen=True)
class Progress:
    """What one :meth:`TrainPipeline.progress` call did.

    ``trained`` is None when no batch was ready (or fetching was off);
    ``exhausted``: the source has ended, so no later call will train.
    """

    trained: Trained | None
    exhausted: bool


class TrainPipeline:
    """Prefetch, train, record, write behind: one step per :meth:`progress` call.

    ``in_store_adagrad`` (``store.sparse_updates: compose``): the step keeps
    its row gradients and the store applies the row-wise Adagrad update, so the
    writer sends gradients rather than finished rows.
    """

    def __init__(
        self,
        source: Source,
        store: EmbeddingStore,
        step: TrainStep,
        settings: TrainerConfig,
        *,
        guard: OutageGuard,
        metrics: TrainerMetrics,
        acked: int,
        in_store_adagrad: bool = False,
        owners: RowOwners | None = None,
        model_errors: ModelErrors | None = None,
    ) -> None:
        if owners is not None and in_store_adagrad:
            raise ValueError("row owners apply sparse updates themselves; compose applies them in the store")
        self.step = step
        self.metrics = metrics
        self.ledger = UpdateLedger(acked=acked)
        self._store = store
        self._guard = guard
        self._owners = owners
        self._adagrad = step.sparse_optimizer
        adagrad: RowWiseAdagrad | None = None
        if in_store_adagrad:
            step.sparse_optimizer = dataclasses.replace(step.sparse_optimizer, keep_grads=True)
            adagrad = step.sparse_optimizer
        if owners is not None:
            step.sparse_optimizer = dataclasses.replace(step.sparse_optimizer, defer=True)
        stage = {"guard": guard, "metrics": metrics}
        self._working = (
            store if isinstance(store, WorkingCopy) and owners is None and adagrad is None else None
        )
        self._prefetcher = Prefetcher(
            source,
            store,
            self.ledger,
            **stage,
            depth=settings.prefetch_batches,
            plan=step.pull_plan,
            working=self._working,
        )
        self._writer = PushWriter(
            source,
            store,
            self.ledger,
            **stage,
            depth=settings.push_queue_batches,
            threaded=settings.prefetch_batches > 0,
            adagrad=adagrad,
            gated=owners is not None,
        )
        self._last_submitted = acked
        self._settled = acked  # the last group step this rank took part in (row owners)
        self._written = WrittenRows() if owners is not None else None
        self._exhausted = False
        self.model_errors = model_errors or ModelErrors(step.spec, _log_only_sink)

    @property
    def exhausted(self) -> bool:
        """The source has ended: what was fetched is trained, nothing more will come."""
        return self._exhausted

    @property
    def working_copy(self) -> WorkingCopy | None:
        """The working copy the steps train in (None: the pipeline pulls copies and pushes updates)."""
        return self._working

    @property
    def owned_rows_submitted_step(self) -> int:
        """In a group with row owners, the last group step whose owned-row updates this rank handed
        to its writer, batch or not (a rank with no batch still applies the updates other ranks
        sent for the rows it owns)."""
        return self._last_submitted

    @property
    def committed_step(self) -> int:
        """The last step whose batch's offsets are committed (durable in the store)."""
        return self._writer.committed_step

    def start(self) -> None:
        """Start the writer, then the prefetcher (stopped in reverse by :meth:`drain`)."""
        self._writer.start()
        self._prefetcher.start()

    def progress(
        self, step_no: int, dense_sync: DenseSync, *, wait_s: float, fetch: bool = True, join: bool = False
    ) -> Progress:
        """Train the next prefetched batch as step ``step_no + 1``, or take part in a step without one.

        Waits up to ``wait_s`` for a batch (``fetch=False``: takes none, as
        when stopping). With no batch, ``join`` (a group, or a stop the group
        must hear of) or an exhausted source runs the step's idle part, so
        ``dense_sync`` is still called once; otherwise nothing happens.
        Re-raises a failure of either worker thread.
        """
        self._writer.check()
        item = self._next(wait_s) if fetch and not self._exhausted else None
        if item is None:
            if join or self._exhausted:
                self.step.idle(dense_sync)
                if self._owners is not None:  # the rows this rank owns may have been trained by others
                    self._settle(step_no + 1, None, {}, {})
            return Progress(None, self._exhausted)
        if item.reservation is not None:
            assert self._working is not None
            pulled = self._working.gather(item.reservation)
        else:
            pulled = self.ledger.apply(item.watermark, item.pulled, item.ids)
        result = self.step(item.batch, pulled, dense_sync, plan=item.plan)
        step = step_no + 1
        verdict = self.model_errors.after(item.batch, result)
        commits = None if verdict.hold else item.batch  # a held batch's offsets wait
        if item.reservation is not None:
            assert self._working is not None
            rows = {t: (u.ids, u.rows, u.state) for t, u in result.updates.items() if len(u.ids)}
            ticket = self._working.apply(item.reservation, rows)
            self._writer.submit(step, commits, {}, ticket=ticket)
        elif self._owners is not None:
            owned = self._settle(step, commits, result.updates, result.grads)
            result = dataclasses.replace(result, updates=owned, grads={})
        else:
            self.ledger.record(step, result.updates)
            self._writer.submit(step, commits, result.updates, result.grads)
        for released in verdict.released:  # dead-lettered now: commit their offsets after this step's
            self._writer.submit(step, released, {})
        self.metrics.inflight_rows.set(self.ledger.rows())
        return Progress(Trained(step, item.batch, result), self._exhausted)

    def _settle(
        self,
        step: int,
        batch: MicroBatch | None,
        bases: Mapping[str, SparseUpdate],
        grads: Mapping[str, np.ndarray],
    ) -> dict[str, SparseUpdate]:
        """The group's sparse update of the rows this rank owns, recorded and handed to the writer.

        ``bases``: this rank's admitted rows as trained (not yet stepped), ``grads`` their gradients.
        Every rank calls it once per group step, with or without a batch. The ledger also records
        the rows other ranks own as their owners stepped them (sent back), so this rank's next
        batches train on them as fresh as on its own rows; only the owned ones are pushed.
        """
        assert self._owners is not None
        self._settled = max(self._settled, step)
        sent = {t: SentRows(u.ids, grads[t], u.rows, u.state) for t, u in bases.items() if len(u.ids)}
        started = time.perf_counter()
        mine = self._owners.exchange(sent, durable_step=self._durable_here(step))
        self._writer.open_gate(self._owners.group_durable)
        updates = self._owned_updates(mine, bases)
        self.metrics.owned_rows_updated.inc(sum(len(u.ids) for u in updates.values()))
        returned = self._owners.return_rows(updates)
        self.metrics.row_exchange_seconds.observe(time.perf_counter() - started)
        if batch is not None or updates or returned:
            self.ledger.record(step, _joined(updates, returned))
            self._writer.submit(step, batch, updates, refresh=returned)
            self._last_submitted = step
        return updates

    def _durable_here(self, step: int) -> int:
        """Every step before ``step`` whose pushes this rank made is durable up to this one."""
        durable = self._writer.durable_step
        return step - 1 if durable >= self._last_submitted else durable

    def _owned_updates(
        self, mine: Contributions, bases: Mapping[str, SparseUpdate]
    ) -> dict[str, SparseUpdate]:
        """Each owned row stepped by every rank's gradient in turn (row-wise Adagrad, rank order).

        The row starts as an exact copy, because this rank is its only writer:
        * this rank's own trained copy where it had one (the ledger patched the pull);
        * else, for a row it has never written in this process, the copy the first sending rank
          trained on: the store still holds what it held before the group started;
        * else one read of the store now, patched by the ledger: its last write may have reached
          the store after the sender read it (:mod:`kelp.daemon.written_rows`).
        """
        assert self._owners is not None and self._written is not None
        ids_of = {table: np.unique(np.concatenate([p.ids for p in parts])) for table, parts in mine.items()}
        rows: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {}
        reread: dict[str, np.ndarray] = {}  # positions of rows whose copy must come from the store
        for table, ids in ids_of.items():
            rows[table] = np.empty((len(ids), self._owners.dims[table]), dtype=np.float32)
            state[table] = np.empty(len(ids), dtype=np.float32)
            have = np.zeros(len(ids), dtype=bool)
            base = bases.get(table)
            if base is not None and len(base.ids):
                at_mine, at_base = shared(ids, base.ids)
                rows[table][at_mine] = base.rows[at_base]
                state[table][at_mine] = base.state[at_base]
                have[at_mine] = True
            missing = np.flatnonzero(~have)
            if not len(missing):
                continue
            written = self._written.maybe(table, ids[missing])
            from_sender = ~have
            from_sender[missing[written]] = False
            for part in reversed(mine[table]):  # the first sender's copy is written last, so it wins
                at = np.searchsorted(ids, part.ids)
                take = from_sender[at]
                rows[table][at[take]] = part.rows[take]
                state[table][at[take]] = part.state[take]
            if written.any():
                reread[table] = missing[written]
        if reread:
            need = {table: ids_of[table][at] for table, at in reread.items()}
            self.metrics.owned_rows_read.inc(sum(len(ids) for ids in need.values()))
            read = self.ledger.side_read(
                lambda: self._guard.call("pull", lambda: self._store.pull_many(need, count=False)), need
            )
            for table, at in reread.items():
                rows[table][at] = read[table].rows
                state[table][at] = read[table].state
        out: dict[str, SparseUpdate] = {}
        for table, parts in mine.items():
            table_rows, table_state = torch.from_numpy(rows[table]), torch.from_numpy(state[table])
            for part in parts:
                at_t = torch.from_numpy(np.searchsorted(ids_of[table], part.ids))
                stepped = self._adagrad.step(
                    table_rows[at_t], table_state[at_t], torch.from_numpy(part.grads)
                )
                table_rows[at_t], table_state[at_t] = stepped
            self._written.add(table, ids_of[table])
            out[table] = SparseUpdate(ids=ids_of[table], rows=rows[table], state=state[table])
        return out

    def drain(self, timeout_s: float) -> bool:
        """Stop fetching; push, flush and commit everything trained. False if not done in ``timeout_s``.

        Batches prefetched but not trained are dropped uncommitted: the source
        delivers them again after a restart.
        """
        self._prefetcher.stop(wait=False)  # its last poll or pull overlaps the push and flush below
        try:
            drained = self._writer.drain(timeout_s)
            if self._owners is not None:  # every rank drains here together: agree on what is durable
                here = self._settled if drained else self._durable_here(self._settled + 1)
                self._writer.open_gate(self._owners.group.agree_min(here))
            return drained
        finally:
            self._prefetcher.stop()

    def abort(self) -> None:
        """Stop fetching after a failure; nothing more is pushed or committed."""
        self._prefetcher.stop()

    def _next(self, wait_s: float) -> Prepared | None:
        started = time.perf_counter()
        got = self._prefetcher.next(wait_s)
        if got is END:
            self._exhausted = True
            return None
        if got is None:
            return None
        assert isinstance(got, Prepared)
        self.metrics.stage_seconds.labels(stage="fetch").observe(time.perf_counter() - started)
        return got


def _log_only_sink() -> DeadLetterSink:
    """Where samples a model raised on go when the daemon names no sink: counted and logged only."""
    return LogDeadLetter(ConsumerMetrics(CollectorRegistry()))


def _joined(a: Mapping[str, SparseUpdate], b: Mapping[str, SparseUpdate]) -> dict[str, SparseUpdate]:
    """Two updates of disjoint rows as one, per table."""
    out = dict(a)
    for table, update in b.items():
        if table in out:
            mine = out[table]
            out[table] = SparseUpdate(
                ids=np.concatenate([mine.ids, update.ids]),
                rows=np.concatenate([mine.rows, update.rows]),
                state=np.concatenate([mine.state, update.state]),
            )
        else:
            out[table] = update
    return out
