"""The pull/push flow shared by the backends that own rows (memory, Redis), on four primitives.

Admission, default rows, the result layout and the row metrics are decided
here, once. A backend only implements how to touch its rows, and each
primitive takes every table of the call at once, so a Redis backend still
makes one pipelined round trip per shard for each step (its ``op`` label of
``kelp_store_round_trips_total`` in brackets)::

    pull_many(ids_by_table, count)
      1. _read_rows({table: ids}, now, touch=count)   -> {table: StoredRows}      [pull]
         stored values that are not valid finite rows are quarantined here
         (kelp.store.quarantine): count=True reads them as fresh init rows,
         admitted (the next push overwrites them), count=False as the default row
         only with count=True, for ids without a stored row:
      2. _count_sightings({table: (ids, ttl_s)}, now) -> {table: int64 counts}    [admit]
         (tables whose AdmissionPolicy counts sightings)
      3. _store_init_rows({table: InitRows}, now)     store where absent, drop     [admit]
         (tables whose policy stores admitted ids)     their counters
    push_many(updates)
         pushed rows holding a NaN or an infinity are dropped (counted, logged)
      4. _write_rows({table: RowWrite}, now)          -> {table: rows kept}        [push]

Steps 2 and 3 are skipped when no table needs them. Which ids they cover is
each table's :class:`~kelp.store.policy.admission.AdmissionPolicy`'s decision.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import TableSpec
from kelp.store.base import EmbeddingStore, PullResult, ReadRows, Table
from kelp.store.metrics import StoreMetrics
from kelp.store.quarantine import Quarantine
from kelp.store.rows.codec import FAULT_REASONS, NONFINITE, finite_rows

__all__ = ["FlowStore", "InitRows", "RowWrite", "StoredBlock", "StoredRows"]


@dataclass
class StoredRows:
    """What :meth:`FlowStore._read_rows` found for ``n`` ids of one table, in the order given.

    * ``present``: bool[n], a row is stored;
    * ``rows``: float32[n, dim] and ``state``: float32[n], any value where not
      present (the flow overwrites those);
    * ``updated_s``: uint32[n], the row's last update (unix s), 0 where not present;
    * ``handle``: the backend's own note about this read (the memory backend:
      the slots read), handed back to :meth:`FlowStore._store_init_rows`;
    * ``fault``: uint8[n], why a present value is no valid row of the table
      (:data:`~kelp.store.rows.codec.FAULT_REASONS`; 0: valid), from a backend that
      decodes stored bytes; None from one that holds rows as floats (memory),
      whose rows the flow checks for NaN and infinity itself.
    """

    present: np.ndarray
    rows: np.ndarray
    state: np.ndarray
    updated_s: np.ndarray
    handle: Any = None
    fault: np.ndarray | None = None

    def part(self, start: int, end: int) -> StoredRows:
        """Positions ``start:end`` (views: what the flow writes into them lands in this read)."""
        fault = None if self.fault is None else self.fault[start:end]
        return StoredRows(
            self.present[start:end],
            self.rows[start:end],
            self.state[start:end],
            self.updated_s[start:end],
            fault=fault,
        )


@dataclass
class StoredBlock:
    """Several tables' stored rows side by side, one row width: what :meth:`FlowStore._read_blocks` found.

    Table ``names[i]`` is positions ``bounds[i]:bounds[i + 1]`` of ``ids`` and of ``stored``.
    """

    names: list[str]
    bounds: list[int]
    ids: np.ndarray
    stored: StoredRows

    def counts(self, mask: np.ndarray) -> list[int]:
        """How many positions of each table ``mask`` holds (one cumulative sum, no call per table)."""
        running = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        return (running[self.bounds[1:]] - running[self.bounds[:-1]]).tolist()


@dataclass
class InitRows:
    """Newly admitted ids of one table: store ``rows``/``state`` where no row is stored yet.

    ``drop_counters``: also delete their sighting counters; ``read``: this call's :class:`StoredRows`.
    """

    ids: np.ndarray
    rows: np.ndarray
    state: np.ndarray
    drop_counters: bool
    read: StoredRows


@dataclass
class RowWrite:
    """A push to one table; ``create=False``: only ids that still have a stored row keep it (``SET XX``).

    ``grads`` (``apply_adagrad_many``): float32[n, dim] gradients to apply to the stored rows instead.
    """

    ids: np.ndarray
    rows: np.ndarray
    state: np.ndarray
    create: bool
    grads: np.ndarray | None = None


class FlowStore(EmbeddingStore):
    """An :class:`EmbeddingStore` whose ``pull_many``/``push_many`` are the flow above, on four primitives.

    ``clock`` gives unix seconds (the time stamped on rows and used for TTLs);
    ``_op_lock`` wraps each whole operation (a real lock in the memory backend,
    nothing for Redis, whose calls may overlap).
    """

    def __init__(
        self,
        tables: list[TableSpec],
        registry: CollectorRegistry | None,
        *,
        initial_state: float,
        seed: int | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(tables, initial_state, seed)
        self.metrics = StoreMetrics(registry)
        self.quarantine = Quarantine(self.metrics)
        self._clock = clock
        self._op_lock: AbstractContextManager[Any] = nullcontext()
        self._tickets = 0  # acknowledged pushes; a write-through store's are durable at once
        self._ticket_lock = threading.Lock()

    def _ready(self) -> None:
        """Hook: a backend's one-time checks before its first pull or push (Redis: the layout marker)."""

    def _where(self, table: str, ids: np.ndarray) -> list[str]:
        """Hook: where each id's row is stored, for a quarantine log line (Redis: its key and shard)."""
        return [""] * len(ids)

    # -- the primitives -------------------------------------------------------------------------

    @abc.abstractmethod
    def _read_rows(
        self, ids_by_table: Mapping[str, np.ndarray], now: float, touch: bool
    ) -> dict[str, StoredRows]:
        """Stored rows of each table's ids; ``touch`` (a training read) may update access bookkeeping."""

    def _read_blocks(self, ids_by_table: Mapping[str, np.ndarray], now: float) -> list[StoredBlock]:
        """Hook: :meth:`_read_rows` (``touch=False``) with the tables of one row width side by side.

        This default reads per table and concatenates; a backend that decodes
        several tables' replies in one pass overrides it to skip the split.
        """
        stored = self._read_rows(ids_by_table, now, touch=False)
        by_dim: dict[int, list[str]] = {}
        for name in ids_by_table:
            by_dim.setdefault(self.tables[name].dim, []).append(name)
        blocks = []
        for names in by_dim.values():
            parts = [stored[n] for n in names]
            faults = [p.fault for p in parts]
            joined = StoredRows(
                *(np.concatenate([getattr(p, f) for p in parts]) for f in ("present", "rows", "state")),
                np.concatenate([p.updated_s for p in parts]),
                fault=None if any(f is None for f in faults) else np.concatenate(faults),  # type: ignore[arg-type]
            )
            bounds = [0, *np.cumsum([len(p.present) for p in parts]).tolist()]
            ids = np.concatenate([ids_by_table[n] for n in names])
            blocks.append(StoredBlock(names, bounds, ids, joined))
        return blocks

    @abc.abstractmethod
    def _count_sightings(
        self, requests: Mapping[str, tuple[np.ndarray, np.ndarray, float]], now: float
    ) -> dict[str, np.ndarray]:
        """Add sightings (``{table: (ids, int64 increments, counter_ttl_s)}``); the counts after them."""

    def _increments(
        self, name: str, missing: np.ndarray, occurrences: Mapping[str, np.ndarray]
    ) -> np.ndarray:
        """Sightings this pull adds at the ``missing`` positions: occurrences if the policy counts them."""
        occ = occurrences.get(name)
        if occ is None or not self.tables[name].admission.counts_occurrences:
            return np.ones(len(missing), dtype=np.int64)
        return np.maximum(np.asarray(occ, dtype=np.int64)[missing], 1)

    @abc.abstractmethod
    def _store_init_rows(self, admits: Mapping[str, InitRows], now: float) -> None:
        """Store each admitted id's init row where none is stored yet (a concurrent admission wins)."""

    @abc.abstractmethod
    def _write_rows(self, writes: Mapping[str, RowWrite], now: float) -> dict[str, int]:
        """Write pushed rows (stamped ``now``); returns how many rows each table kept."""

    # -- the flow -------------------------------------------------------------------------------

    def pull_many(
        self,
        ids_by_table: Mapping[str, np.ndarray],
        *,
        count: bool = True,
        occurrences: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, PullResult]:
        started = time.perf_counter()
        self._ready()
        batch = {name: self.table(name).check_ids(raw) for name, raw in ids_by_table.items()}
        with self._op_lock:
            now = self._clock()
            stored = self._read_rows(batch, now, touch=count)
            self.metrics.row_ops.inc(sum(len(ids) for ids in batch.values()), "read")
            bad = {
                name: self._quarantined(self.tables[name], batch[name], s, count)
                for name, s in stored.items()
            }
            missing = {name: self._missing(self.tables[name], stored[name]) for name in batch}
            out = {
                name: PullResult(s.rows, s.state, s.present.copy(), s.updated_s, np.zeros_like(s.present))
                for name, s in stored.items()
            }
            if not count:  # serving reads a quarantined row as an id that is not admitted
                for name, b in bad.items():
                    out[name].admitted[b] = False
            admitted = self._admit(batch, stored, missing, now, occurrences or {}) if count else {}
            for name, ids in batch.items():
                t, result, miss = self.tables[name], out[name], missing[name]
                qualify = admitted.get(name, np.zeros(len(miss), dtype=bool))
                rest, new = miss[~qualify], miss[qualify]
                if len(rest):
                    result.rows[rest] = t.default_rows(ids[rest])
                if len(new):
                    result.admitted[new] = True
                    if self.tables[name].admission.stores_on_admit:  # AlwaysAdmit stores on the first push
                        result.admitted_now[new] = True
        self.metrics.op_latency("pull").observe(time.perf_counter() - started)
        return out

    def read_many(self, ids_by_table: Mapping[str, np.ndarray]) -> ReadRows:
        """``pull_many(count=False)``, flat: the same rows, checks and metrics, without a split per table."""
        started = time.perf_counter()
        self._ready()
        batch = {name: self.table(name).check_ids(raw) for name, raw in ids_by_table.items()}
        with self._op_lock:
            blocks = self._read_blocks(batch, self._clock())
        self.metrics.row_ops.inc(sum(len(ids) for ids in batch.values()), "read")
        rows: dict[str, np.ndarray] = {}
        admitted, updated, names, bounds = [], [], [], [0]
        for block in blocks:
            admitted.append(self._settle(block))
            updated.append(block.stored.updated_s)
            for i, name in enumerate(block.names):
                lo, hi = block.bounds[i], block.bounds[i + 1]
                rows[name] = block.stored.rows[lo:hi]
                names.append(name)
                bounds.append(bounds[-1] + hi - lo)
        flat = (lambda parts: parts[0]) if len(blocks) == 1 else np.concatenate
        result = ReadRows(
            rows,
            tuple(names),
            tuple(bounds),
            flat(admitted) if blocks else np.zeros(0, bool),
            flat(updated).astype(np.uint32, copy=False) if blocks else np.zeros(0, np.uint32),
        )
        self.metrics.op_latency("pull").observe(time.perf_counter() - started)
        return result

    def _settle(self, block: StoredBlock) -> np.ndarray:
        """A serving read's rules on one block, as :meth:`pull_many` applies them with ``count=False``:
        invalid values quarantined and not admitted, missing ids on the default row, row metrics
        counted. Returns the block's ``admitted``."""
        stored = block.stored
        admitted = stored.present.copy()
        if self._has_fault(stored):  # rare: the per-table path names each table's bad rows
            for i, name in enumerate(block.names):
                lo, hi = block.bounds[i], block.bounds[i + 1]
                bad = self._quarantined(self.tables[name], block.ids[lo:hi], stored.part(lo, hi), False)
                admitted[lo + bad] = False
        missing = ~stored.present
        per_table = block.counts(missing)
        for i, name in enumerate(block.names):
            lo, hi = block.bounds[i], block.bounds[i + 1]
            self.metrics.pulled_rows.inc(hi - lo, name)
            if per_table[i]:
                t = self.tables[name]
                self.metrics.missed_rows.inc(per_table[i], name)
                where = lo + np.flatnonzero(missing[lo:hi])
                stored.rows[where] = t.default_rows(block.ids[where])
                stored.state[where] = t.initial_state
        return admitted

    @staticmethod
    def _has_fault(stored: StoredRows) -> bool:
        """Whether any present value is no valid finite row (one reduction in the common case)."""
        if stored.fault is None:
            return not bool((finite_rows(stored.rows, stored.state) | ~stored.present).all())
        return bool(stored.fault.any())

    def _quarantined(self, t: Table, ids: np.ndarray, stored: StoredRows, count: bool) -> np.ndarray:
        """Positions whose stored value is no valid finite row (:mod:`kelp.store.quarantine`): counted,
        logged, and replaced in ``stored`` by what the flow reads instead. Training (``count``) gets the
        id's init row and ``initial_state``, as an admitted id would, so its next push overwrites the
        bad value; serving gets the default row. The common all-valid batch costs one ``any``."""
        if stored.fault is None:  # rows this process holds as floats: only NaN and infinity can be wrong
            fine = finite_rows(stored.rows, stored.state) | ~stored.present
            if fine.all():
                return np.zeros(0, dtype=np.int64)
            fault = np.where(fine, 0, NONFINITE).astype(np.uint8)
        else:
            if not stored.fault.any():
                return np.zeros(0, dtype=np.int64)
            fault = stored.fault
        bad = np.flatnonzero(stored.present & (fault != 0))
        if not len(bad):
            return bad
        for code in np.unique(fault[bad]).tolist():
            found = ids[bad[fault[bad] == code]]
            self.quarantine.found(t.name, FAULT_REASONS[code], found, lambda some: self._where(t.name, some))
        stored.rows[bad] = t.init_rows(ids[bad]) if count else t.default_rows(ids[bad])
        stored.state[bad] = t.initial_state
        stored.updated_s[bad] = 0
        return bad

    def _missing(self, t: Table, stored: StoredRows) -> np.ndarray:
        """Positions without a stored row; their state reads ``initial_state``. Counts the row metrics."""
        missing = np.flatnonzero(~stored.present)
        stored.state[missing] = t.initial_state
        self.metrics.pulled_rows.inc(len(stored.present), t.name)
        if len(missing):
            self.metrics.missed_rows.inc(len(missing), t.name)
        return missing

    def _admit(
        self,
        batch: Mapping[str, np.ndarray],
        stored: Mapping[str, StoredRows],
        missing: Mapping[str, np.ndarray],
        now: float,
        occurrences: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """Ask each table's policy which missing ids it admits; store init rows where it says so.

        Returns ``{table: bool[len(missing)]}``; admitted positions already hold their init row.
        """
        counting = {
            name: (batch[name][m], self._increments(name, m, occurrences), ttl)
            for name, m in missing.items()
            if len(m) and (ttl := self.tables[name].admission.counter_ttl_s) is not None
        }
        sightings = self._count_sightings(counting, now) if counting else {}
        if counting:
            self.metrics.row_ops.inc(sum(len(c[0]) for c in counting.values()), "count")
        qualified: dict[str, np.ndarray] = {}
        admits: dict[str, InitRows] = {}
        for name, m in missing.items():
            if not len(m):
                continue
            t = self.tables[name]
            policy = t.admission
            qualify = policy.admit(len(m), sightings.get(name))
            qualified[name] = qualify
            self.metrics.rejections.labels(table=name).inc(int((~qualify).sum()))
            new = m[qualify]
            if not len(new):
                continue
            ids = batch[name][new]
            init = t.init_rows(ids)
            stored[name].rows[new] = init
            if policy.stores_on_admit:
                state = np.full(len(new), t.initial_state, dtype=np.float32)
                admits[name] = InitRows(ids, init, state, policy.counter_ttl_s is not None, stored[name])
        if admits:
            self._store_init_rows(admits, now)
            self.metrics.row_ops.inc(sum(len(a.ids) for a in admits.values()), "write")
            for name, a in admits.items():
                stored[name].updated_s[missing[name][qualified[name]]] = np.uint32(now)
                self.metrics.admissions.labels(table=name).inc(len(a.ids))
        return qualified

    def durable_through(self, force: bool = False) -> int:
        """Write-through: every acknowledged push is durable, so the last ticket handed out."""
        with self._ticket_lock:
            return self._tickets

    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> int:
        writes: dict[str, RowWrite] = {}
        for name, (raw_ids, raw_rows, raw_state) in updates.items():
            t = self.table(name)
            ids, rows, state = t.check_push(raw_ids, raw_rows, raw_state)
            keep = self.quarantine.refuse_nonfinite(name, ids, rows, state)
            if keep is not None:
                ids, rows, state = ids[keep], rows[keep], state[keep]
            writes[name] = RowWrite(ids, rows, state, create=t.admission.push_creates_rows)
        return self._push(writes, lambda now: self._write_rows(writes, now))

    def apply_adagrad_many(
        self,
        updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        lr: float,
        eps: float,
    ) -> int:
        if not self.composes_updates:
            super().apply_adagrad_many(updates, lr, eps)
        writes: dict[str, RowWrite] = {}
        for name, (raw_ids, raw_rows, raw_state, raw_grads) in updates.items():
            t = self.table(name)
            ids, rows, state = t.check_push(raw_ids, raw_rows, raw_state)
            grads = np.ascontiguousarray(raw_grads, dtype=np.float32)
            if grads.shape != rows.shape:
                raise ValueError(f"table {name!r}: grads {grads.shape} do not match rows {rows.shape}")
            keep = self.quarantine.refuse_nonfinite(name, ids, rows, state, grads)
            if keep is not None:
                ids, rows, state, grads = ids[keep], rows[keep], state[keep], grads[keep]
            writes[name] = RowWrite(ids, rows, state, create=t.admission.push_creates_rows, grads=grads)
        return self._push(writes, lambda now: self._apply_adagrad(writes, lr, eps, now))

    def _apply_adagrad(
        self, writes: Mapping[str, RowWrite], lr: float, eps: float, now: float
    ) -> dict[str, int]:
        """Backends with ``composes_updates`` apply ``writes[t].grads`` to stored rows in place."""
        raise NotImplementedError

    def _push(self, writes: Mapping[str, RowWrite], write: Callable[[float], dict[str, int]]) -> int:
        """Run ``write`` and count it; the ticket is handed out once the write is acknowledged."""
        started = time.perf_counter()
        self._ready()
        with self._op_lock:
            kept = write(self._clock())
        self.metrics.row_ops.inc(sum(len(w.ids) for w in writes.values()), "write")
        for name, w in writes.items():
            self.metrics.rows_pushed.labels(table=name).inc(kept[name])
            if kept[name] < len(w.ids):
                self.metrics.push_discarded.labels(table=name).inc(len(w.ids) - kept[name])
        self.metrics.op_latency("push").observe(time.perf_counter() - started)
        with self._ticket_lock:
            self._tickets += 1
            return self._tickets
