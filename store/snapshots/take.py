"""Taking a snapshot's rows: every live row of some tables, in shards, written while the store is in use.

One worker thread per scan part (:meth:`~kelp.store.base.EmbeddingStore.row_scan_parts`:
a Redis shard or cluster primary), each with the backend's own connection for
that part, so a store of several shards is read at the speed of all of them.
A worker gathers the blocks ``scan_rows`` yields until it holds ``shard_rows``
rows, encodes them (:func:`~kelp.store.snapshots.format.encode_shard`) and puts
the shard in storage at once, so memory holds at most about one shard per
worker, never a copy of the store.

The scan runs while trainers write. A row updated during the scan is taken as
it was when its key was read, so the rows of one snapshot are not of one
instant; what they are consistent with (the offsets read before the scan) is
the caller's to record (:mod:`kelp.daemon.row_snapshots`).

Nothing but the result list is shared between workers. The first exception
stops the others (each checks between blocks) and is raised, so the caller
never writes the manifest of a snapshot with a missing shard.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kelp.store.base import EmbeddingStore
from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.catalog import shard_name
from kelp.store.snapshots.format import encode_shard
from kelp.store.snapshots.manifest import ShardEntry
from kelp.store.snapshots.storage import SnapshotStorage

__all__ = ["take_rows", "unique_last"]

DEFAULT_SHARD_ROWS = 262_144


class _StoppedError(Exception):
    """Another worker failed: this one stops without writing more."""


def unique_last(rows: StoredRows) -> StoredRows:
    """``rows`` with each id once, its last occurrence kept (a Redis SCAN may yield a row twice
    when the keyspace rehashes; the later read is the newer)."""
    if len(rows) < 2:
        return rows
    _, first_of_reversed = np.unique(rows.ids[::-1], return_index=True)
    if len(first_of_reversed) == len(rows):
        return rows
    keep = np.sort(len(rows) - 1 - first_of_reversed)
    return rows.part(keep)


class _PartWriter:
    """One part's worker: scans each table, writes a shard whenever ``shard_rows`` rows are gathered."""

    def __init__(
        self,
        store: EmbeddingStore,
        storage: SnapshotStorage,
        *,
        deployment: str,
        snapshot_id: str,
        part: int,
        shard_rows: int,
        updated_since_s: int | None,
        stop: threading.Event,
        rows_per_s: float | None = None,
    ) -> None:
        self.store, self.storage = store, storage
        self.deployment, self.snapshot_id, self.part = deployment, snapshot_id, part
        self.shard_rows, self.updated_since_s, self.stop = shard_rows, updated_since_s, stop
        self.rows_per_s = rows_per_s
        self.entries: list[ShardEntry] = []
        self._started = time.monotonic()
        self._read = 0

    def _pace(self, rows: int) -> None:
        """Hold the part's reading to ``rows_per_s``: the scan shares Redis and the cores with
        training, and a slower snapshot that takes less of them at a time is often the better trade."""
        self._read += rows
        if self.rows_per_s is None:
            return
        ahead = self._read / self.rows_per_s - (time.monotonic() - self._started)
        if ahead > 0 and self.stop.wait(ahead):
            raise _StoppedError

    def run(self, tables: list[str]) -> list[ShardEntry]:
        self._started = time.monotonic()  # a part waiting for a worker thread starts its pace then
        try:
            for table in tables:
                self._table(table)
        except _StoppedError:
            return []
        except BaseException:
            self.stop.set()
            raise
        return self.entries

    def _table(self, table: str) -> None:
        held: list[StoredRows] = []
        count = 0
        seq = 0
        for block in self.store.scan_rows(table, self.part, updated_since_s=self.updated_since_s):
            if self.stop.is_set():
                raise _StoppedError
            self._pace(len(block))
            if not len(block):
                continue
            held.append(block)
            count += len(block)
            while count >= self.shard_rows:
                rows = StoredRows.concat(held)
                self._write(table, seq, rows.part(slice(0, self.shard_rows)))
                seq += 1
                rest = rows.part(slice(self.shard_rows, None))
                held, count = ([rest] if len(rest) else []), len(rest)
        if count:
            self._write(table, seq, StoredRows.concat(held))

    def _write(self, table: str, seq: int, rows: StoredRows) -> None:
        if self.stop.is_set():
            raise _StoppedError
        rows = unique_last(rows)
        data = encode_shard(table, rows)
        name = shard_name(self.deployment, self.snapshot_id, table, self.part, seq)
        self.storage.put(name, data)
        self.entries.append(
            ShardEntry(
                table=table,
                name=name,
                rows=len(rows),
                bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )


def take_rows(
    store: EmbeddingStore,
    storage: SnapshotStorage,
    deployment: str,
    *,
    snapshot_id: str,
    tables: Mapping[str, Any],
    updated_since_s: int | None,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    parallel: int | None = None,
    max_rows_per_s: float | None = None,
) -> list[ShardEntry]:
    """Write every live row of ``tables`` (name -> TableSpec or ``{"dim", "dtype"}``) as shards.

    ``updated_since_s``: only rows updated at or after it (an incremental
    snapshot); None: every row. ``parallel``: at most this many parts are read
    at once (default: all of them). Returns the shards written, ordered by
    table, part and sequence. ``max_rows_per_s``: rows read per second at most, all parts together
    (None: as fast as Redis answers); raises the first worker's error (shards written
    before it stay in storage, with no manifest naming them).
    """
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    for name in tables:
        store.table(name)  # an unknown table is one clear line, before any thread starts
    if max_rows_per_s is not None and max_rows_per_s <= 0:
        raise ValueError(f"max_rows_per_s must be > 0, got {max_rows_per_s}")
    parts = store.row_scan_parts()
    workers = max(1, min(parts, parallel or parts))
    per_part = None if max_rows_per_s is None else max_rows_per_s / workers
    stop = threading.Event()
    writers = [
        _PartWriter(
            store,
            storage,
            deployment=deployment,
            snapshot_id=snapshot_id,
            part=part,
            shard_rows=shard_rows,
            updated_since_s=updated_since_s,
            stop=stop,
            rows_per_s=per_part,
        )
        for part in range(parts)
    ]
    names = list(tables)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kelp-snapshot") as pool:
        futures = [pool.submit(w.run, names) for w in writers]
        errors = []
        for future in futures:
            try:
                future.result()
            except BaseException as exc:  # the first one is raised once every worker has stopped
                errors.append(exc)
    if errors:
        raise errors[0]
    entries = [e for w in writers for e in w.entries]  # per part: table by table, in sequence
    order = {name: i for i, name in enumerate(names)}
    return sorted(entries, key=lambda e: order[e.table])  # stable: parts and sequences keep their order
