"""Where each object of a snapshot lives, and which snapshots are whole.

Layout in a :class:`~kelp.store.snapshots.storage.SnapshotStorage`::

    <deployment>/<snapshot_id>/manifest.json                          written last
    <deployment>/<snapshot_id>/shards/<table>.<part>.<seq>.safetensors
    <deployment>/<snapshot_id>/dense.safetensors                      optional
    <deployment>/<snapshot_id>/checkpoint.safetensors                 optional

A snapshot is whole exactly when its manifest is there and verifies: the
manifest is written after every shard it lists, so a taker killed half-way
leaves shards without a manifest, which :func:`list_snapshots` never returns
and :func:`incomplete_snapshots` names for cleanup. Every read of a shard
checks its size and sha256 against the manifest before decoding it.
"""

from __future__ import annotations

import hashlib
import re

from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.errors import MissingObjectError, SnapshotError
from kelp.store.snapshots.format import decode_shard
from kelp.store.snapshots.manifest import ShardEntry, SnapshotManifest
from kelp.store.snapshots.storage import SnapshotStorage, check_object_name

__all__ = [
    "MANIFEST_LEAF",
    "chain",
    "delete_snapshot",
    "incomplete_snapshots",
    "list_snapshots",
    "object_name",
    "read_manifest",
    "read_shard",
    "shard_name",
    "write_manifest",
]

MANIFEST_LEAF = "manifest.json"
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:=+-]*$")
"""A deployment, snapshot id or table as one path part: no '/', never '.'-led (so never '..')."""


