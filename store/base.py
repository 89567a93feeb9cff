"""The embedding-store interface every backend implements, and its result types.

A store holds, per table, rows of ``dim`` floats plus one float of row-wise
Adagrad state, keyed by uint64 id. The API is batch-only (no per-id network
call anywhere) and the multi-table forms :meth:`EmbeddingStore.pull_many` /
:meth:`EmbeddingStore.push_many` are primary: a trainer step touches every table
(26 in criteo-synth) and a backend sends them in one round trip per shard.

Admission (:mod:`kelp.store.policy.admission`): with :class:`~kelp.store.policy.admission.AlwaysAdmit`
(the default) every id is admitted; a missing row reads as its init row and the
first push stores it. With a counting or chance policy, ``pull(count=True)``
records a sighting and admits an id (stores its init row) once it qualifies;
pushes for ids without a stored row are discarded. The serving path uses
``count=False``, which never writes.

Capabilities are explicit: ``enforces`` lists the eviction policies
(:mod:`kelp.store.policy.eviction`) a backend enforces, checked at load by
:func:`~kelp.store.factory.check_store_config`; :meth:`EmbeddingStore.flush`
tells whether everything acknowledged is durable (the rule the trainer commits
Kafka offsets by).

Concurrency: whole rows, last writer wins; see docs/store.md.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kelp.closing import Closeable
from kelp.config import TableSpec
from kelp.errors import UserError
from kelp.store.policy.admission import Draws, build_admission
from kelp.store.policy.eviction import EvictionPolicy, LfuCapacity, TtlEviction, build_evictions
from kelp.store.policy.initial_rows import init_rows
from kelp.store.rows.codec import RowCodec, finite_rows
from kelp.store.rows.stored import StoredRows

__all__ = ["EmbeddingStore", "PullResult", "ReadRows", "StoreStats", "Table", "UnknownTableError"]


class UnknownTableError(UserError, KeyError):
    """A table name that the store was not configured with."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class PullResult:
    """What :meth:`EmbeddingStore.pull` returns for ``n`` unique ids, in the order given.

    * ``rows``: float32[n, dim]. Stored rows; for ids without a stored row, the
      init row if the id is admitted (or ``default_row='init'``), else zeros.
    * ``state``: float32[n], the row-wise Adagrad accumulator (``initial_state``
      where nothing is stored).
    * ``admitted``: bool[n]. True where the id has (or, admission off, may get) a
      stored row, i.e. where a push will be kept.
    * ``updated_s``: uint32[n] or None. The stored row's last-update time (unix
      seconds, the row codec's field); 0 where nothing is stored. Serving reads it
      to report embedding freshness; None only from a backend that cannot tell.
    * ``admitted_now``: bool[n] or None. True where this very pull admitted the id
      (its row is the init row, just stored), so a trainer may start it from
      something better (its fallback bucket's row); None from a backend that cannot tell.
    """

    rows: np.ndarray
    state: np.ndarray
    admitted: np.ndarray
    updated_s: np.ndarray | None = None
    admitted_now: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class ReadRows:
    """What :meth:`EmbeddingStore.read_many` returns: a read-only pull of several tables, side by side.

    * ``rows``: per table float32[n, dim], in the order of the ids given (the
      stored row, else the table's default row);
    * ``tables``: the table names in the order of the flat arrays below (a
      backend's reading order, not necessarily the order asked), and
      ``bounds``: table ``tables[i]`` is positions ``bounds[i]:bounds[i + 1]`` of them;
    * ``admitted``: bool[N], all tables' ids concatenated; True where a valid row is stored;
    * ``updated_s``: uint32[N] or None, the stored rows' last update (unix s, 0 where none).

    Serving reads ~1,300 rows from 26 tables per request and wants counts and
    ages over all of them: flat arrays spare it a split per table in the store
    and a concatenation again in the caller.
    """

    rows: dict[str, np.ndarray]
    tables: tuple[str, ...]
    bounds: tuple[int, ...]
    admitted: np.ndarray
    updated_s: np.ndarray | None

    def span(self, table: str) -> slice:
        """Where ``table``'s ids sit in ``admitted`` and ``updated_s``."""
        i = self.tables.index(table)
        return slice(self.bounds[i], self.bounds[i + 1])

    @classmethod
    def of(cls, pulled: Mapping[str, PullResult]) -> ReadRows:
        """The flat form of :meth:`EmbeddingStore.pull_many`'s per-table results."""
        tables = tuple(pulled)
        bounds = (0, *np.cumsum([len(p) for p in pulled.values()]).tolist())
        results = list(pulled.values())
        admitted = np.concatenate([p.admitted for p in results]) if results else np.zeros(0, bool)
        stamps = [p.updated_s for p in results]
        updated = (
            np.concatenate(stamps).astype(np.uint32, copy=False)
            if results and all(s is not None for s in stamps)
            else None
        )
        return cls({t: p.rows for t, p in pulled.items()}, tables, bounds, admitted, updated)


