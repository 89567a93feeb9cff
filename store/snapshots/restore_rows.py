"""Restoring a snapshot's rows: check every shard, then write the rows back exactly as they were taken.

Order of work, so a bad snapshot never half-replaces a good store:

1. every shard of the chain (the full snapshot, then each incremental) is read
   and checked (size and SHA-256, by :func:`~kelp.store.snapshots.catalog.read_shard`)
   and every table it names must be one the store has, with the same ``dim``;
2. without ``replace``, a store that already holds rows of these tables is refused
   (one block of a scan is enough to tell);
3. with ``replace``, each of these tables' rows are dropped;
4. the rows are written with :meth:`~kelp.store.base.EmbeddingStore.load_rows`,
   the full snapshot first, then each incremental in order, so a row changed
   after the full snapshot ends as the newest snapshot has it.

Shards checked in step 1 are kept in memory when the whole chain is at most
``keep_bytes`` (256 MiB by default): then each is read once. A larger chain is
checked shard by shard and read again for step 4 (each read checks its
checksum again), so memory holds one shard at a time whatever the snapshot's
size. A snapshot whose table was float16 and is float32 now (or the reverse)
is cast to the store's dtype.

Incrementals carry no deletions: a row evicted after the full snapshot comes
back with its old ``updated_s``, and TTL eviction treats it as it would have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from kelp.store.base import EmbeddingStore
from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.catalog import read_shard
from kelp.store.snapshots.errors import SnapshotError
from kelp.store.snapshots.manifest import ShardEntry, SnapshotManifest
from kelp.store.snapshots.storage import SnapshotStorage

__all__ = ["restore_rows", "stored_tables"]

KEEP_BYTES = 256 << 20


def stored_tables(store: EmbeddingStore, tables: Sequence[str]) -> list[str]:
    """Those of ``tables`` of which the store holds at least one row (one scan block per part)."""
    found = []
    for table in tables:
        for part in range(store.row_scan_parts()):
            if any(len(block) for block in _first(store, table, part)):
                found.append(table)
                break
    return found


def _first(store: EmbeddingStore, table: str, part: int) -> list[StoredRows]:
    """The first non-empty block of a part's scan, if any (the scan stops there)."""
    for block in store.scan_rows(table, part, batch=256):
        if len(block):
            return [block]
    return []


def _check_tables(store: EmbeddingStore, chain: Sequence[SnapshotManifest]) -> list[str]:
    """The chain's tables, each configured in the store with the snapshot's ``dim``."""
    names: list[str] = []
    for manifest in chain:
        for name, spec in manifest.tables.items():
            if name not in store.tables:
                raise SnapshotError(
                    f"snapshot {manifest.snapshot_id} holds table {name!r}, which this config does not have "
                    f"(configured: {', '.join(store.tables) or 'none'})"
                )
            dim = store.tables[name].dim
            if int(spec["dim"]) != dim:
                raise SnapshotError(
                    f"snapshot {manifest.snapshot_id}: table {name!r} has dim {spec['dim']}, "
                    f"the config says {dim}"
                )
            if name not in names:
                names.append(name)
    return names


def _verify(
    storage: SnapshotStorage, chain: Sequence[SnapshotManifest], keep_bytes: int
) -> dict[str, StoredRows]:
    """Read and check every shard; returns them by name when the chain is small enough to keep."""
    total = sum(entry.bytes for manifest in chain for entry in manifest.shards)
    keep = total <= keep_bytes
    kept: dict[str, StoredRows] = {}
    for manifest in chain:
        for entry in manifest.shards:
            rows = read_shard(storage, entry)
            if len(rows) != entry.rows:
                raise SnapshotError(f"{entry.name}: holds {len(rows)} rows, the manifest says {entry.rows}")
            if keep:
                kept[entry.name] = rows
    return kept


def _as_stored(store: EmbeddingStore, entry: ShardEntry, rows: StoredRows) -> StoredRows:
    """``rows`` in the store table's dtype."""
    dtype = np.dtype(store.tables[entry.table].spec.dtype)
    if rows.rows.dtype == dtype:
        return rows
    return dataclasses.replace(rows, rows=rows.rows.astype(dtype))


def restore_rows(
    store: EmbeddingStore,
    storage: SnapshotStorage,
    chain: list[SnapshotManifest],
    *,
    replace: bool,
    keep_bytes: int = KEEP_BYTES,
    before_write: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Write the rows of ``chain`` (full snapshot first) into ``store``; returns rows written per table.

    Raises :class:`~kelp.store.snapshots.errors.SnapshotError` before writing
    anything when a shard fails its check or a table does not fit the store,
    and, without ``replace``, when the store already holds rows of these tables.
    ``before_write`` runs once every check has passed, just before the first
    row is dropped or written (the caller marks the restore as running there).
    """
    if not chain:
        raise SnapshotError("no snapshot to restore")
    tables = _check_tables(store, chain)
    kept = _verify(storage, chain, keep_bytes)
    if not replace:
        present = stored_tables(store, tables)
        if present:
            raise SnapshotError(
                f"the store already holds rows of {', '.join(present)}: restore into an empty store, "
                "or pass --replace to drop them first"
            )
    if before_write is not None:
        before_write()
    if replace:
        for table in tables:
            store.drop_rows(table)
    written = dict.fromkeys(tables, 0)
    for manifest in chain:
        for entry in manifest.shards:
            rows = kept.pop(entry.name, None)
            if rows is None:
                rows = read_shard(storage, entry)
            written[entry.table] += store.load_rows(entry.table, _as_stored(store, entry, rows))
    return written