def _part(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _PART.match(value):
        raise SnapshotError(f"invalid {kind} {value!r} for a snapshot path: letters, digits and _.:=+- only")
    return value


def object_name(deployment: str, snapshot_id: str, leaf: str) -> str:
    """``<deployment>/<snapshot_id>/<leaf>``, each part checked so no name leaves its snapshot's folder."""
    return check_object_name(f"{_part('deployment', deployment)}/{_part('snapshot id', snapshot_id)}/{leaf}")


def shard_name(deployment: str, snapshot_id: str, table: str, part: int, seq: int) -> str:
    """``<deployment>/<snapshot_id>/shards/<table>.<part>.<seq>.safetensors``."""
    if part < 0 or seq < 0:
        raise SnapshotError(f"shard part and seq must be >= 0, got {part} and {seq}")
    return object_name(deployment, snapshot_id, f"shards/{_part('table', table)}.{part}.{seq}.safetensors")


def _snapshot_prefix(deployment: str, snapshot_id: str) -> str:
    return f"{_part('deployment', deployment)}/{_part('snapshot id', snapshot_id)}/"


def write_manifest(storage: SnapshotStorage, manifest: SnapshotManifest) -> None:
    """Store the manifest; call it only after every shard and file it names is stored."""
    storage.put(object_name(manifest.deployment, manifest.snapshot_id, MANIFEST_LEAF), manifest.to_bytes())


def read_manifest(storage: SnapshotStorage, deployment: str, snapshot_id: str) -> SnapshotManifest:
    """The verified manifest of one snapshot; one :class:`SnapshotError` line when it is missing or bad."""
    name = object_name(deployment, snapshot_id, MANIFEST_LEAF)
    try:
        data = storage.get(name)
    except MissingObjectError:
        raise MissingObjectError(
            f"snapshot {snapshot_id} of deployment {deployment} has no manifest in {storage.describe()}: "
            "it does not exist or never finished"
        ) from None
    manifest = SnapshotManifest.from_bytes(data, source=name)
    if (manifest.deployment, manifest.snapshot_id) != (deployment, snapshot_id):
        raise SnapshotError(
            f"{name}: the manifest is of snapshot {manifest.snapshot_id} of deployment {manifest.deployment} "
            "(copied from elsewhere?)"
        )
    return manifest


def _snapshot_ids(storage: SnapshotStorage, deployment: str) -> tuple[list[str], set[str]]:
    """Every snapshot id with any object under the deployment, and those among them with a manifest."""
    prefix = f"{_part('deployment', deployment)}/"
    ids: set[str] = set()
    with_manifest: set[str] = set()
    for name in storage.names(prefix):
        snapshot_id, _, leaf = name[len(prefix) :].partition("/")
        if not leaf:
            continue
        ids.add(snapshot_id)
        if leaf == MANIFEST_LEAF:
            with_manifest.add(snapshot_id)
    return sorted(ids), with_manifest


def _scan(storage: SnapshotStorage, deployment: str) -> tuple[list[SnapshotManifest], list[str]]:
    """(whole snapshots oldest first, ids of the others: no manifest, or one that does not verify)."""
    ids, with_manifest = _snapshot_ids(storage, deployment)
    whole: list[SnapshotManifest] = []
    broken: list[str] = []
    for snapshot_id in ids:
        if snapshot_id not in with_manifest:
            broken.append(snapshot_id)
            continue
        try:
            whole.append(read_manifest(storage, deployment, snapshot_id))
        except MissingObjectError:  # deleted between the listing and the read
            continue
        except SnapshotError:
            broken.append(snapshot_id)
    whole.sort(key=lambda m: (m.created_at, m.snapshot_id))
    return whole, broken


def list_snapshots(storage: SnapshotStorage, deployment: str) -> list[SnapshotManifest]:
    """The deployment's whole snapshots, oldest first; reads only manifests (one object per snapshot)."""
    return _scan(storage, deployment)[0]


def incomplete_snapshots(storage: SnapshotStorage, deployment: str) -> list[str]:
    """Ids of snapshots with objects but no manifest that verifies: a taker that died, or damage."""
    return _scan(storage, deployment)[1]


def read_shard(storage: SnapshotStorage, entry: ShardEntry) -> StoredRows:
    """The rows of one shard, after checking its size and sha256 against the manifest's entry."""
    data = storage.get(entry.name)
    if len(data) != entry.bytes:
        raise SnapshotError(
            f"{entry.name}: {len(data)} bytes, the manifest says {entry.bytes} (truncated or replaced)"
        )
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise SnapshotError(f"{entry.name}: sha256 does not match the manifest (damaged or tampered)")
    table, rows = decode_shard(data, source=entry.name)
    if table != entry.table or len(rows) != entry.rows:
        raise SnapshotError(
            f"{entry.name}: holds {len(rows)} rows of table {table!r}, "
            f"the manifest says {entry.rows} of {entry.table!r}"
        )
    return rows


def chain(storage: SnapshotStorage, deployment: str, snapshot_id: str) -> list[SnapshotManifest]:
    """The full snapshot under ``snapshot_id``, then each incremental up to it (oldest first).

    Restoring applies them in this order. A missing parent, a parent of another
    deployment, a cycle, or tables whose dim or dtype change along the way
    make the chain unusable; that is one :class:`SnapshotError` line.
    """
    out = [read_manifest(storage, deployment, snapshot_id)]
    seen = {snapshot_id}
    while out[-1].kind == "incremental":
        child = out[-1]
        parent_id = child.parent or ""
        if parent_id in seen:
            raise SnapshotError(f"snapshot {snapshot_id}: its chain of parents loops at {parent_id}")
        try:
            parent = read_manifest(storage, deployment, parent_id)
        except MissingObjectError:
            raise SnapshotError(
                f"snapshot {child.snapshot_id}: its parent {parent_id} is missing or incomplete in "
                f"{storage.describe()}; the chain is broken, restore an older whole snapshot"
            ) from None
        seen.add(parent_id)
        out.append(parent)
    out.reverse()
    _check_tables(out)
    return out


def _check_tables(manifests: list[SnapshotManifest]) -> None:
    """Every table keeps one dim and dtype along the chain."""
    first: dict[str, dict] = {}
    for manifest in manifests:
        for table, spec in manifest.tables.items():
            known = first.setdefault(table, spec)
            if (known.get("dim"), known.get("dtype")) != (spec.get("dim"), spec.get("dtype")):
                raise SnapshotError(
                    f"snapshot {manifest.snapshot_id}: table {table!r} is {spec}, "
                    f"but {known} earlier in its chain"
                )


def delete_snapshot(storage: SnapshotStorage, deployment: str, snapshot_id: str) -> int:
    """Delete one snapshot's objects, manifest first (so a half-deleted one is never taken for whole)."""
    manifest = object_name(deployment, snapshot_id, MANIFEST_LEAF)
    removed = storage.delete(manifest)
    return removed + storage.delete(_snapshot_prefix(deployment, snapshot_id))