@dataclass
class StoreStats:
    """A cheap snapshot for ``kelp store stats`` and health pages."""

    backend: str
    rows: dict[str, int | None] = field(default_factory=dict)  # per table; None where counting is not cheap
    bytes: int | None = None  # memory used by the store (arenas, or Redis used_memory summed over shards)
    counters: dict[str, float] = field(default_factory=dict)
    shards: list[dict[str, Any]] = field(default_factory=list)
    admission_counters: dict[str, int] = field(default_factory=dict)
    """Live sighting counters per table (ids waiting for admission) where cheap to count."""


class Table:
    """A table's spec plus what every backend derives from it: codec, policies, default rows.

    * ``admission``: its :class:`~kelp.store.policy.admission.AdmissionPolicy`;
    * ``evictions``: its eviction policies; ``ttl`` / ``capacity`` the TTL and LFU
      ones, or None when the table asks for none.
    """

    def __init__(self, spec: TableSpec, initial_state: float = 0.0, draws: Draws | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.dim = spec.dim
        self.codec = RowCodec(spec.dim, spec.dtype)
        self.admission = build_admission(spec.admission, draws or Draws())
        self.initial_state = np.float32(initial_state)
        self.evictions = build_evictions(spec.eviction)
        self.ttl = next((p for p in self.evictions if isinstance(p, TtlEviction)), None)
        self.capacity = next((p for p in self.evictions if isinstance(p, LfuCapacity)), None)

    def init_rows(self, ids: np.ndarray) -> np.ndarray:
        return init_rows(self.spec.init, self.name, ids, self.dim)

    def default_rows(self, ids: np.ndarray) -> np.ndarray:
        """What a not-admitted id reads."""
        if self.spec.default_row == "init":
            return self.init_rows(ids)
        return np.zeros((len(ids), self.dim), dtype=np.float32)

    def check_ids(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"table {self.name}: ids must be 1-d, got shape {ids.shape}")
        if ids.dtype != np.uint64:
            if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0):
                raise ValueError(f"table {self.name}: ids must be non-negative integers (uint64)")
            ids = ids.astype(np.uint64)
        return ids

    def check_stored(self, block: StoredRows) -> StoredRows:
        """``block`` checked for :meth:`EmbeddingStore.load_rows`, its columns in the dtypes a store keeps.

        Refuses (ValueError naming the table and the field) rows of another width and
        non-finite embeddings or state: a store never holds a row it could not train through.
        """
        ids = self.check_ids(block.ids)
        rows = np.asarray(block.rows)
        if rows.ndim != 2 or rows.shape != (len(ids), self.dim):
            want = f"[{len(ids)}, {self.dim}]"
            raise ValueError(f"table {self.name}: StoredRows.rows must be {want}, got {rows.shape}")
        rows = rows.astype(self.spec.dtype, copy=False)
        state = np.asarray(block.state, dtype=np.float32)
        bad = len(ids) - int(finite_rows(rows, state).sum())
        if bad:
            raise ValueError(
                f"table {self.name}: {bad} of {len(ids)} rows hold a NaN or an infinity "
                "(StoredRows.rows or .state); nothing was written"
            )
        return StoredRows(
            ids=ids,
            rows=rows,
            state=state,
            access_count=self._uint32(block.access_count, "access_count"),
            updated_s=self._uint32(block.updated_s, "updated_s"),
        )

    def _uint32(self, values: np.ndarray, field: str) -> np.ndarray:
        arr = np.asarray(values)
        if arr.dtype != np.uint32:
            integral = np.issubdtype(arr.dtype, np.integer)
            if arr.size and (not integral or arr.min() < 0 or arr.max() > 2**32 - 1):
                raise ValueError(f"table {self.name}: StoredRows.{field} must fit uint32, got {arr.dtype}")
            arr = arr.astype(np.uint32)
        return arr

    def check_push(
        self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids = self.check_ids(ids)
        rows = np.asarray(rows, dtype=np.float32)
        state = np.asarray(state, dtype=np.float32)
        if rows.shape != (len(ids), self.dim):
            raise ValueError(f"table {self.name}: rows must be [{len(ids)}, {self.dim}], got {rows.shape}")
        if state.shape != (len(ids),):
            raise ValueError(f"table {self.name}: state must be [{len(ids)}], got {state.shape}")
        return ids, rows, state


class EmbeddingStore(Closeable, abc.ABC):
    """Batch-first embedding store. Subclasses implement the ``*_many`` forms.

    Inputs are *unique* ids per table (the consumer deduplicates); results keep
    the order of the ids given. Every method either takes effect and returns, or
    raises a :class:`~kelp.errors.StoreError` (``retriable`` when trying again can
    help): ``push`` never returns before the store acknowledged every row.
    """

    backend: str = "abstract"
    enforces: ClassVar[frozenset[type[EvictionPolicy]]] = frozenset()
    """Eviction policies this backend enforces; a table asking for another is refused at load."""
    eviction_hints: ClassVar[dict[type[EvictionPolicy], str]] = {}
    """What to use instead of a policy the backend does not enforce (one line for the config error)."""

    def __init__(self, tables: list[TableSpec], initial_state: float = 0.0, seed: int | None = None) -> None:
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate table names: {names}")
        draws = Draws(seed)  # one generator for every table's chance admission
        self.tables: dict[str, Table] = {t.name: Table(t, initial_state, draws) for t in tables}

    def table(self, name: str) -> Table:
        try:
            return self.tables[name]
        except KeyError:
            raise UnknownTableError(f"unknown table {name!r}; configured: {', '.join(self.tables)}") from None

    # -- the verbs -----------------------------------------------------------------------------

    def pull(
        self, table: str, ids: np.ndarray, *, count: bool = True, occurrences: np.ndarray | None = None
    ) -> PullResult:
        """Rows for uint64[n] unique ``ids``: a :class:`PullResult` of length n.

        ``count=True`` (trainer reads) records sightings for admission and may
        admit ids; ``count=False`` (serving) only reads. ``occurrences``
        int64[n]: how often each id occurs in the trained samples; a table whose
        admission counts occurrences adds these (default: 1 each).
        """
        occ = None if occurrences is None else {table: occurrences}
        return self.pull_many({table: ids}, count=count, occurrences=occ)[table]

    @abc.abstractmethod
    def pull_many(
        self,
        ids_by_table: Mapping[str, np.ndarray],
        *,
        count: bool = True,
        occurrences: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, PullResult]:
        """:meth:`pull` for several tables at once, one round trip per shard where the backend can."""

    def read_many(self, ids_by_table: Mapping[str, np.ndarray]) -> ReadRows:
        """``pull_many(ids_by_table, count=False)`` in the flat form serving uses (:class:`ReadRows`).

        Never writes, counts or admits. A backend may answer it without building
        per-table results; what it returns must equal this default's.
        """
        return ReadRows.of(self.pull_many(ids_by_table, count=False))

    def push(self, table: str, ids: np.ndarray, rows: np.ndarray, state: np.ndarray) -> int:
        """Store float32[n, dim] ``rows`` and float32[n] ``state`` for uint64[n] unique ``ids``.

        Rows of ids that are not admitted (admission on and no stored row, e.g.
        evicted) are discarded and counted. Returns once acknowledged, with the
        push's ticket (see :meth:`durable_through`).
        """
        return self.push_many({table: (ids, rows, state)})

    @abc.abstractmethod
    def push_many(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> int:
        """:meth:`push` for several tables: ``{table: (ids, rows, state)}``; returns the push's ticket."""

    composes_updates: ClassVar[bool] = False
    """Whether :meth:`apply_adagrad_many` is supported (the update is applied inside the store)."""

    def apply_adagrad_many(
        self,
        updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        lr: float,
        eps: float,
    ) -> int:
        """Apply row-wise Adagrad inside the store: ``{table: (ids, rows, state, grads)}``; returns a ticket.

        Where a row is stored, ``grads`` float32[n, dim] update *that* row and
        its accumulator (``acc += mean(g^2); row -= lr * g / (sqrt(acc) + eps)``),
        so concurrent writers' updates compose. Where none is stored, ``rows`` and
        ``state`` (the trainer's own result) are written as :meth:`push_many` would.
        """
        raise NotImplementedError(f"store backend {self.backend!r} cannot apply updates in place")

    def refresh(self, updates: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Rows another writer has just written (``{table: (ids, rows, state)}``): a store that keeps
        copies of rows (the hot tier) takes these where it holds one. A trainer group's rank calls it
        with the rows their owners stepped and sent back. Stores without copies have nothing to do."""
        return None

    @abc.abstractmethod
    def delete(self, table: str, ids: np.ndarray) -> int:
        """Remove stored rows (and admission counters); returns how many rows existed."""

    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """Rows per table where cheap, bytes used, and counters."""

    def flush(self, force: bool = True) -> bool:
        """True when every row acknowledged by ``push``/``push_many`` so far is durable in the backing store.

        ``force=True`` writes whatever is buffered now (then True, or it raises);
        ``force=False`` writes only when the store's own schedule says it is due,
        and reports. Write-through backends (memory, Redis) buffer nothing: always
        True, no work. The hot-row cache writes back on its schedule. The trainer
        commits a batch's offsets only once this returns True after its push.
        """
        return True

    @abc.abstractmethod
    def durable_through(self, force: bool = False) -> int:
        """Every push whose ticket is at most this number is durable in the backing store.

        Tickets are what :meth:`push_many` and :meth:`apply_adagrad_many` return:
        1, 2, 3... in the order the pushes were acknowledged. Durability is one
        value, so the trainer commits a batch's offsets once its push's ticket is
        covered, whether the store writes through (every acknowledged push at
        once) or writes back on its own schedule (the hot tier, where some rows
        are always dirty and "is everything durable?" would rarely be true).
        Asking writes back what is due first (``force``: everything buffered).
        """

    # -- listing and loading rows exactly (snapshots, restore, import) ---------------------------

    def row_scan_parts(self) -> int:
        """How many independent parts a full :meth:`scan_rows` splits into (Redis shards or cluster
        primaries; 1 in memory), so a snapshot reads them in parallel, each on its own connection."""
        raise self._cannot_list_rows()

    def scan_rows(
        self, table: str, part: int, *, batch: int = 4096, updated_since_s: int | None = None
    ) -> Iterator[StoredRows]:
        """Every live row of ``table`` held by ``part`` (0 <= part < :meth:`row_scan_parts`), in blocks
        of about ``batch`` rows: a snapshot never holds the whole table in memory.

        Left out, as a read would leave them out: rows past their TTL, and stored values
        that are no valid row (counted in a WARNING line; a snapshot must not carry one).
        ``updated_since_s``: only rows with ``updated_s >= updated_since_s`` (incremental
        snapshots). Safe while other clients write; a row present for the whole scan is
        yielded at least once, maybe twice (Redis ``SCAN`` while the keyspace rehashes).
        Arguments are checked when called, before the first block.
        """
        raise self._cannot_list_rows()

    def load_rows(self, table: str, rows: StoredRows) -> int:
        """Write each row exactly as given (embedding, state, access count, last update), replacing
        what is stored, without admission; returns the rows written.

        Rows already past the table's TTL at their ``updated_s`` are not written (a read would
        hide them at once). Batched per shard. Refuses a malformed block before writing anything.
        """
        raise self._cannot_list_rows()

    def drop_rows(self, table: str) -> int:
        """Delete every row and admission counter of ``table`` (this deployment only); returns the
        rows deleted."""
        raise self._cannot_list_rows()

    def _check_scan(self, table: str, part: int, batch: int, updated_since_s: int | None) -> Table:
        """The table of a :meth:`scan_rows` call, once its arguments are checked (ValueError naming one)."""
        t = self.table(table)
        parts = self.row_scan_parts()
        if not 0 <= part < parts:
            raise ValueError(f"scan_rows: part must be in [0, {parts}) for this store, got {part}")
        if batch < 1:
            raise ValueError(f"scan_rows: batch must be >= 1, got {batch}")
        if updated_since_s is not None and updated_since_s < 0:
            raise ValueError(f"scan_rows: updated_since_s must be >= 0 (unix seconds), got {updated_since_s}")
        return t

    def _cannot_list_rows(self) -> UserError:
        return UserError(
            f"store {self.backend!r} cannot list or load rows exactly; row snapshots, restore and import "
            "run on the backing store itself (build_store without the hot tier, or the store it wraps)"
        )

    def close(self) -> None:
        """Release connections and buffers (``with store:`` calls it)."""
